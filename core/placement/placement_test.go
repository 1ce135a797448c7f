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

// placeCase is one of TestPlace's requests over candidates, with the plan
// or the reasons Place answers.
type placeCase struct {
	name    string
	req     Request
	nodes   []Node
	want    []Allocation
	reasons []Reason
}

func placeCases() []placeCase {
	l40 := Atom{ID: "c-l0", Class: ClassGPU, Attributes: map[string]any{"gpuModel": "L40S", "gpuProduct": "L40S-48GB", "memoryGiB": float64(48)}}
	mig := func(id, profile string) Atom {
		return Atom{ID: id, Class: ClassMIG, Attributes: map[string]any{"gpuModel": "A100", "migProfile": profile, "memoryGiB": int64(10)}}
	}
	cordoned := node("z", gpus("z", 8, ""))
	cordoned.Schedulable = false
	gang := func(n, k int) Request {
		return Request{Class: ClassGPU, Topology: Topology{Type: TopologyGang, Nodes: n, PerNode: k}}
	}
	return []placeCase{
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
}

func TestPlace(t *testing.T) {
	for _, c := range placeCases() {
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

// shape is what packing decides of a plan: for each allocation, how many
// matching atoms its node had free and how many it takes, sorted.
func shape(t *testing.T, r Request, nodes []Node, p Plan) [][2]int {
	t.Helper()
	free := map[string]map[string]bool{}
	for _, n := range nodes {
		free[n.ID] = map[string]bool{}
		for _, a := range n.Atoms {
			if a.Class == r.Class && r.Selector.Matches(a) {
				free[n.ID][a.ID] = true
			}
		}
	}
	var out [][2]int
	total := 0
	for _, a := range p.Allocations {
		if !slices.IsSorted(a.Atoms) || len(slices.Compact(slices.Clone(a.Atoms))) != len(a.Atoms) {
			t.Fatalf("allocation %+v: atoms not sorted and distinct", a)
		}
		for _, id := range a.Atoms {
			if !free[a.NodeID][id] {
				t.Fatalf("allocation %+v: %s is not a free matching atom of the node", a, id)
			}
		}
		total += len(a.Atoms)
		out = append(out, [2]int{len(free[a.NodeID]), len(a.Atoms)})
	}
	if len(p.Allocations) > 0 && total != r.Count {
		t.Fatalf("plan %+v takes %d atoms, want %d", p, total, r.Count)
	}
	slices.SortFunc(out, func(a, b [2]int) int {
		if a[0] != b[0] {
			return a[0] - b[0]
		}
		return a[1] - b[1]
	})
	return out
}

// PlaceSpread answers every one of Place's cases as well as Place does
// (the same reasons, or a plan of the same packing), and the same plan for
// the same seed whatever the candidates' order.
func TestPlaceSpreadPacksLikePlace(t *testing.T) {
	for _, c := range placeCases() {
		t.Run(c.name, func(t *testing.T) {
			r, err := Normalize(c.req, "devices.")
			if err != nil {
				t.Fatal(err)
			}
			plan, reasons := Place(r, c.nodes)
			want := shape(t, r, c.nodes, plan)
			for i := range 32 {
				seed := Seed(fmt.Sprintf("res_%d", i))
				p, rs := PlaceSpread(r, c.nodes, seed)
				if !reflect.DeepEqual(rs, reasons) {
					t.Fatalf("seed %d: reasons = %+v, want %+v", i, rs, reasons)
				}
				if got := shape(t, r, c.nodes, p); !reflect.DeepEqual(got, want) {
					t.Fatalf("seed %d: plan %+v packs as %v, Place's %+v as %v", i, p, got, plan, want)
				}
				rev := slices.Clone(c.nodes)
				slices.Reverse(rev)
				if again, _ := PlaceSpread(r, rev, seed); !reflect.DeepEqual(again, p) {
					t.Fatalf("seed %d: reversed candidates = %+v, want %+v", i, again, p)
				}
			}
		})
	}
}

// Different seeds choose different atoms among equally good ones (all of
// one node's, and the nodes of equal free atoms), and never a worse node.
func TestPlaceSpreadSpreads(t *testing.T) {
	chosen := func(r Request, nodes []Node) map[string]int {
		t.Helper()
		seen := map[string]int{}
		for i := range 64 {
			p, rs := PlaceSpread(r, nodes, Seed(fmt.Sprintf("res_%d", i)))
			if len(rs) > 0 {
				t.Fatalf("reasons %+v", rs)
			}
			for _, a := range p.Allocations {
				for _, id := range a.Atoms {
					seen[id]++
				}
			}
		}
		return seen
	}
	one := req(ClassGPU, 1, TopologyAny)
	if seen := chosen(one, []Node{node("a", gpus("a", 8, ""))}); len(seen) != 8 {
		t.Errorf("64 seeds chose %v of one node's 8 atoms, want all of them", seen)
	}
	seen := chosen(req(ClassGPU, 2, TopologySameNode), []Node{node("a", gpus("a", 4, "")), node("b", gpus("b", 4, "")), node("c", gpus("c", 8, ""))})
	var onA, onB int
	for id, n := range seen {
		switch id[0] {
		case 'a':
			onA += n
		case 'b':
			onB += n
		default:
			t.Errorf("seeds chose %s on the emptier node c: %v", id, seen)
		}
	}
	if onA == 0 || onB == 0 {
		t.Errorf("64 seeds chose %v: want both nodes of 4 free atoms", seen)
	}
	gang := Request{Class: ClassGPU, Count: 2, Topology: Topology{Type: TopologyGang, Nodes: 2, PerNode: 1}}
	if seen := chosen(gang, []Node{node("a", gpus("a", 2, "")), node("b", gpus("b", 2, "")), node("c", gpus("c", 2, ""))}); len(seen) < 5 {
		t.Errorf("64 seeds chose only %v for a gang over 3 equal nodes", seen)
	}
}
