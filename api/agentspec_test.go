package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/commands"
	"github.com/better-compute/better-compute/agent/session"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/core/inventory"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
	nodesdomain "github.com/better-compute/better-compute/store/nodes"
)

// The session sends the NodeSpec after welcome and again when its
// generation moves; the generation the agent reports observing becomes the
// node's observedGeneration, which schedulability needs.
func TestAgentSessionNodeSpec(t *testing.T) {
	ae := newAgentEnv(t, time.Minute, "")
	ctx := context.Background()
	// A joined node has observed nothing yet.
	n := ae.env.node(nodesdomain.NewNode{PoolID: ae.pool.ID, Name: "gpu-2", ProvisionState: nodestate.Adopted, Role: nodestate.RoleHost,
		Power: nodestate.PowerOn}, nil)
	id := ae.issue(n.ID, true)
	c := ae.client(ae.boot.UserToken)

	rs, _ := ae.open(id)
	rs.send(hello(time.Now()))
	rs.next("welcome")
	spec := rs.next("spec")
	gen := spec["generation"].(float64)
	if gen < 1 || spec["spec"].(map[string]any)["cordoned"] != false {
		t.Fatalf("spec frame %v", spec)
	}
	if got, err := nodes.Get.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: n.ID}); err != nil || got.ObservedGeneration != 0 || got.Schedulable {
		t.Fatalf("before observing: %+v, %v", got, err)
	}
	// A generation the node never had is ignored; the one sent is taken.
	rs.send(map[string]any{"type": "observed", "generation": gen + 5})
	rs.send(map[string]any{"type": "observed", "generation": gen})
	testutil.EventuallyNil(t, 20*time.Second, func() error {
		got, err := nodes.Get.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: n.ID})
		if err != nil {
			t.Fatal(err)
		}
		if got.ObservedGeneration != int64(gen) {
			return fmt.Errorf("observedGeneration %d, want %v", got.ObservedGeneration, gen)
		}
		return nil
	})
	// Cordoning moves the generation: the next heartbeat brings the new spec.
	if _, err := nodes.Cordon.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: n.ID}); err != nil {
		t.Fatal(err)
	}
	rs.send(map[string]any{"type": "heartbeat", "clock": time.Now().UnixMilli()})
	next := rs.next("spec")
	if next["generation"].(float64) <= gen || next["spec"].(map[string]any)["cordoned"] != true {
		t.Fatalf("spec after the cordon %v", next)
	}
}

// The agent collects its inventory again while the session lasts and sends
// it when a section changed (a disk added here), never an unchanged one.
func TestAgentSessionResendsAChangedInventory(t *testing.T) {
	ae := newAgentEnv(t, time.Minute, "")
	doc, err := inventory.Parse(fixture(t, "h100-8x-sxm.json"))
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	ae.run(session.Options{StateDir: t.TempDir(), InventoryEvery: 50 * time.Millisecond,
		Inventory: func(context.Context) (*inventory.NodeInventory, error) {
			d := *doc
			if calls.Add(1) > 3 { // the machine gained a disk
				d.Disks = append(slices.Clone(doc.Disks), inventory.Disk{Name: "nvme9n1", Serial: "S9", SizeBytes: 1 << 40})
			}
			return &d, nil
		}})
	snapshots := func() int {
		return ae.count(`SELECT count(*) FROM node_inventories WHERE node_id = $1`, ae.node.ID)
	}
	testutil.Eventually(t, 20*time.Second, "the first and the changed inventory snapshots", func() bool { return snapshots() >= 2 })
	// Many more collections, no more snapshots.
	n := calls.Load()
	testutil.Eventually(t, 20*time.Second, "five more collections", func() bool { return calls.Load() >= n+5 })
	if got := snapshots(); got != 2 {
		t.Fatalf("%d inventory snapshots, want 2", got)
	}
}

// A session the server has nothing to say to lasts as long as the agent
// beats: the write deadline of the server's last frame must not reset the
// stream a lease later (HTTP/2 resets a stream whose write deadline
// passes, write pending or not).
func TestAgentSessionOutlivesItsLastServerFrame(t *testing.T) {
	ae := newAgentEnv(t, time.Second, "")
	rs, _ := ae.open(ae.identity)
	rs.send(hello(time.Now()))
	rs.next("welcome")
	// Three leases of heartbeats, no server frame: the time passing is the
	// point, on the HTTP/2 write deadline's own (wall) clock.
	beat := time.NewTicker(250 * time.Millisecond)
	defer beat.Stop()
	for range 12 {
		<-beat.C
		rs.send(map[string]any{"type": "heartbeat", "clock": time.Now().UnixMilli()})
	}
	select {
	case err := <-rs.ended:
		t.Fatalf("the stream ended: %v", err)
	default:
	}
	if s := ae.state(); s.connectivity != "connected" || s.epoch != 1 {
		t.Fatalf("node %+v, want connected in epoch 1", s)
	}
}

// commands.cancel of a command the agent is running stops it: exec's
// process is killed and the result says so.
func TestAgentSessionCancelsARunningCommand(t *testing.T) {
	ae := newAgentEnv(t, time.Minute, "")
	ctx := context.Background()
	stateDir := t.TempDir()
	marker := filepath.Join(t.TempDir(), "started")
	ae.run(session.Options{StateDir: stateDir,
		Executor: &commands.Executor{StateDir: stateDir, CDIDir: t.TempDir(), Simulate: true}})
	var c store.NodeCommand
	args, _ := json.Marshal(map[string]any{"argv": []string{"/bin/sh", "-c", "touch " + marker + "; sleep 60"}})
	if err := ae.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		c, err = store.QueueNodeCommand(ctx, tx, store.NodeCommand{NodeID: ae.node.ID, TenantID: ae.node.TenantID,
			Kind: store.CommandExec, Args: args, CreatedBy: "test"}, "")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the command to start", func() bool {
		_, err := os.Stat(marker)
		return err == nil
	})
	if _, err := nodes.CancelCommand.Call(ctx, ae.client(ae.boot.UserToken), nodes.CommandInput{TenantID: "acme", NodeID: ae.node.ID, CommandID: c.ID}); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyNil(t, 20*time.Second, func() error {
		got, err := nodes.GetCommand.Call(ctx, ae.client(ae.boot.UserToken), nodes.CommandInput{TenantID: "acme", NodeID: ae.node.ID, CommandID: c.ID})
		if err != nil {
			t.Fatal(err)
		}
		if got.State != "cancelled" || !strings.Contains(got.Error, "cancelled while it ran") {
			return fmt.Errorf("command %+v, want cancelled with the agent's result", got)
		}
		return nil
	})
}
