// Package placement decides where a device request goes: which nodes, which
// atoms. It is pure (no I/O): the caller reads the candidate nodes with their
// atoms that are free over the requested window (no overlapping booking) and
// the engine chooses among them, or says, with structured reasons, why
// nothing fits. capacity.preview runs it read-only; reservations run it and
// then book the plan's atoms.
//
// Rules:
//   - only schedulable nodes (and, when the request names trusts, of those
//     trusts) are candidates;
//   - the selector must match every chosen atom;
//   - sameNode keeps all atoms on one node, sameNVLinkDomain in one NVLink
//     domain (the atoms' nvlinkDomain attribute; a domain may span nodes),
//     a gang takes perNode atoms on each of nodes distinct nodes, one
//     allocation per node;
//   - packing: among the nodes (or domains) that fit, the one with the fewest
//     free matching atoms wins, so large requests stay placeable; ties are
//     broken by id, so the same input always gives the same plan.
//
// PlaceSpread keeps every rule but breaks the ties (between nodes or
// domains of equal free atoms, and between the atoms of one node) by a
// seed instead of by id: concurrent requests with different seeds then
// mostly choose different atoms instead of all racing for the first ones,
// and one seed still always gives the same plan.
package placement

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"

	"github.com/better-compute/better-compute/core"
)

// Classes a request may ask for.
const (
	ClassGPU  = "gpu"
	ClassMIG  = "gpu.mig"
	ClassSlot = "gpu.slot"
	ClassNode = "node"
)

// Classes lists the requestable classes.
var Classes = []string{ClassGPU, ClassMIG, ClassSlot, ClassNode}

// Topologies.
const (
	TopologyAny              = "any"
	TopologySameNode         = "sameNode"
	TopologySameNVLinkDomain = "sameNVLinkDomain"
	TopologyGang             = "gang"
)

// Topologies lists the topology types.
var Topologies = []string{TopologyAny, TopologySameNode, TopologySameNVLinkDomain, TopologyGang}

// Reason codes.
const (
	ReasonNoSchedulableNodes     = "noSchedulableNodes"
	ReasonSelectorMatchesNothing = "selectorMatchesNothing"
	ReasonInsufficientAtoms      = "insufficientAtoms"
	ReasonTopology               = "topology"
)

// Scopes of an insufficientAtoms reason.
const (
	ScopeNode         = "node"
	ScopeNVLinkDomain = "nvlinkDomain"
	ScopeTotal        = "total"
)

// MaxCount bounds a request's atoms.
const MaxCount = 4096

// Selector narrows the atoms; empty fields match anything.
type Selector struct {
	GPUModel     string `json:"gpuModel,omitempty"`
	GPUProduct   string `json:"gpuProduct,omitempty"`
	MinMemoryGiB int64  `json:"minMemoryGiB,omitempty"`
	MigProfile   string `json:"migProfile,omitempty"`
}

// Topology is how the atoms must sit. Nodes and PerNode are a gang's.
type Topology struct {
	Type    string `json:"type"`
	Nodes   int    `json:"nodes,omitempty"`
	PerNode int    `json:"perNode,omitempty"`
}

// Request is what to place. For a gang, Count is Nodes × PerNode (0 means
// that).
type Request struct {
	Class    string   `json:"class"`
	Count    int      `json:"count"`
	Selector Selector `json:"selector"`
	Topology Topology `json:"topology"`
	// Trusts, when set, are the node trusts acceptable (the caller's policy).
	Trusts []string `json:"-"`
}

// Atom is a free bookable device.
type Atom struct {
	ID         string         `json:"id"`
	Class      string         `json:"class"`
	Attributes map[string]any `json:"attributes,omitempty"`
}

// Node is a candidate: its atoms are those free over the whole window.
type Node struct {
	ID          string
	Schedulable bool
	Trust       string
	Atoms       []Atom
}

// Allocation is the atoms chosen on one node, sorted by id.
type Allocation struct {
	NodeID string   `json:"nodeId"`
	Atoms  []string `json:"atoms"`
}

// Plan is a placement: allocations sorted by node id.
type Plan struct {
	Allocations []Allocation `json:"allocations"`
}

// Reason says why a request does not fit.
type Reason struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Scope of an insufficientAtoms reason: node, nvlinkDomain or total.
	Scope string `json:"scope,omitempty"`
	// Wanted atoms (or, for a gang's topology reason, nodes).
	Wanted int `json:"wanted,omitempty"`
	// Max free matching atoms in the scope (or nodes able to take a gang's share).
	Max *int `json:"max,omitempty"`
	// Candidates: the nodes considered (noSchedulableNodes).
	Candidates *int `json:"candidates,omitempty"`
	// Available: selectorMatchesNothing's distinct attribute values of the
	// requested class's free atoms, to say what a selector could ask for.
	Available map[string][]string `json:"available,omitempty"`
}

func intp(n int) *int { return &n }

func invalid(field, format string, args ...any) *core.Error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": "invalid"})
}

// Normalize validates a request, fills its defaults (topology any, a gang's
// count) and returns it; field names in errors are under prefix
// (devices.count).
func Normalize(req Request, prefix string) (Request, *core.Error) {
	f := func(name string) string { return prefix + name }
	if !slices.Contains(Classes, req.Class) {
		return req, invalid(f("class"), "class must be one of %v", Classes)
	}
	if req.Topology.Type == "" {
		req.Topology.Type = TopologyAny
	}
	if !slices.Contains(Topologies, req.Topology.Type) {
		return req, invalid(f("topology.type"), "topology.type must be one of %v", Topologies)
	}
	if req.Topology.Type == TopologyGang {
		t := req.Topology
		if t.Nodes < 1 || t.PerNode < 1 || t.Nodes > MaxCount || t.PerNode > MaxCount || t.Nodes*t.PerNode > MaxCount {
			return req, invalid(f("topology"), "a gang needs nodes and perNode of at least 1, at most %d atoms in all", MaxCount)
		}
		if req.Count == 0 {
			req.Count = t.Nodes * t.PerNode
		}
		if req.Count != t.Nodes*t.PerNode {
			return req, invalid(f("count"), "a gang's count must be nodes × perNode (%d)", t.Nodes*t.PerNode)
		}
	} else if req.Topology.Nodes != 0 || req.Topology.PerNode != 0 {
		return req, invalid(f("topology"), "nodes and perNode are a gang's only")
	}
	if req.Count < 1 || req.Count > MaxCount {
		return req, invalid(f("count"), "count must be in [1, %d]", MaxCount)
	}
	if req.Selector.MinMemoryGiB < 0 {
		return req, invalid(f("selector.minMemoryGiB"), "minMemoryGiB must be at least 0")
	}
	if req.Selector.MigProfile != "" && req.Class != ClassMIG {
		return req, invalid(f("selector.migProfile"), "migProfile selects gpu.mig atoms only")
	}
	return req, nil
}

// Matches reports whether an atom satisfies the selector.
func (s Selector) Matches(a Atom) bool {
	str := func(k string) string { v, _ := a.Attributes[k].(string); return v }
	switch {
	case s.GPUModel != "" && str("gpuModel") != s.GPUModel,
		s.GPUProduct != "" && str("gpuProduct") != s.GPUProduct,
		s.MigProfile != "" && str("migProfile") != s.MigProfile:
		return false
	case s.MinMemoryGiB > 0:
		m, ok := number(a.Attributes["memoryGiB"])
		return ok && m >= float64(s.MinMemoryGiB)
	}
	return true
}

func number(v any) (float64, bool) {
	switch n := v.(type) {
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	case float64:
		return n, true
	case string:
		f, err := strconv.ParseFloat(n, 64)
		return f, err == nil && !math.IsNaN(f)
	}
	return 0, false
}

// group is a set of matching atoms that may be placed together: one node's,
// or one NVLink domain's across nodes.
type group struct {
	id    string
	atoms map[string][]string // node id → atom ids, sorted
	free  int
}

// Place chooses atoms for req among the candidates. It returns the plan and
// no reasons when the request fits; otherwise an empty plan and at least one
// reason. req must have been through Normalize.
func Place(req Request, candidates []Node) (Plan, []Reason) {
	return place(req, candidates, byID{})
}

// PlaceSpread is Place with its ties broken by seed (see the package
// comment): the plan is as good as Place's, by the same rules, and the
// same for the same seed and candidates.
func PlaceSpread(req Request, candidates []Node, seed uint64) (Plan, []Reason) {
	return place(req, candidates, bySeed(seed))
}

// Seed is a request's seed for PlaceSpread derived from a key (a
// reservation id), so a request keeps its preferences when it places
// again.
func Seed(key string) uint64 { return fnv1a(key) }

// fnv1a is the 64-bit FNV-1a hash of s.
func fnv1a(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// tieBreak orders ids that the packing rules leave equal.
type tieBreak interface {
	compare(a, b string) int
}

// byID breaks ties by id.
type byID struct{}

func (byID) compare(a, b string) int { return cmpString(a, b) }

// bySeed breaks ties by a hash of the id under the seed, then by id: a
// pseudo-random order that one seed always gives again.
type bySeed uint64

func (s bySeed) compare(a, b string) int {
	ra, rb := s.rank(a), s.rank(b)
	switch {
	case ra < rb:
		return -1
	case ra > rb:
		return 1
	}
	return cmpString(a, b)
}

// rank mixes the id's FNV-1a hash with the seed (SplitMix64's finalizer),
// so that nearby seeds give unrelated orders.
func (s bySeed) rank(id string) uint64 {
	z := fnv1a(id) ^ uint64(s)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func place(req Request, candidates []Node, tie tieBreak) (Plan, []Reason) {
	nodes := make([]Node, 0, len(candidates))
	for _, n := range candidates {
		if n.Schedulable && (len(req.Trusts) == 0 || slices.Contains(req.Trusts, n.Trust)) {
			nodes = append(nodes, n)
		}
	}
	slices.SortFunc(nodes, func(a, b Node) int { return cmpString(a.ID, b.ID) })
	if len(nodes) == 0 {
		return Plan{}, []Reason{{Code: ReasonNoSchedulableNodes, Candidates: intp(len(candidates)),
			Message: fmt.Sprintf("none of the pool's %d nodes is schedulable", len(candidates))}}
	}

	// The matching free atoms per node, and what the class offers.
	perNode := make([]group, 0, len(nodes))
	var ofClass, total int
	available := map[string]map[string]bool{}
	for _, n := range nodes {
		g := group{id: n.ID, atoms: map[string][]string{}}
		for _, a := range n.Atoms {
			if a.Class != req.Class {
				continue
			}
			ofClass++
			for _, k := range []string{"gpuModel", "gpuProduct", "memoryGiB", "migProfile"} {
				if v, ok := a.Attributes[k]; ok && v != nil {
					if available[k] == nil {
						available[k] = map[string]bool{}
					}
					available[k][fmt.Sprint(v)] = true
				}
			}
			if req.Selector.Matches(a) {
				g.atoms[n.ID] = append(g.atoms[n.ID], a.ID)
				g.free++
			}
		}
		slices.SortFunc(g.atoms[n.ID], tie.compare)
		total += g.free
		perNode = append(perNode, g)
	}
	if ofClass == 0 {
		return Plan{}, []Reason{{Code: ReasonInsufficientAtoms, Scope: ScopeTotal, Wanted: req.Count, Max: intp(0),
			Message: fmt.Sprintf("no %s atom is free on a schedulable node", req.Class)}}
	}
	if total == 0 {
		out := map[string][]string{}
		for k, vs := range available {
			out[k] = slices.Sorted(maps.Keys(vs))
		}
		return Plan{}, []Reason{{Code: ReasonSelectorMatchesNothing, Available: out,
			Message: fmt.Sprintf("the selector matches none of the %d free %s atoms", ofClass, req.Class)}}
	}
	maxNode := 0
	for _, g := range perNode {
		maxNode = max(maxNode, g.free)
	}

	switch req.Topology.Type {
	case TopologySameNode:
		if g, ok := bestFit(perNode, req.Count, tie); ok {
			return take(g, req.Count), nil
		}
		return Plan{}, []Reason{insufficient(ScopeNode, req.Count, maxNode, "on one node")}

	case TopologySameNVLinkDomain:
		domains := map[string]*group{}
		for _, n := range nodes {
			for _, a := range n.Atoms {
				d, _ := a.Attributes["nvlinkDomain"].(string)
				if a.Class != req.Class || d == "" || !req.Selector.Matches(a) {
					continue
				}
				if domains[d] == nil {
					domains[d] = &group{id: d, atoms: map[string][]string{}}
				}
				domains[d].atoms[n.ID] = append(domains[d].atoms[n.ID], a.ID)
				domains[d].free++
			}
		}
		if len(domains) == 0 {
			return Plan{}, []Reason{{Code: ReasonTopology, Wanted: req.Count,
				Message: fmt.Sprintf("none of the %d matching %s atoms is in an NVLink domain", total, req.Class)}}
		}
		gs := make([]group, 0, len(domains))
		maxDomain := 0
		for _, g := range domains {
			for _, ids := range g.atoms {
				slices.SortFunc(ids, tie.compare)
			}
			gs = append(gs, *g)
			maxDomain = max(maxDomain, g.free)
		}
		if g, ok := bestFit(gs, req.Count, tie); ok {
			return take(g, req.Count), nil
		}
		return Plan{}, []Reason{insufficient(ScopeNVLinkDomain, req.Count, maxDomain, "in one NVLink domain")}

	case TopologyGang:
		k, want := req.Topology.PerNode, req.Topology.Nodes
		var fit []group
		for _, g := range perNode {
			if g.free >= k {
				fit = append(fit, g)
			}
		}
		if len(fit) < want {
			return Plan{}, []Reason{{Code: ReasonTopology, Wanted: want, Max: intp(len(fit)),
				Message: fmt.Sprintf("a gang of %d nodes × %d needs %d nodes with %d free matching %s atoms; %d have them (at most %d on a node)",
					want, k, want, k, req.Class, len(fit), maxNode)}}
		}
		sortPacking(fit, tie)
		var plan Plan
		for _, g := range fit[:want] {
			plan.Allocations = append(plan.Allocations, take(g, k).Allocations...)
		}
		sortPlan(&plan)
		return plan, nil

	default: // any
		if total < req.Count {
			return Plan{}, []Reason{insufficient(ScopeTotal, req.Count, total, "on the pool's schedulable nodes")}
		}
		// One node when one can take it all (the fullest that fits);
		// otherwise the fewest nodes: the largest first, then the
		// fullest that takes the rest.
		if g, ok := bestFit(perNode, req.Count, tie); ok {
			return take(g, req.Count), nil
		}
		rest := slices.Clone(perNode)
		slices.SortFunc(rest, func(a, b group) int {
			if a.free != b.free {
				return b.free - a.free
			}
			return tie.compare(a.id, b.id)
		})
		var plan Plan
		left := req.Count
		for len(rest) > 0 && left > 0 {
			if g, ok := bestFit(rest, left, tie); ok {
				plan.Allocations = append(plan.Allocations, take(g, left).Allocations...)
				break
			}
			plan.Allocations = append(plan.Allocations, take(rest[0], rest[0].free).Allocations...)
			left -= rest[0].free
			rest = rest[1:]
		}
		sortPlan(&plan)
		return plan, nil
	}
}

func insufficient(scope string, wanted, max int, where string) Reason {
	return Reason{Code: ReasonInsufficientAtoms, Scope: scope, Wanted: wanted, Max: intp(max),
		Message: fmt.Sprintf("wanted %d matching atoms %s; at most %d are free", wanted, where, max)}
}

// bestFit is the group with the fewest free atoms that still has n, ties
// broken by tie.
func bestFit(gs []group, n int, tie tieBreak) (group, bool) {
	var best group
	found := false
	for _, g := range gs {
		if g.free < n {
			continue
		}
		if !found || g.free < best.free || (g.free == best.free && tie.compare(g.id, best.id) < 0) {
			best, found = g, true
		}
	}
	return best, found
}

func sortPacking(gs []group, tie tieBreak) {
	slices.SortFunc(gs, func(a, b group) int {
		if a.free != b.free {
			return a.free - b.free
		}
		return tie.compare(a.id, b.id)
	})
}

// take n atoms of a group: the nodes in id order, each node's atoms in the
// order they were sorted in (by id, or by the seed), so the choice is
// deterministic; a plan's atoms are sorted by id again, the order bookers
// lock them in.
func take(g group, n int) Plan {
	var plan Plan
	for _, node := range slices.Sorted(maps.Keys(g.atoms)) {
		if n == 0 {
			break
		}
		ids := g.atoms[node]
		k := min(n, len(ids))
		if k == 0 {
			continue
		}
		atoms := slices.Clone(ids[:k])
		slices.Sort(atoms)
		plan.Allocations = append(plan.Allocations, Allocation{NodeID: node, Atoms: atoms})
		n -= k
	}
	return plan
}

func sortPlan(p *Plan) {
	slices.SortFunc(p.Allocations, func(a, b Allocation) int { return cmpString(a.NodeID, b.NodeID) })
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
