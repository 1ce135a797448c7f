package inventory

import (
	"fmt"
	"reflect"
	"sort"
)

// Change operations.
const (
	OpAdded   = "added"
	OpRemoved = "removed"
	OpChanged = "changed"
)

// Change is one difference inside a section. Path names the field in dotted
// form, list items by their natural key when they have one
// ("gpus.devices[uuid=GPU-…].memoryMiB", "disks[wwn=0x5000…]") and by
// position otherwise.
type Change struct {
	Path string `json:"path"`
	Op   string `json:"op"`
	Old  any    `json:"old,omitempty"`
	New  any    `json:"new,omitempty"`
}

// SectionDiff is a section whose hash differs between two inventories.
type SectionDiff struct {
	Section string   `json:"section"`
	OldHash string   `json:"oldHash"`
	NewHash string   `json:"newHash"`
	Changes []Change `json:"changes"`
}

// InventoryDiff is the difference between two inventories of a node.
type InventoryDiff struct {
	// Changed lists the names of the sections whose hashes differ, in
	// section order; empty when the hardware is the same.
	Changed  []string      `json:"changed"`
	Sections []SectionDiff `json:"sections"`
}

// Empty reports whether the inventories are equal section by section.
func (d *InventoryDiff) Empty() bool { return len(d.Changed) == 0 }

// Diff returns the diff from old to new. Sections whose hashes agree are
// not inspected; report-level fields (collectedAt, agentVersion) never count.
func Diff(old, new *NodeInventory) (*InventoryDiff, error) {
	oh, err := Hash(old)
	if err != nil {
		return nil, err
	}
	nh, err := Hash(new)
	if err != nil {
		return nil, err
	}
	ot, err := SectionTrees(old)
	if err != nil {
		return nil, err
	}
	nt, err := SectionTrees(new)
	if err != nil {
		return nil, err
	}
	d := &InventoryDiff{Changed: []string{}, Sections: []SectionDiff{}}
	for _, s := range Sections {
		if oh.Sections[s] == nh.Sections[s] {
			continue
		}
		sd := SectionDiff{Section: s, OldHash: oh.Sections[s], NewHash: nh.Sections[s], Changes: []Change{}}
		diffTree(s, ot[s], nt[s], &sd.Changes)
		d.Changed = append(d.Changed, s)
		d.Sections = append(d.Sections, sd)
	}
	return d, nil
}

// itemKeys are the fields that identify a list item, in preference order.
var itemKeys = []string{"uuid", "wwn", "permanentMac", "locator", "pciBusId", "name", "mac", "index", "gi"}

func diffTree(path string, a, b any, out *[]Change) {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			break
		}
		keys := map[string]bool{}
		for k := range av {
			keys[k] = true
		}
		for k := range bv {
			keys[k] = true
		}
		for _, k := range sortedKeys(keys) {
			x, inA := av[k]
			y, inB := bv[k]
			p := path + "." + k
			switch {
			case !inA:
				*out = append(*out, Change{Path: p, Op: OpAdded, New: y})
			case !inB:
				*out = append(*out, Change{Path: p, Op: OpRemoved, Old: x})
			default:
				diffTree(p, x, y, out)
			}
		}
		return
	case []any:
		bv, ok := b.([]any)
		if !ok {
			break
		}
		diffList(path, av, bv, out)
		return
	}
	if !reflect.DeepEqual(a, b) {
		*out = append(*out, Change{Path: path, Op: OpChanged, Old: a, New: b})
	}
}

func diffList(path string, a, b []any, out *[]Change) {
	field := listKey(a, b)
	if field == "" {
		n := max(len(a), len(b))
		for i := range n {
			p := fmt.Sprintf("%s[%d]", path, i)
			switch {
			case i >= len(a):
				*out = append(*out, Change{Path: p, Op: OpAdded, New: b[i]})
			case i >= len(b):
				*out = append(*out, Change{Path: p, Op: OpRemoved, Old: a[i]})
			default:
				diffTree(p, a[i], b[i], out)
			}
		}
		return
	}
	index := func(l []any) map[string]any {
		m := make(map[string]any, len(l))
		for _, item := range l {
			m[fmt.Sprint(item.(map[string]any)[field])] = item
		}
		return m
	}
	am, bm := index(a), index(b)
	keys := map[string]bool{}
	for k := range am {
		keys[k] = true
	}
	for k := range bm {
		keys[k] = true
	}
	for _, k := range sortedKeys(keys) {
		p := fmt.Sprintf("%s[%s=%s]", path, field, k)
		x, inA := am[k]
		y, inB := bm[k]
		switch {
		case !inA:
			*out = append(*out, Change{Path: p, Op: OpAdded, New: y})
		case !inB:
			*out = append(*out, Change{Path: p, Op: OpRemoved, Old: x})
		default:
			diffTree(p, x, y, out)
		}
	}
}

// listKey picks the first item key every item of both lists has, with values
// unique within each list; "" when the lists are not of keyed objects.
func listKey(a, b []any) string {
	for _, f := range itemKeys {
		if keyedBy(f, a) && keyedBy(f, b) && (len(a) > 0 || len(b) > 0) {
			return f
		}
	}
	return ""
}

func keyedBy(field string, l []any) bool {
	seen := map[string]bool{}
	for _, item := range l {
		m, ok := item.(map[string]any)
		if !ok {
			return false
		}
		v, ok := m[field]
		if !ok {
			return false
		}
		k := fmt.Sprint(v)
		if k == "" || seen[k] {
			return false
		}
		seen[k] = true
	}
	return true
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
