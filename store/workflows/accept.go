package workflows

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/better-compute/better-compute/core/inventory"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/nodes"
)

// Accept runs the tenant's workflow's acceptance checks on its node's
// latest inventory and answers the failures (none when all hold). A node
// with no inventory fails every check it has.
func Accept(ctx context.Context, tx store.Tx, tenantID, id string) ([]string, error) {
	w, err := read(ctx, tx, tenantID, id, false)
	if err != nil {
		return nil, err
	}
	checks := w.context.Acceptance
	if len(checks) == 0 {
		return nil, nil
	}
	snap, err := nodes.Snapshot(ctx, tx, tenantID, w.NodeID, 0)
	if err != nil {
		return []string{"the node has no inventory: " + err.Error()}, nil
	}
	inv, err := inventory.Parse(snap.Document)
	if err != nil {
		return []string{"the node's inventory does not parse: " + err.Error()}, nil
	}
	return Check(inv, checks), nil
}

// Check answers which of checks inv fails, each as a sentence.
func Check(inv *inventory.NodeInventory, checks []provisioning.Check) []string {
	var out []string
	for _, c := range checks {
		if why := check(inv, c); why != "" {
			out = append(out, why)
		}
	}
	return out
}

func check(inv *inventory.NodeInventory, c provisioning.Check) string {
	switch c.Kind {
	case provisioning.CheckMinMemoryGiB:
		want, ok := number(c.Value)
		have := float64(inv.Memory.TotalBytes) / (1 << 30)
		if !ok || math.Floor(have+0.5) < want {
			return fmt.Sprintf("%s: the node has %.1f GiB of memory, %v wanted", c.Kind, have, c.Value)
		}
	case provisioning.CheckMinCPUs:
		want, ok := number(c.Value)
		if !ok || float64(inv.CPU.LogicalCPUs) < want {
			return fmt.Sprintf("%s: the node has %d CPUs, %v wanted", c.Kind, inv.CPU.LogicalCPUs, c.Value)
		}
	case provisioning.CheckGPUCount:
		want, ok := number(c.Value)
		if !ok || float64(len(inv.GPUs.Devices)) != want {
			return fmt.Sprintf("%s: the node has %d GPUs, %v wanted", c.Kind, len(inv.GPUs.Devices), c.Value)
		}
	case provisioning.CheckGPUModel:
		want, _ := c.Value.(string)
		if want == "" || len(inv.GPUs.Devices) == 0 {
			return fmt.Sprintf("%s: the node has no GPU of model %v", c.Kind, c.Value)
		}
		for _, g := range inv.GPUs.Devices {
			if !strings.Contains(strings.ToLower(g.Name), strings.ToLower(want)) {
				return fmt.Sprintf("%s: GPU %d is %s, %s wanted", c.Kind, g.Index, g.Name, want)
			}
		}
	case provisioning.CheckMinDisks:
		want, ok := number(c.Value)
		if !ok || float64(len(inv.Disks)) < want {
			return fmt.Sprintf("%s: the node has %d disks, %v wanted", c.Kind, len(inv.Disks), c.Value)
		}
	default:
		return fmt.Sprintf("%s: not a known acceptance check", c.Kind)
	}
	return ""
}

// number reads a check's value as JSON decoded it (a float64), or a
// number given as a string.
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case string:
		f, err := strconv.ParseFloat(x, 64)
		return f, err == nil
	}
	return 0, false
}
