package api_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/inventory"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/store"
	nodesdomain "github.com/better-compute/better-compute/store/nodes"
)

// fixture reads a NodeInventory v1 document of core/inventory/testdata.
func fixture(t testing.TB, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile("../core/inventory/testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// schedulableNode is a node that passes every clause of the predicate.
func schedulableNode(poolID, name string) nodesdomain.NewNode {
	return nodesdomain.NewNode{PoolID: poolID, Name: name, ProvisionState: nodestate.Adopted, Role: nodestate.RoleHost,
		Connectivity: nodestate.Connected, Power: nodestate.PowerOn, ObservedGeneration: 1}
}

// node creates a node and, when doc is given, ingests it, in one transaction.
func (e *env) node(in nodesdomain.NewNode, doc []byte) nodes.Node {
	e.t.Helper()
	var n nodes.Node
	err := e.store.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) (err error) {
		if n, err = nodesdomain.Create(context.Background(), tx, nodesdomain.TypesOf(e.catalog), in); err != nil || doc == nil {
			return err
		}
		res, err := nodesdomain.Ingest(context.Background(), tx, nodesdomain.TypesOf(e.catalog), n.ID, doc)
		n = res.Node
		return err
	})
	if err != nil {
		e.t.Fatalf("node %s: %v", in.Name, err)
	}
	return n
}

func (e *env) ingest(nodeID string, doc []byte) nodesdomain.IngestResult {
	e.t.Helper()
	var res nodesdomain.IngestResult
	err := e.store.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) (err error) {
		res, err = nodesdomain.Ingest(context.Background(), tx, nodesdomain.TypesOf(e.catalog), nodeID, doc)
		return err
	})
	if err != nil {
		e.t.Fatalf("ingest into %s: %v", nodeID, err)
	}
	return res
}

// poolWith makes a pool with sharing and policy.
func (e *env) poolWith(tenant, siteID, name, model, sharing, policy string) pools.Pool {
	e.t.Helper()
	p, err := pools.Create.Call(context.Background(), e.client(e.tokenOf(tenant)), pools.CreateInput{TenantID: tenant, SiteID: siteID,
		Name: name, Class: "metal-host", GPUModel: model, GPUMemoryGb: 80, Sharing: sharing, Policy: policyOf(e.t, policy)})
	if err != nil {
		e.t.Fatalf("pools.create %s: %v", name, err)
	}
	return p
}

func (e *env) tokenOf(tenant string) string {
	if tenant == "globex" {
		return e.globex
	}
	return e.boot.UserToken
}

func expectDevices(t *testing.T, doc []byte, p inventory.PartitionPolicy) (devices, atoms int) {
	t.Helper()
	inv, err := inventory.Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	set, err := inventory.Devices(inv, p)
	if err != nil {
		t.Fatal(err)
	}
	return len(set.Devices), len(set.Atoms())
}

func conditionTypes(n nodes.Node) []string {
	var out []string
	for _, c := range n.Conditions {
		if !slices.Contains(out, c.Type) {
			out = append(out, c.Type)
		}
	}
	slices.Sort(out)
	return out
}

func TestNodesIngestAndRead(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "h100", "H100", "", `{"hardwareProfile":"8xH100"}`)
	h100 := fixture(t, "h100-8x-sxm.json")
	n := e.node(schedulableNode(p.ID, "gpu-a07"), h100)

	wantDevices, wantAtoms := expectDevices(t, h100, inventory.PartitionPolicy{})
	got, err := nodes.Get.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: n.ID})
	if err != nil || got.ID != n.ID || got.TenantID != "acme" || got.PoolID != p.ID || got.Region != "eu-central" ||
		!got.Schedulable || len(got.UnschedulableReasons) != 0 || got.GPUModel != "H100" || got.GPUCount != 8 ||
		got.Devices != wantDevices || got.Atoms != wantAtoms || !got.HardwareKeyTrusted || got.HardwareKey == "" ||
		got.ProvisionState != "adopted" || got.Role != "host" || got.Trust != "platform" || got.Adapter != "bcd/v1" ||
		got.Power != "on" || got.Connectivity != "connected" || len(got.Conditions) != 0 || len(got.NoScheduleReasons) != 0 {
		t.Fatalf("get = %+v, %v (want %d devices, %d atoms)", got, err, wantDevices, wantAtoms)
	}
	var gpuAtoms int
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM devices WHERE node_id = $1 AND class = 'gpu' AND bookable`, n.ID).Scan(&gpuAtoms); err != nil || gpuAtoms != 8 {
		t.Fatalf("%d GPU atoms, %v", gpuAtoms, err)
	}
	row, err := store.GetAuthzResource(ctx, e.store.Pool, "compute-node", n.ID)
	if err != nil || row.TenantID != "acme" || row.ParentType != "compute-pool" || row.ParentID != p.ID ||
		row.Attributes["gpuModel"] != "H100" || row.Attributes["gpuCount"] != float64(8) || row.Attributes["lifecycle"] != "adopted" ||
		row.Attributes["trust"] != "platform" || row.Attributes["region"] != "eu-central" || row.Attributes["dedicatedTo"] != "" {
		t.Fatalf("authz row = %+v, %v", row, err)
	}

	// The same hardware again appends nothing.
	if res := e.ingest(n.ID, h100); res.Appended || res.Seq != 1 {
		t.Fatalf("same document = %+v", res)
	}
	// One GPU fewer: a new snapshot, GpuCountMismatch blocks scheduling,
	// the GPU's device is removed.
	var doc map[string]any
	if err := json.Unmarshal(h100, &doc); err != nil {
		t.Fatal(err)
	}
	gpus := doc["gpus"].(map[string]any)
	devs := gpus["devices"].([]any)
	gone := devs[len(devs)-1].(map[string]any)["uuid"].(string)
	gpus["devices"] = devs[:len(devs)-1]
	seven, _ := json.Marshal(doc)
	res := e.ingest(n.ID, seven)
	if !res.Appended || res.Seq != 2 || res.Node.Schedulable || !slices.Equal(res.Node.NoScheduleReasons, []string{"GpuCountMismatch"}) ||
		!slices.Equal(res.Node.UnschedulableReasons, []string{nodestate.ReasonNoScheduleReasons}) || res.Node.GPUCount != 7 ||
		res.Node.Devices != wantDevices-1 {
		t.Fatalf("seven GPUs = %+v", res)
	}
	var removed bool
	if err := e.store.Pool.QueryRow(ctx, `SELECT removed_at IS NOT NULL FROM devices WHERE node_id = $1 AND device_id = $2`, n.ID, strings.TrimSpace(gone)).Scan(&removed); err != nil || !removed {
		t.Fatalf("vanished GPU removed = %v, %v", removed, err)
	}
	if list, err := nodes.List.Call(ctx, c, nodes.ListInput{TenantID: "acme", Schedulable: new(true)}); err != nil || len(list.Items) != 0 {
		t.Fatalf("schedulable list = %+v, %v", list, err)
	}
	// The GPU comes back: the condition clears, the device is live again.
	res = e.ingest(n.ID, h100)
	if !res.Appended || res.Seq != 3 || !res.Node.Schedulable || len(res.Node.Conditions) != 0 || res.Node.Devices != wantDevices {
		t.Fatalf("back to eight = %+v", res)
	}

	// inventory.get: the latest snapshot, or one by seq.
	snap, err := nodes.GetInventory.Call(ctx, c, nodes.InventoryInput{TenantID: "acme", NodeID: n.ID})
	if err != nil || snap.Seq != 3 || snap.Digest != res.Digest || len(snap.Hashes) != len(inventory.Sections) || !strings.HasPrefix(snap.Hashes["gpus"], "sha256:") {
		t.Fatalf("inventory.get = %+v, %v", snap, err)
	}
	if snap2, err := nodes.GetInventory.Call(ctx, c, nodes.InventoryInput{TenantID: "acme", NodeID: n.ID, Seq: new(int64(2))}); err != nil || snap2.Seq != 2 || snap2.Hashes["gpus"] == snap.Hashes["gpus"] {
		t.Fatalf("inventory.get seq 2 = %+v, %v", snap2, err)
	}
	if _, err := nodes.GetInventory.Call(ctx, c, nodes.InventoryInput{TenantID: "acme", NodeID: n.ID, Seq: new(int64(9))}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("inventory.get seq 9 = %v, want NOT_FOUND", err)
	}
	// inventory.history: newest first, limited, paged by cursor.
	h, err := nodes.GetInventoryHistory.Call(ctx, c, nodes.InventoryHistoryInput{TenantID: "acme", NodeID: n.ID})
	if err != nil || len(h.Items) != 3 || h.Items[0].Seq != 3 || h.Items[2].Seq != 1 || h.Items[0].Digest != h.Items[2].Digest {
		t.Fatalf("history = %+v, %v", h, err)
	}
	if h, err := nodes.GetInventoryHistory.Call(ctx, c, nodes.InventoryHistoryInput{TenantID: "acme", NodeID: n.ID, ListInput: rpc.ListInput{Limit: 1, Cursor: store.EncodeCursor(store.Key{Seq: 3})}}); err != nil || len(h.Items) != 1 || h.Items[0].Seq != 2 {
		t.Fatalf("history page = %+v, %v", h, err)
	}
	// inventory.diff: the last two by default, or any two.
	d, err := nodes.DiffInventory.Call(ctx, c, nodes.InventoryDiffInput{TenantID: "acme", NodeID: n.ID})
	if err != nil || d.FromSeq != 2 || d.ToSeq != 3 || !slices.Equal(d.Changed, []string{"gpus"}) || len(d.Sections) != 1 {
		t.Fatalf("diff = %+v, %v", d, err)
	}
	if d, err := nodes.DiffInventory.Call(ctx, c, nodes.InventoryDiffInput{TenantID: "acme", NodeID: n.ID, FromSeq: new(int64(1)), ToSeq: new(int64(3))}); err != nil || !d.Empty() {
		t.Fatalf("diff 1..3 = %+v, %v", d, err)
	}
	if _, err := nodes.DiffInventory.Call(ctx, c, nodes.InventoryDiffInput{TenantID: "acme", NodeID: n.ID, FromSeq: new(int64(3)), ToSeq: new(int64(2))}); codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("diff backwards = %v, want INVALID_INPUT", err)
	}

	// Events, newest first, with a limit.
	ev, err := nodes.Events.Call(ctx, c, nodes.EventsInput{TenantID: "acme", NodeID: n.ID})
	if err != nil || len(ev.Items) < 5 || ev.Items[len(ev.Items)-1].Type != nodesdomain.EventCreated || ev.Items[0].Type != nodesdomain.EventConditionClear {
		t.Fatalf("events = %+v, %v", ev, err)
	}
	if ev, err := nodes.Events.Call(ctx, c, nodes.EventsInput{TenantID: "acme", NodeID: n.ID, ListInput: rpc.ListInput{Limit: 2}}); err != nil || len(ev.Items) != 2 {
		t.Fatalf("events limit 2 = %+v, %v", ev, err)
	}

	// Snapshots are append-only.
	if _, err := e.store.Pool.Exec(ctx, `UPDATE node_inventories SET digest = 'x' WHERE node_id = $1`, n.ID); err == nil {
		t.Fatal("UPDATE of node_inventories succeeded")
	}
	if _, err := e.store.Pool.Exec(ctx, `DELETE FROM node_inventories WHERE node_id = $1`, n.ID); err == nil {
		t.Fatal("DELETE of node_inventories succeeded")
	}
	// A node with no inventory yet.
	bare := e.node(schedulableNode(p.ID, "bare"), nil)
	if _, err := nodes.GetInventory.Call(ctx, c, nodes.InventoryInput{TenantID: "acme", NodeID: bare.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("inventory.get without inventory = %v, want NOT_FOUND", err)
	}
	if _, err := nodes.DiffInventory.Call(ctx, c, nodes.InventoryDiffInput{TenantID: "acme", NodeID: bare.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("inventory.diff without inventory = %v, want NOT_FOUND", err)
	}
	// A bad document is INVALID_INPUT and changes nothing.
	err = e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		_, err := nodesdomain.Ingest(ctx, tx, nodesdomain.TypesOf(e.catalog), bare.ID, []byte(`{"kind":"NodeInventory","version":2}`))
		return err
	})
	if codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("bad document = %v, want INVALID_INPUT", err)
	}
}

// Each fixture under its pool's partition policy.
func TestNodesPartitionPolicies(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	a100 := fixture(t, "a100-4x-pcie-mig.json")
	h200 := fixture(t, "h200-8x.json")
	cpu := fixture(t, "cpu-only.json")

	// MIG, the layout the node reports: 4 MIG atoms per GPU, no condition.
	mig := e.poolWith("acme", s.ID, "a100-mig", "A100", "mig", `{"migLayout":"3g.20gb,2g.10gb,2x1g.5gb"}`)
	n := e.node(schedulableNode(mig.ID, "a100"), a100)
	var migAtoms int
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM devices WHERE node_id = $1 AND class = 'gpu.mig' AND bookable`, n.ID).Scan(&migAtoms); err != nil || migAtoms != 16 {
		t.Fatalf("%d MIG atoms, %v", migAtoms, err)
	}
	if !n.Schedulable || len(n.Conditions) != 0 || n.GPUModel != "A100" || n.GPUCount != 4 {
		t.Fatalf("a100 node = %+v", n)
	}
	// Another layout: MigLayoutMismatch on every GPU, unschedulable.
	mis := e.poolWith("acme", s.ID, "a100-all", "A100", "mig", `{"migLayout":"all-1g.5gb"}`)
	n = e.node(schedulableNode(mis.ID, "a100-b"), a100)
	if n.Schedulable || !slices.Equal(conditionTypes(n), []string{"MigLayoutMismatch"}) || len(n.Conditions) != 4 ||
		!slices.Equal(n.NoScheduleReasons, []string{"MigLayoutMismatch"}) {
		t.Fatalf("mismatched layout = %+v", n)
	}
	// An unknown profile: MigLayoutInvalid.
	bad := e.poolWith("acme", s.ID, "a100-bad", "A100", "mig", `{"migLayout":"9g.99gb"}`)
	if n := e.node(schedulableNode(bad.ID, "a100-c"), a100); !slices.Equal(conditionTypes(n), []string{"MigLayoutInvalid"}) {
		t.Fatalf("invalid layout = %+v", n)
	}
	// Timeslice with 4 replicas: 4 slots per GPU.
	ts := e.poolWith("acme", s.ID, "h200-ts", "H200", "timeslice", `{"sharing":{"replicas":4}}`)
	n = e.node(schedulableNode(ts.ID, "h200"), h200)
	wantDevices, wantAtoms := expectDevices(t, h200, inventory.PartitionPolicy{Sharing: "timeslice", Replicas: 4})
	if n.Devices != wantDevices || n.Atoms != wantAtoms || n.GPUModel != "H200" || !n.Schedulable {
		t.Fatalf("timeslice node = %+v (want %d/%d)", n, wantDevices, wantAtoms)
	}
	var slots int
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM devices WHERE node_id = $1 AND class = 'gpu.slot'`, n.ID).Scan(&slots); err != nil || slots != 32 {
		t.Fatalf("%d slots, %v", slots, err)
	}
	// A hardware profile the node does not match: model and count.
	h100 := e.poolWith("acme", s.ID, "h100-prof", "H100", "", `{"hardwareProfile":"4xH100"}`)
	n = e.node(schedulableNode(h100.ID, "h200-in-h100"), h200)
	if !slices.Equal(conditionTypes(n), []string{"GpuCountMismatch", "GpuModelMismatch"}) ||
		!slices.Equal(n.NoScheduleReasons, []string{"GpuCountMismatch", "GpuModelMismatch"}) {
		t.Fatalf("profile mismatch = %+v", n)
	}
	// CPU only: no GPU, still a node atom (and 0 GPUs is not the profile's 4).
	n = e.node(schedulableNode(h100.ID, "cpu"), cpu)
	wantDevices, wantAtoms = expectDevices(t, cpu, inventory.PartitionPolicy{})
	if n.GPUCount != 0 || n.GPUModel != "" || n.Devices != wantDevices || n.Atoms != wantAtoms || n.Atoms < 1 {
		t.Fatalf("cpu node = %+v", n)
	}
	// The same hardware in two nodes: device ids are per node.
	if n := e.node(schedulableNode(ts.ID, "h200-twin"), h200); n.Devices != wantDevicesOf(t, h200, ts) {
		t.Fatalf("twin = %+v", n)
	}
	// The list's filters.
	all, err := nodes.List.Call(ctx, c, nodes.ListInput{TenantID: "acme"})
	if err != nil || len(all.Items) != 7 {
		t.Fatalf("list = %d items, %v", len(all.Items), err)
	}
	if l, err := nodes.List.Call(ctx, c, nodes.ListInput{TenantID: "acme", PoolID: ts.ID}); err != nil || len(l.Items) != 2 {
		t.Fatalf("list by pool = %+v, %v", l, err)
	}
	if l, err := nodes.List.Call(ctx, c, nodes.ListInput{TenantID: "acme", Schedulable: new(true)}); err != nil || len(l.Items) != 3 {
		t.Fatalf("schedulable list = %d, %v", len(l.Items), err)
	}
	if l, err := nodes.List.Call(ctx, c, nodes.ListInput{TenantID: "acme", Schedulable: new(false)}); err != nil || len(l.Items) != 4 {
		t.Fatalf("unschedulable list = %d, %v", len(l.Items), err)
	}
	e.node(nodesdomain.NewNode{PoolID: ts.ID, Name: "new"}, nil)
	if l, err := nodes.List.Call(ctx, c, nodes.ListInput{TenantID: "acme", ProvisionState: "adopting"}); err != nil || len(l.Items) != 1 || l.Items[0].Name != "new" ||
		!slices.Equal(l.Items[0].UnschedulableReasons, []string{nodestate.ReasonProvisionState, nodestate.ReasonRole, nodestate.ReasonConnectivity, nodestate.ReasonObservedGeneration}) {
		t.Fatalf("adopting list = %+v, %v", l, err)
	}
	if l, err := nodes.List.Call(ctx, c, nodes.ListInput{TenantID: "acme", Connectivity: "disconnected"}); err != nil || len(l.Items) != 1 {
		t.Fatalf("disconnected list = %+v, %v", l, err)
	}
}

func wantDevicesOf(t *testing.T, doc []byte, p pools.Pool) int {
	n, _ := expectDevices(t, doc, inventory.PartitionPolicy{Sharing: p.Sharing, Replicas: p.Policy.Sharing.Replicas})
	return n
}

func TestNodesCordonLabelTaintDelete(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.pool(e.boot.UserToken, "acme", s.ID, "h100")
	n := e.node(schedulableNode(p.ID, "gpu-1"), fixture(t, "h100-8x-sxm.json"))
	events := func() []string {
		ev, err := nodes.Events.Call(ctx, c, nodes.EventsInput{TenantID: "acme", NodeID: n.ID, ListInput: rpc.ListInput{Limit: 500}})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, x := range ev.Items {
			out = append(out, x.Type)
		}
		return out
	}
	before := len(events())

	// Delete needs a cordon first.
	if _, err := nodes.Delete.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: n.ID}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("delete uncordoned = %v, want INVALID_STATE", err)
	}
	got, err := nodes.Cordon.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: n.ID})
	if err != nil || !got.Cordoned || got.Schedulable || !slices.Equal(got.UnschedulableReasons, []string{nodestate.ReasonCordoned}) {
		t.Fatalf("cordon = %+v, %v", got, err)
	}
	if again, err := nodes.Cordon.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: n.ID}); err != nil || !again.Cordoned || again.Generation != got.Generation {
		t.Fatalf("second cordon = %+v, %v", again, err)
	}
	if ev := events(); len(ev) != before+1 || ev[0] != nodesdomain.EventCordoned {
		t.Fatalf("events after two cordons = %v", ev)
	}
	if got, err := nodes.Uncordon.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: n.ID}); err != nil || got.Cordoned || !got.Schedulable {
		t.Fatalf("uncordon = %+v, %v", got, err)
	}
	if _, err := nodes.Uncordon.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: n.ID}); err != nil {
		t.Fatal(err)
	}
	if ev := events(); len(ev) != before+2 || ev[0] != nodesdomain.EventUncordoned {
		t.Fatalf("events after uncordons = %v", ev)
	}

	// Labels.
	got, err = nodes.Label.Call(ctx, c, nodes.LabelInput{TenantID: "acme", NodeID: n.ID,
		Set: map[string]string{"example.com/rack": "r12", "tier": "gold", "empty": ""}})
	if err != nil || got.Labels["example.com/rack"] != "r12" || got.Labels["tier"] != "gold" || len(got.Labels) != 3 {
		t.Fatalf("label = %+v, %v", got, err)
	}
	got, err = nodes.Label.Call(ctx, c, nodes.LabelInput{TenantID: "acme", NodeID: n.ID, Set: map[string]string{"tier": "silver"}, Remove: []string{"empty"}})
	if err != nil || got.Labels["tier"] != "silver" || len(got.Labels) != 2 {
		t.Fatalf("relabel = %+v, %v", got, err)
	}
	for _, bad := range []nodes.LabelInput{
		{Set: map[string]string{"-bad": "x"}},
		{Set: map[string]string{"Example.com/x": "y"}},
		{Set: map[string]string{"a/b/c": "y"}},
		{Set: map[string]string{strings.Repeat("a", 64): "y"}},
		{Set: map[string]string{"ok": "bad value"}},
		{Set: map[string]string{"ok": strings.Repeat("v", 64)}},
		{Remove: []string{"/x"}},
		{Set: map[string]string{"k": "v"}, Remove: []string{"k"}},
		{},
	} {
		bad.TenantID, bad.NodeID = "acme", n.ID
		if _, err := nodes.Label.Call(ctx, c, bad); codeOf(err) != core.CodeInvalidInput {
			t.Errorf("label %+v = %v, want INVALID_INPUT", bad, err)
		}
	}

	// Taints: one per key and effect; removal by key, or key and effect.
	got, err = nodes.Taint.Call(ctx, c, nodes.TaintInput{TenantID: "acme", NodeID: n.ID, Add: []nodes.NodeTaint{
		{Key: "gpu", Value: "faulty", Effect: "NoSchedule"}, {Key: "gpu", Effect: "NoExecute"}, {Key: "example.com/drain", Effect: "PreferNoSchedule"}}})
	if err != nil || len(got.Taints) != 3 {
		t.Fatalf("taint = %+v, %v", got, err)
	}
	got, err = nodes.Taint.Call(ctx, c, nodes.TaintInput{TenantID: "acme", NodeID: n.ID,
		Add: []nodes.NodeTaint{{Key: "gpu", Value: "ok", Effect: "NoSchedule"}}, Remove: []nodes.TaintRef{{Key: "gpu", Effect: "NoExecute"}}})
	if err != nil || len(got.Taints) != 2 || got.Taints[0] != (nodes.NodeTaint{Key: "gpu", Value: "ok", Effect: "NoSchedule"}) {
		t.Fatalf("retaint = %+v, %v", got, err)
	}
	if got, err = nodes.Taint.Call(ctx, c, nodes.TaintInput{TenantID: "acme", NodeID: n.ID, Remove: []nodes.TaintRef{{Key: "gpu"}, {Key: "example.com/drain"}}}); err != nil || len(got.Taints) != 0 {
		t.Fatalf("untaint = %+v, %v", got, err)
	}
	for _, bad := range []nodes.TaintInput{
		{Add: []nodes.NodeTaint{{Key: "gpu", Effect: "Sometimes"}}},
		{Add: []nodes.NodeTaint{{Key: "", Effect: "NoSchedule"}}},
		{Add: []nodes.NodeTaint{{Key: "gpu", Value: "a b", Effect: "NoSchedule"}}},
		{Remove: []nodes.TaintRef{{Key: "gpu", Effect: "Never"}}},
		{},
	} {
		bad.TenantID, bad.NodeID = "acme", n.ID
		if _, err := nodes.Taint.Call(ctx, c, bad); codeOf(err) != core.CodeInvalidInput {
			t.Errorf("taint %+v = %v, want INVALID_INPUT", bad, err)
		}
	}
	ev := events()
	if !slices.Contains(ev, nodesdomain.EventLabelsChanged) || !slices.Contains(ev, nodesdomain.EventTaintsChanged) {
		t.Fatalf("events = %v", ev)
	}

	// Delete: cordoned, then gone from reads and lists; the name is free.
	if _, err := nodes.Cordon.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: n.ID}); err != nil {
		t.Fatal(err)
	}
	del, err := nodes.Delete.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: n.ID})
	if err != nil || del.DeletedAt == nil || del.Atoms != 0 {
		t.Fatalf("delete = %+v, %v", del, err)
	}
	if _, err := nodes.Get.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: n.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("get after delete = %v, want NOT_FOUND", err)
	}
	if _, err := nodes.Delete.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: n.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("second delete = %v, want NOT_FOUND", err)
	}
	if l, err := nodes.List.Call(ctx, c, nodes.ListInput{TenantID: "acme"}); err != nil || len(l.Items) != 0 {
		t.Fatalf("list after delete = %+v, %v", l, err)
	}
	var live int
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM devices WHERE node_id = $1 AND removed_at IS NULL`, n.ID).Scan(&live); err != nil || live != 0 {
		t.Fatalf("%d live devices after delete, %v", live, err)
	}
	e.node(schedulableNode(p.ID, "gpu-1"), nil)
}

func TestNodesInvalidInput(t *testing.T) {
	e := newEnv(t)
	id := core.NewID("node")
	for _, m := range []string{"nodes.get", "nodes.events", "nodes.cordon", "nodes.uncordon", "nodes.label", "nodes.taint",
		"nodes.delete", "inventory.get", "inventory.history", "inventory.diff"} {
		e.wantInvalid(e.boot.UserToken, m, map[string]string{
			`{"tenantId":"acme"}`:                   "nodeId",
			`{"tenantId":"acme","nodeId":"pool_x"}`: "nodeId",
		})
		if status, body := e.call(e.boot.UserToken, m, `{"tenantId":"acme","nodeId":"`+id+`","bogus":1}`); status != 400 {
			t.Errorf("%s with an unknown field = %d %s", m, status, body)
		}
	}
	e.wantInvalid(e.boot.UserToken, "nodes.list", map[string]string{
		`{"tenantId":"acme","provisionState":"booting"}`: "provisionState",
		`{"tenantId":"acme","connectivity":"maybe"}`:     "connectivity",
		`{"tenantId":"acme","schedulable":"yes"}`:        "schedulable",
		`{"tenantId":"acme","poolId":"node_x"}`:          "poolId",
	})
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.pool(e.boot.UserToken, "acme", s.ID, "h100")
	n := e.node(schedulableNode(p.ID, "gpu-1"), fixture(t, "h100-8x-sxm.json"))
	e.wantInvalid(e.boot.UserToken, "nodes.events", map[string]string{
		`{"tenantId":"acme","nodeId":"` + n.ID + `","limit":0}`:   "limit",
		`{"tenantId":"acme","nodeId":"` + n.ID + `","limit":501}`: "limit",
	})
	e.wantInvalid(e.boot.UserToken, "inventory.history", map[string]string{
		`{"tenantId":"acme","nodeId":"` + n.ID + `","limit":1000}`:  "limit",
		`{"tenantId":"acme","nodeId":"` + n.ID + `","beforeSeq":2}`: "beforeSeq", // paged by cursor now
		`{"tenantId":"acme","nodeId":"` + n.ID + `","cursor":"x"}`:  "cursor",
	})
	e.wantInvalid(e.boot.UserToken, "inventory.get", map[string]string{`{"tenantId":"acme","nodeId":"` + n.ID + `","seq":-1}`: "seq"})
	e.wantInvalid(e.boot.UserToken, "inventory.diff", map[string]string{
		`{"tenantId":"acme","nodeId":"` + n.ID + `","fromSeq":2,"toSeq":1}`: "fromSeq",
		`{"tenantId":"acme","nodeId":"` + n.ID + `","toSeq":0}`:             "toSeq",
	})
	e.wantInvalid(e.boot.UserToken, "nodes.label", map[string]string{
		`{"tenantId":"acme","nodeId":"` + n.ID + `","set":{"a b":"c"}}`: "set",
		`{"tenantId":"acme","nodeId":"` + n.ID + `","remove":"x"}`:      "remove",
	})
	e.wantInvalid(e.boot.UserToken, "nodes.taint", map[string]string{
		`{"tenantId":"acme","nodeId":"` + n.ID + `","add":[{"key":"k","effect":"Maybe"}]}`: "add",
	})
	// One snapshot: no diff yet.
	if _, err := nodes.DiffInventory.Call(context.Background(), e.client(e.boot.UserToken), nodes.InventoryDiffInput{TenantID: "acme", NodeID: n.ID}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("diff of one snapshot = %v, want INVALID_STATE", err)
	}
}

// Another tenant's node is NOT_FOUND in the caller's own tenant, and a call
// into another tenant is ACCESS_DENIED; a missing id is NOT_FOUND.
func TestNodesAcrossTenants(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, g := e.client(e.boot.UserToken), e.client(e.globex)
	gs := e.site(e.globex, "globex", "nyc-1", "custom")
	gp := e.poolWith("globex", gs.ID, "gp", "H100", "", `{}`)
	gn := e.node(schedulableNode(gp.ID, "g-1"), fixture(t, "h100-8x-sxm.json"))
	e.ingest(gn.ID, fixture(t, "h200-8x.json"))
	if got, err := nodes.Get.Call(ctx, g, nodes.NodeInput{TenantID: "globex", NodeID: gn.ID}); err != nil || got.ID != gn.ID {
		t.Fatalf("globex get = %+v, %v", got, err)
	}
	calls := map[string]func(tenant, id string) error{
		"get": func(tn, id string) error {
			_, err := nodes.Get.Call(ctx, a, nodes.NodeInput{TenantID: tn, NodeID: id})
			return err
		},
		"events": func(tn, id string) error {
			_, err := nodes.Events.Call(ctx, a, nodes.EventsInput{TenantID: tn, NodeID: id})
			return err
		},
		"cordon": func(tn, id string) error {
			_, err := nodes.Cordon.Call(ctx, a, nodes.NodeInput{TenantID: tn, NodeID: id})
			return err
		},
		"uncordon": func(tn, id string) error {
			_, err := nodes.Uncordon.Call(ctx, a, nodes.NodeInput{TenantID: tn, NodeID: id})
			return err
		},
		"label": func(tn, id string) error {
			_, err := nodes.Label.Call(ctx, a, nodes.LabelInput{TenantID: tn, NodeID: id, Set: map[string]string{"k": "v"}})
			return err
		},
		"taint": func(tn, id string) error {
			_, err := nodes.Taint.Call(ctx, a, nodes.TaintInput{TenantID: tn, NodeID: id, Add: []nodes.NodeTaint{{Key: "k", Effect: "NoSchedule"}}})
			return err
		},
		"delete": func(tn, id string) error {
			_, err := nodes.Delete.Call(ctx, a, nodes.NodeInput{TenantID: tn, NodeID: id})
			return err
		},
		"inv.get": func(tn, id string) error {
			_, err := nodes.GetInventory.Call(ctx, a, nodes.InventoryInput{TenantID: tn, NodeID: id})
			return err
		},
		"inv.history": func(tn, id string) error {
			_, err := nodes.GetInventoryHistory.Call(ctx, a, nodes.InventoryHistoryInput{TenantID: tn, NodeID: id})
			return err
		},
		"inv.diff": func(tn, id string) error {
			_, err := nodes.DiffInventory.Call(ctx, a, nodes.InventoryDiffInput{TenantID: tn, NodeID: id})
			return err
		},
	}
	missing := core.NewID("node")
	for name, call := range calls {
		if err := call("acme", gn.ID); codeOf(err) != core.CodeNotFound {
			t.Errorf("%s of globex's node in acme = %v, want NOT_FOUND", name, err)
		}
		if err := call("acme", missing); codeOf(err) != core.CodeNotFound {
			t.Errorf("%s of a missing node = %v, want NOT_FOUND", name, err)
		}
		if err := call("globex", gn.ID); codeOf(err) != core.CodeAccessDenied {
			t.Errorf("%s into globex = %v, want ACCESS_DENIED", name, err)
		}
	}
	if l, err := nodes.List.Call(ctx, a, nodes.ListInput{TenantID: "acme"}); err != nil || len(l.Items) != 0 {
		t.Fatalf("acme list = %+v, %v", l, err)
	}
	if _, err := nodes.List.Call(ctx, a, nodes.ListInput{TenantID: "globex"}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("acme lists globex = %v, want ACCESS_DENIED", err)
	}
	if l, err := nodes.List.Call(ctx, g, nodes.ListInput{TenantID: "globex"}); err != nil || len(l.Items) != 1 || l.Items[0].GPUModel != "H200" {
		t.Fatalf("globex list = %+v, %v", l, err)
	}
	// A person of acme with no policy sees nothing and changes nothing.
	an := e.node(schedulableNode(e.pool(e.boot.UserToken, "acme", e.site(e.boot.UserToken, "acme", "fra-1", "custom").ID, "ap").ID, "a-1"), nil)
	st := e.client(e.stranger)
	if _, err := nodes.Get.Call(ctx, st, nodes.NodeInput{TenantID: "acme", NodeID: an.ID}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("stranger get = %v, want ACCESS_DENIED", err)
	}
	if _, err := nodes.Cordon.Call(ctx, st, nodes.NodeInput{TenantID: "acme", NodeID: an.ID}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("stranger cordon = %v, want ACCESS_DENIED", err)
	}
}
