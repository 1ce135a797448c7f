package placement

import (
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/better-compute/better-compute/core"
)

// gpus makes n free H100 GPU atoms on a node (ids <node>-g<i>), in domain
// when it is set.
func gpus(node string, n int, domain string) []Atom {
	out := make([]Atom, n)
	for i := range out {
		a := map[string]any{"gpuModel": "H100", "gpuProduct": "H100-SXM5-80GB", "memoryGiB": int64(80)}
		if domain != "" {
			a["nvlinkDomain"] = domain
		}
		out[i] = Atom{ID: fmt.Sprintf("%s-g%d", node, i), Class: ClassGPU, Attributes: a}
	}
	return out
}

func node(id string, atoms ...[]Atom) Node {
	return Node{ID: id, Schedulable: true, Trust: "platform", Atoms: slices.Concat(atoms...)}
}

func alloc(node string, atoms ...int) Allocation {
	a := Allocation{NodeID: node}
	for _, i := range atoms {
		a.Atoms = append(a.Atoms, fmt.Sprintf("%s-g%d", node, i))
	}
	return a
}

func req(class string, count int, topo string) Request {
	return Request{Class: class, Count: count, Topology: Topology{Type: topo}}
}

func TestPlace(t *testing.T) {
	l40 := Atom{ID: "c-l0", Class: ClassGPU, Attributes: map[string]any{"gpuModel": "L40S", "gpuProduct": "L40S-48GB", "memoryGiB": float64(48)}}
	mig := func(id, profile string) Atom {
		return Atom{ID: id, Class: ClassMIG, Attributes: map[string]any{"gpuModel": "A100", "migProfile": profile, "memoryGiB": int64(10)}}
	}
	cordoned := node("z", gpus("z", 8, ""))
	cordoned.Schedulable = false
	gang := func(n, k int) Request {
		return Request{Class: ClassGPU, Topology: Topology{Type: TopologyGang, Nodes: n, PerNode: k}}
	}
	cases := []struct {
		name    string
		req     Request
		nodes   []Node
		want    []Allocation
		reasons []Reason
	}{
		{name: "any on one node", req: req(ClassGPU, 2, TopologyAny),
			nodes: []Node{node("a", gpus("a", 4, ""))}, want: []Allocation{alloc("a", 0, 1)}},
		{name: "packing picks the busier node", req: req(ClassGPU, 2, TopologyAny),
			nodes: []Node{node("a", gpus("a", 8, "")), node("b", gpus("b", 3, ""))}, want: []Allocation{alloc("b", 0, 1)}},
		{name: "packing skips a node too full to fit", req: req(ClassGPU, 4, TopologySameNode),
			nodes: []Node{node("a", gpus("a", 8, "")), node("b", gpus("b", 3, "")), node("c", gpus("c", 5, ""))},
			want:  []Allocation{alloc("c", 0, 1, 2, 3)}},
		{name: "ties broken by node id", req: req(ClassGPU, 1, TopologyAny),
			nodes: []Node{node("b", gpus("b", 2, "")), node("a", gpus("a", 2, ""))}, want: []Allocation{alloc("a", 0)}},
		{name: "any spans nodes, largest first", req: req(ClassGPU, 6, TopologyAny),
			nodes: []Node{node("a", gpus("a", 2, "")), node("b", gpus("b", 4, "")), node("c", gpus("c", 3, ""))},
			want:  []Allocation{alloc("a", 0, 1), alloc("b", 0, 1, 2, 3)}},
		{name: "unschedulable nodes are skipped", req: req(ClassGPU, 1, TopologyAny),
			nodes: []Node{cordoned, node("b", gpus("b", 8, ""))}, want: []Allocation{alloc("b", 0)}},
		{name: "trusts filter", req: Request{Class: ClassGPU, Count: 1, Topology: Topology{Type: TopologyAny}, Trusts: []string{"tenantOwned"}},
			nodes:   []Node{node("a", gpus("a", 8, ""))},
			reasons: []Reason{{Code: ReasonNoSchedulableNodes, Candidates: intp(1), Message: "none of the pool's 1 nodes is schedulable"}}},
		{name: "no schedulable nodes", req: req(ClassGPU, 1, TopologyAny), nodes: []Node{cordoned},
			reasons: []Reason{{Code: ReasonNoSchedulableNodes, Candidates: intp(1), Message: "none of the pool's 1 nodes is schedulable"}}},
		{name: "no nodes at all", req: req(ClassGPU, 1, TopologyAny),
			reasons: []Reason{{Code: ReasonNoSchedulableNodes, Candidates: intp(0), Message: "none of the pool's 0 nodes is schedulable"}}},
		{name: "selector by model", req: Request{Class: ClassGPU, Count: 1, Selector: Selector{GPUModel: "L40S"}},
			nodes: []Node{node("a", gpus("a", 2, "")), node("c", []Atom{l40})}, want: []Allocation{{NodeID: "c", Atoms: []string{"c-l0"}}}},
		{name: "selector by product and memory", req: Request{Class: ClassGPU, Count: 1, Selector: Selector{GPUProduct: "H100-SXM5-80GB", MinMemoryGiB: 64}},
			nodes: []Node{node("c", []Atom{l40}), node("a", gpus("a", 2, ""))}, want: []Allocation{alloc("a", 0)}},
		{name: "selector matches nothing", req: Request{Class: ClassGPU, Count: 1, Selector: Selector{MinMemoryGiB: 100}},
			nodes: []Node{node("a", gpus("a", 1, "")), node("c", []Atom{l40})},
			reasons: []Reason{{Code: ReasonSelectorMatchesNothing, Message: "the selector matches none of the 2 free gpu atoms",
				Available: map[string][]string{"gpuModel": {"H100", "L40S"}, "gpuProduct": {"H100-SXM5-80GB", "L40S-48GB"}, "memoryGiB": {"48", "80"}}}}},
		{name: "mig profile", req: Request{Class: ClassMIG, Count: 2, Selector: Selector{MigProfile: "1g.10gb"}},
			nodes: []Node{node("m", []Atom{mig("m/gi1", "3g.40gb"), mig("m/gi2", "1g.10gb"), mig("m/gi3", "1g.10gb")}, gpus("m", 1, ""))},
			want:  []Allocation{{NodeID: "m", Atoms: []string{"m/gi2", "m/gi3"}}}},
		{name: "no atom of the class", req: req(ClassSlot, 1, TopologyAny), nodes: []Node{node("a", gpus("a", 8, ""))},
			reasons: []Reason{{Code: ReasonInsufficientAtoms, Scope: ScopeTotal, Wanted: 1, Max: intp(0), Message: "no gpu.slot atom is free on a schedulable node"}}},
		{name: "insufficient in total", req: req(ClassGPU, 9, TopologyAny),
			nodes:   []Node{node("a", gpus("a", 4, "")), node("b", gpus("b", 4, ""))},
			reasons: []Reason{{Code: ReasonInsufficientAtoms, Scope: ScopeTotal, Wanted: 9, Max: intp(8), Message: "wanted 9 matching atoms on the pool's schedulable nodes; at most 8 are free"}}},
		{name: "sameNode keeps atoms together", req: req(ClassGPU, 5, TopologySameNode),
			nodes:   []Node{node("a", gpus("a", 4, "")), node("b", gpus("b", 4, ""))},
			reasons: []Reason{{Code: ReasonInsufficientAtoms, Scope: ScopeNode, Wanted: 5, Max: intp(4), Message: "wanted 5 matching atoms on one node; at most 4 are free"}}},
		{name: "sameNVLinkDomain picks the fullest fitting domain", req: req(ClassGPU, 2, TopologySameNVLinkDomain),
			nodes: []Node{node("a", gpus("a", 4, "d1")), node("b", slices.Concat(gpus("b", 2, "d2"), []Atom{{ID: "b-x", Class: ClassGPU}}))},
			want:  []Allocation{alloc("b", 0, 1)}},
		{name: "sameNVLinkDomain spans nodes", req: req(ClassGPU, 6, TopologySameNVLinkDomain),
			nodes: []Node{node("a", gpus("a", 4, "nvl")), node("b", gpus("b", 4, "nvl"))},
			want:  []Allocation{alloc("a", 0, 1, 2, 3), alloc("b", 0, 1)}},
		{name: "sameNVLinkDomain insufficient", req: req(ClassGPU, 5, TopologySameNVLinkDomain),
			nodes:   []Node{node("a", gpus("a", 4, "d1")), node("b", gpus("b", 4, "d2"))},
			reasons: []Reason{{Code: ReasonInsufficientAtoms, Scope: ScopeNVLinkDomain, Wanted: 5, Max: intp(4), Message: "wanted 5 matching atoms in one NVLink domain; at most 4 are free"}}},
		{name: "sameNVLinkDomain without domains", req: req(ClassGPU, 1, TopologySameNVLinkDomain),
			nodes:   []Node{node("a", gpus("a", 4, ""))},
			reasons: []Reason{{Code: ReasonTopology, Wanted: 1, Message: "none of the 4 matching gpu atoms is in an NVLink domain"}}},
		{name: "gang: one allocation per node, packed", req: gang(2, 2),
			nodes: []Node{node("a", gpus("a", 8, "")), node("b", gpus("b", 2, "")), node("c", gpus("c", 1, "")), node("d", gpus("d", 3, ""))},
			want:  []Allocation{alloc("b", 0, 1), alloc("d", 0, 1)}},
		{name: "gang short of nodes", req: gang(3, 4),
			nodes: []Node{node("a", gpus("a", 8, "")), node("b", gpus("b", 4, "")), node("c", gpus("c", 3, ""))},
			reasons: []Reason{{Code: ReasonTopology, Wanted: 3, Max: intp(2),
				Message: "a gang of 3 nodes × 4 needs 3 nodes with 4 free matching gpu atoms; 2 have them (at most 8 on a node)"}}},
		{name: "whole nodes", req: req(ClassNode, 2, TopologyAny),
			nodes: []Node{node("a", []Atom{{ID: "node/a", Class: ClassNode}}), node("b", []Atom{{ID: "node/b", Class: ClassNode}})},
			want:  []Allocation{{NodeID: "a", Atoms: []string{"node/a"}}, {NodeID: "b", Atoms: []string{"node/b"}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Normalize(c.req, "devices.")
			if err != nil {
				t.Fatal(err)
			}
			plan, reasons := Place(r, c.nodes)
			if !reflect.DeepEqual(reasons, c.reasons) {
				t.Fatalf("reasons = %+v, want %+v", reasons, c.reasons)
			}
			if !reflect.DeepEqual(plan.Allocations, c.want) {
				t.Fatalf("plan = %+v, want %+v", plan.Allocations, c.want)
			}
			// Determinism: the candidates in another order give the same plan.
			rev := slices.Clone(c.nodes)
			slices.Reverse(rev)
			if again, _ := Place(r, rev); !reflect.DeepEqual(again, plan) {
				t.Fatalf("reversed candidates = %+v, want %+v", again, plan)
			}
		})
	}
}

func TestNormalize(t *testing.T) {
	r, err := Normalize(Request{Class: ClassGPU, Topology: Topology{Type: TopologyGang, Nodes: 2, PerNode: 4}}, "")
	if err != nil || r.Count != 8 {
		t.Fatalf("gang = %+v, %v", r, err)
	}
	if r, err := Normalize(Request{Class: ClassGPU, Count: 1}, ""); err != nil || r.Topology.Type != TopologyAny {
		t.Fatalf("default topology = %+v, %v", r, err)
	}
	for field, bad := range map[string]Request{
		"d.class":                 {Class: "disk", Count: 1},
		"d.count":                 {Class: ClassGPU},
		"d.topology.type":         {Class: ClassGPU, Count: 1, Topology: Topology{Type: "ring"}},
		"d.topology":              {Class: ClassGPU, Count: 1, Topology: Topology{Type: TopologySameNode, Nodes: 2}},
		"d.selector.minMemoryGiB": {Class: ClassGPU, Count: 1, Selector: Selector{MinMemoryGiB: -1}},
		"d.selector.migProfile":   {Class: ClassGPU, Count: 1, Selector: Selector{MigProfile: "1g.10gb"}},
	} {
		_, err := Normalize(bad, "d.")
		if err == nil || err.Code != core.CodeInvalidInput || err.Details["field"] != field {
			t.Errorf("%+v = %v, want INVALID_INPUT on %s", bad, err, field)
		}
	}
	if _, err := Normalize(Request{Class: ClassGPU, Count: 5, Topology: Topology{Type: TopologyGang, Nodes: 2, PerNode: 2}}, ""); err == nil || err.Details["field"] != "count" {
		t.Errorf("gang count mismatch = %v", err)
	}
	if _, err := Normalize(Request{Class: ClassGPU, Count: MaxCount + 1}, ""); err == nil {
		t.Errorf("count over MaxCount accepted")
	}
}
