package metal_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/inventory"
	coremetal "github.com/better-compute/better-compute/core/metal"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/metal"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/secrets"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type fixture struct {
	t     *testing.T
	s     *store.Store
	types nodes.Types
	site  string
	pool  string
}

func newFixture(t *testing.T, tenant string) *fixture {
	t.Helper()
	s := testenv.Store(t)
	cat, err := core.DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, s: s, types: nodes.TypesOf(cat)}
	f.site, f.pool = f.addPool(tenant)
	return f
}

func (f *fixture) addPool(tenant string) (string, string) {
	f.t.Helper()
	ctx := context.Background()
	site, pool := core.NewID("site"), core.NewID("pool")
	if _, err := f.s.Pool.Exec(ctx, `INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by)
		VALUES ($1, $2, $1, 'eu', 'eu-west', 'custom', 'idn_x')`, site, tenant); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.s.Pool.Exec(ctx, `INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, created_by)
		VALUES ($1, $2, $3, $1, 'metal-host', 'H100', 80, 'bcd', 'idn_x')`, pool, tenant, site); err != nil {
		f.t.Fatal(err)
	}
	return site, pool
}

func (f *fixture) tx(fn func(ctx context.Context, tx store.Tx) error) error {
	ctx := context.Background()
	return f.s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return fn(ctx, tx) })
}

func (f *fixture) enroll(name, address string) metal.Node {
	f.t.Helper()
	var n metal.Node
	err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		n, err = metal.Enroll(ctx, tx, f.types, metal.Enrollment{TenantID: "acme", PoolID: f.pool, Name: name,
			BMC: metal.BMC{Redfish: &metal.RedfishEndpoint{Address: address, Username: "admin",
				PasswordSecret: "secret://acme/bmc-" + name}},
			RootTenant: "root", By: "idn_alice"})
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

func (f *fixture) begin(nodeID string, op coremetal.Operation) (metal.Node, error) {
	var n metal.Node
	err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		n, err = metal.BeginOperation(ctx, tx, f.types, metal.Begin{TenantID: "acme", NodeID: nodeID, Operation: op, By: "idn_alice"})
		return err
	})
	return n, err
}

func (f *fixture) finish(nodeID string, opSeq int64, fin metal.Finish) error {
	fin.NodeID, fin.OpSeq = nodeID, opSeq
	return f.tx(func(ctx context.Context, tx store.Tx) error { return metal.FinishOperation(ctx, tx, f.types, fin) })
}

func (f *fixture) get(nodeID string) metal.Node {
	f.t.Helper()
	var n metal.Node
	if err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		n, err = metal.Get(ctx, tx, "acme", nodeID, false)
		return err
	}); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func wantCode(t *testing.T, err error, code core.Code) *core.Error {
	t.Helper()
	var e *core.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("error = %v, want %s", err, code)
	}
	return e
}

func allowedOf(t *testing.T, e *core.Error) []string {
	t.Helper()
	raw, err := json.Marshal(e.Details["allowed"])
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// sampleInventory is a real machine's inventory made unique by seed: its
// product UUID, board serial and NIC MACs.
func sampleInventory(t *testing.T, seed int) []byte {
	t.Helper()
	inv, err := inventory.Sample("cpu-only.json")
	if err != nil {
		t.Fatal(err)
	}
	inv.System.ProductUUID = fmt.Sprintf("03000200-0400-0500-0006-0007000800%02d", seed)
	inv.System.BoardSerial = fmt.Sprintf("UM23BS0021%02d", seed)
	for i := range inv.NICs {
		inv.NICs[i].MAC = fmt.Sprintf("3c:ec:ef:9a:%02x:%02x", seed, i)
		inv.NICs[i].PermanentMAC = inv.NICs[i].MAC
	}
	raw, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestEnrollThenTransitionsFollowTheTable(t *testing.T) {
	f := newFixture(t, "acme")
	n := f.enroll("m1", "https://10.0.0.1")
	l := n.Lifecycle
	if l.State != string(nodestate.Enrolling) || l.Operation != "" || l.Managed || n.Node.Role != "host" || n.Node.Trust != "tenant-owned" {
		t.Fatalf("enrolled: %+v %s %s", l, n.Node.Role, n.Node.Trust)
	}
	if n.BMC.Redfish == nil || n.BMC.Redfish.PasswordSecret != "secret://acme/bmc-m1" || n.BMC.IPMI != nil {
		t.Fatalf("bmc: %+v", n.BMC)
	}
	if !slices.Equal(l.Allowed, []string{"manage", "retire"}) {
		t.Fatalf("allowed from enrolling, unmanaged: %v", l.Allowed)
	}

	// Inspect needs a managed node: refused with the allowed list.
	_, err := f.begin(n.Node.ID, coremetal.Inspect)
	e := wantCode(t, err, core.CodeInvalidState)
	if got := allowedOf(t, e); !slices.Equal(got, []string{"manage", "retire"}) || e.Details["provisionState"] != "enrolling" {
		t.Fatalf("details: %v", e.Details)
	}

	m, err := f.begin(n.Node.ID, coremetal.Manage)
	if err != nil {
		t.Fatal(err)
	}
	if m.Lifecycle.Operation != "manage" || m.Lifecycle.OpSeq != 1 || m.Lifecycle.Step != coremetal.StepVerifyBMC ||
		m.Lifecycle.Deadline == nil || m.Lifecycle.WorkflowStarted || !slices.Equal(m.Lifecycle.Allowed, []string{"abort"}) {
		t.Fatalf("manage begun: %+v", m.Lifecycle)
	}
	// One operation at a time.
	_, err = f.begin(n.Node.ID, coremetal.Retire)
	if got := allowedOf(t, wantCode(t, err, core.CodeInvalidState)); !slices.Equal(got, []string{"abort"}) {
		t.Fatalf("allowed while in flight: %v", got)
	}
	// The start is owed until marked.
	var owed []metal.Pending
	if err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		owed, err = metal.OwedStarts(ctx, tx, -1, 10)
		return err
	}); err != nil || len(owed) != 1 || owed[0].NodeID != n.Node.ID || owed[0].OpSeq != 1 {
		t.Fatalf("owed: %v %v", owed, err)
	}
	if err := f.tx(func(ctx context.Context, tx store.Tx) error { return metal.MarkStarted(ctx, tx, n.Node.ID, 1) }); err != nil {
		t.Fatal(err)
	}
	if !f.get(n.Node.ID).Lifecycle.WorkflowStarted {
		t.Fatal("not marked started")
	}

	if err := f.finish(n.Node.ID, 1, metal.Finish{Managed: true, Power: nodestate.PowerOff}); err != nil {
		t.Fatal(err)
	}
	got := f.get(n.Node.ID)
	if got.Lifecycle.State != "enrolling" || !got.Lifecycle.Managed || got.Lifecycle.Power != "off" || got.Lifecycle.Operation != "" ||
		!slices.Equal(got.Lifecycle.Allowed, []string{"manage", "inspect", "retire", "power"}) {
		t.Fatalf("after manage: %+v", got.Lifecycle)
	}
	// Inspect moves to inspecting; its failure to failed, and recover
	// takes it back to where inspect started.
	in, err := f.begin(n.Node.ID, coremetal.Inspect)
	if err != nil || in.Lifecycle.State != "inspecting" || in.Node.ProvisionState != "inspecting" {
		t.Fatalf("inspect: %+v %v", in.Lifecycle, err)
	}
	if err := f.tx(func(ctx context.Context, tx store.Tx) error {
		return metal.FailOperation(ctx, tx, f.types, metal.Failure{NodeID: n.Node.ID, OpSeq: 2, Reason: coremetal.ReasonDeadline,
			Code: "UNAVAILABLE", Message: "no report"})
	}); err != nil {
		t.Fatal(err)
	}
	failed := f.get(n.Node.ID)
	if failed.Lifecycle.State != "failed" || failed.Lifecycle.LastError == nil || failed.Lifecycle.LastError.Operation != "inspect" ||
		failed.Lifecycle.LastError.Step != coremetal.StepInspectOOB || failed.Lifecycle.LastError.Reason != "deadline" {
		t.Fatalf("failed: %+v %+v", failed.Lifecycle, failed.Lifecycle.LastError)
	}
	rec, err := f.begin(n.Node.ID, coremetal.Recover)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.finish(n.Node.ID, rec.Lifecycle.OpSeq, metal.Finish{}); err != nil {
		t.Fatal(err)
	}
	if s := f.get(n.Node.ID).Lifecycle; s.State != "enrolling" || s.LastError != nil {
		t.Fatalf("recovered: %+v", s)
	}

	// Every state change is on the node's history.
	var events int
	if err := f.s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM node_events WHERE node_id = $1 AND type = $2`,
		n.Node.ID, nodes.EventProvisionState).Scan(&events); err != nil || events != 3 { // inspecting, failed, enrolling
		t.Fatalf("ProvisionStateChanged events: %d %v", events, err)
	}
}

func TestWritesAreFencedByOpSeq(t *testing.T) {
	f := newFixture(t, "acme")
	n := f.enroll("m1", "https://10.0.0.1")
	if _, err := f.begin(n.Node.ID, coremetal.Manage); err != nil {
		t.Fatal(err)
	}
	for _, seq := range []int64{0, 2} {
		err := f.finish(n.Node.ID, seq, metal.Finish{Managed: true})
		if !metal.IsSuperseded(err) {
			t.Fatalf("finish of op %d: %v, want superseded", seq, err)
		}
		if err := f.tx(func(ctx context.Context, tx store.Tx) error { return metal.SetStep(ctx, tx, n.Node.ID, seq, "x") }); !metal.IsSuperseded(err) {
			t.Fatalf("set step of op %d: %v", seq, err)
		}
	}
	if err := f.finish(n.Node.ID, 1, metal.Finish{Managed: true}); err != nil {
		t.Fatal(err)
	}
	// A replay of the same finish changes nothing.
	if err := f.finish(n.Node.ID, 1, metal.Finish{Managed: true}); !metal.IsSuperseded(err) {
		t.Fatalf("second finish: %v", err)
	}
	if _, err := f.tx2boot(n.Node.ID, 1); !metal.IsSuperseded(err) {
		t.Fatalf("boot of a finished op: %v", err)
	}
}

func (f *fixture) tx2boot(nodeID string, opSeq int64) (metal.Boot, error) {
	var b metal.Boot
	err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		b, err = metal.CreateBoot(ctx, tx, nodeID, opSeq, metal.PurposeInspect)
		return err
	})
	return b, err
}

func TestDuplicateBMCAddressIsConflict(t *testing.T) {
	f := newFixture(t, "acme")
	f.enroll("m1", "https://10.0.0.1")
	err := f.tx(func(ctx context.Context, tx store.Tx) error {
		_, err := metal.Enroll(ctx, tx, f.types, metal.Enrollment{TenantID: "acme", PoolID: f.pool, Name: "m2",
			BMC:        metal.BMC{Redfish: &metal.RedfishEndpoint{Address: "https://10.0.0.1", Username: "u", PasswordSecret: "secret://acme/x"}},
			RootTenant: "root", By: "idn_alice"})
		return err
	})
	if e := wantCode(t, err, core.CodeConflict); e.Details["field"] != "bmc.redfish.address" {
		t.Fatalf("details: %v", e.Details)
	}
	// The same address in another site is another machine.
	site2, pool2 := f.addPool("acme")
	_ = site2
	if err := f.tx(func(ctx context.Context, tx store.Tx) error {
		_, err := metal.Enroll(ctx, tx, f.types, metal.Enrollment{TenantID: "acme", PoolID: pool2, Name: "m3",
			BMC:        metal.BMC{Redfish: &metal.RedfishEndpoint{Address: "https://10.0.0.1", Username: "u", PasswordSecret: "secret://acme/x"}},
			RootTenant: "root", By: "idn_alice"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// inspect runs a node through manage and into inspect, with a boot that
// reported doc; it answers the boot and the inspect's op_seq.
func (f *fixture) inspect(nodeID string, doc []byte) (metal.Boot, int64) {
	f.t.Helper()
	m, err := f.begin(nodeID, coremetal.Manage)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.finish(nodeID, m.Lifecycle.OpSeq, metal.Finish{Managed: true}); err != nil {
		f.t.Fatal(err)
	}
	in, err := f.begin(nodeID, coremetal.Inspect)
	if err != nil {
		f.t.Fatal(err)
	}
	b, err := f.tx2boot(nodeID, in.Lifecycle.OpSeq)
	if err != nil {
		f.t.Fatal(err)
	}
	var tok protocol.SiteBootTokenResult
	if err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		tok, err = metal.MintBootToken(ctx, tx, f.site, b.ID)
		return err
	}); err != nil {
		f.t.Fatal(err)
	}
	if err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		_, err = metal.Report(ctx, tx, tok.Token, doc)
		return err
	}); err != nil {
		f.t.Fatal(err)
	}
	return b, in.Lifecycle.OpSeq
}

func TestInspectionOfAnotherNodesHardwareIsConflictAndMergesNothing(t *testing.T) {
	f := newFixture(t, "acme")
	a, b := f.enroll("a", "https://10.0.0.1"), f.enroll("b", "https://10.0.0.2")
	doc := sampleInventory(t, 1)
	bootA, seqA := f.inspect(a.Node.ID, doc)
	var res nodes.IngestResult
	if err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		res, err = metal.IngestInspection(ctx, tx, f.types, bootA.ID, seqA)
		return err
	}); err != nil || res.HardwareKey.Key == "" {
		t.Fatalf("ingest a: %+v %v", res.HardwareKey, err)
	}
	if !f.get(a.Node.ID).Lifecycle.Inspected {
		t.Fatal("a not inspected")
	}

	bootB, seqB := f.inspect(b.Node.ID, doc) // the same machine, enrolled twice
	err := f.tx(func(ctx context.Context, tx store.Tx) error {
		_, err := metal.IngestInspection(ctx, tx, f.types, bootB.ID, seqB)
		return err
	})
	e := wantCode(t, err, core.CodeConflict)
	if e.Details["nodeId"] != a.Node.ID || metal.ConflictingNode(err) != a.Node.ID || !strings.Contains(e.Message, a.Node.ID) {
		t.Fatalf("conflict: %v %v", e.Message, e.Details)
	}
	var snapshots, devices int
	if err := f.s.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM node_inventories WHERE node_id = $1),
		(SELECT count(*) FROM devices WHERE node_id = $1)`, b.Node.ID).Scan(&snapshots, &devices); err != nil {
		t.Fatal(err)
	}
	if snapshots != 0 || devices != 0 || f.get(b.Node.ID).Node.HardwareKey != "" || f.get(b.Node.ID).Lifecycle.Inspected {
		t.Fatalf("merged: %d snapshots, %d devices", snapshots, devices)
	}

	// A re-join compares the reported key with the node's.
	var match bool
	var want, got string
	if err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		match, want, got, err = metal.RejoinMatches(ctx, tx, bootA.ID)
		return err
	}); err != nil || !match || want != got {
		t.Fatalf("rejoin a: %v %s %s %v", match, want, got, err)
	}
	if err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		match, _, _, err = metal.RejoinMatches(ctx, tx, bootB.ID)
		return err
	}); err != nil || match {
		t.Fatalf("rejoin b (no key of its own): %v %v", match, err)
	}
}

func TestBootTokensAreMintedOnceForTheirSiteOnly(t *testing.T) {
	f := newFixture(t, "acme")
	n := f.enroll("m1", "https://10.0.0.1")
	otherSite, _ := f.addPool("acme")
	m, _ := f.begin(n.Node.ID, coremetal.Manage)
	_ = f.finish(n.Node.ID, m.Lifecycle.OpSeq, metal.Finish{Managed: true})
	in, err := f.begin(n.Node.ID, coremetal.Inspect)
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.tx2boot(n.Node.ID, in.Lifecycle.OpSeq)
	if err != nil || !strings.HasPrefix(b.ID, "boot_") || !core.ValidID("boot", b.ID) {
		t.Fatalf("boot %q: %v", b.ID, err)
	}
	// A retried step finds the same boot.
	if again, err := f.tx2boot(n.Node.ID, in.Lifecycle.OpSeq); err != nil || again.ID != b.ID {
		t.Fatalf("boot again: %s %v", again.ID, err)
	}
	mint := func(site string) (protocol.SiteBootTokenResult, error) {
		var out protocol.SiteBootTokenResult
		err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
			out, err = metal.MintBootToken(ctx, tx, site, b.ID)
			return err
		})
		return out, err
	}
	wantCode(t, func() error { _, err := mint(otherSite); return err }(), core.CodeNotFound)
	tok, err := mint(f.site)
	if err != nil || !strings.HasPrefix(tok.Token, protocol.BootTokenPrefix) || len(tok.Token) < len(protocol.BootTokenPrefix)+43 ||
		tok.NodeID != n.Node.ID || tok.Purpose != "inspect" {
		t.Fatalf("minted: %+v %v", tok, err)
	}
	wantCode(t, func() error { _, err := mint(f.site); return err }(), core.CodeConflict)
	var stored []byte
	if err := f.s.Pool.QueryRow(context.Background(), `SELECT token_hash FROM metal_boots WHERE id = $1`, b.ID).Scan(&stored); err != nil ||
		string(stored) != string(metal.HashToken(tok.Token)) {
		t.Fatalf("stored: %x %v", stored, err)
	}

	report := func(token string) (metal.Boot, error) {
		var out metal.Boot
		err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
			out, err = metal.Report(ctx, tx, token, sampleInventory(t, 3))
			return err
		})
		return out, err
	}
	wantCode(t, func() error { _, err := report(protocol.BootTokenPrefix + "nope"); return err }(), core.CodeUnauthn)
	got, err := report(tok.Token)
	if err != nil || got.ReportedAt == nil || got.HardwareKey == "" || len(got.Pending()) != 0 {
		t.Fatalf("report: %+v %v", got, err)
	}
	steps := []protocol.RamdiskStep{{Name: protocol.StepWipeDisks}, {Name: protocol.StepPowerOff}}
	if err := f.tx(func(ctx context.Context, tx store.Tx) error {
		return metal.SetBootSteps(ctx, tx, b.ID, in.Lifecycle.OpSeq, steps)
	}); err != nil {
		t.Fatal(err)
	}
	if got, _ = report(tok.Token); len(got.Pending()) != 2 || got.Pending()[0].Name != protocol.StepWipeDisks {
		t.Fatalf("pending: %+v", got.Pending())
	}
	if err := f.tx(func(ctx context.Context, tx store.Tx) error {
		_, err := metal.Results(ctx, tx, tok.Token, []protocol.RamdiskStepResult{{Name: protocol.StepWipeDisks, OK: true}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got, _ = report(tok.Token); len(got.Pending()) != 1 || got.Pending()[0].Name != protocol.StepPowerOff {
		t.Fatalf("pending after a result: %+v", got.Pending())
	}
	if err := f.tx(func(ctx context.Context, tx store.Tx) error { return metal.FinishBoot(ctx, tx, b.ID) }); err != nil {
		t.Fatal(err)
	}
	if _, err := report(tok.Token); !errors.Is(err, metal.ErrBootEnded) {
		t.Fatalf("report after the boot ended: %v", err)
	}
}

func TestDiscoveryTokenRotatesWithAGraceAndConfirmMACLinks(t *testing.T) {
	f := newFixture(t, "acme")
	rotate := func() string {
		var tok string
		if err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
			tok, err = metal.RotateDiscoveryToken(ctx, tx, f.site)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return tok
	}
	discover := func(token, mac string, doc []byte) (metal.Discovered, error) {
		var d metal.Discovered
		err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
			d, err = metal.Discover(ctx, tx, token, mac, doc)
			return err
		})
		return d, err
	}
	first := rotate()
	second := rotate()
	doc := sampleInventory(t, 7)
	mac := "3C:EC:EF:9A:07:00"
	d1, err := discover(first, mac, doc) // the previous token, within its grace
	if err != nil || d1.BootMAC != "3c:ec:ef:9a:07:00" || d1.SiteID != f.site || d1.HardwareKey == "" {
		t.Fatalf("discover: %+v %v", d1, err)
	}
	d2, err := discover(second, mac, doc)
	if err != nil || d2.ID != d1.ID {
		t.Fatalf("the same MAC again is the same row: %v %v", d2.ID, err)
	}
	rotate()
	wantCode(t, func() error { _, err := discover(first, mac, doc); return err }(), core.CodeUnauthn)
	wantCode(t, func() error { _, err := discover(protocol.DiscoveryTokenPrefix+"x", mac, doc); return err }(), core.CodeUnauthn)

	// Only the site's owner lists them; any other tenant reads NOT_FOUND.
	list := func(tenant string) ([]metal.Discovered, error) {
		var out []metal.Discovered
		err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
			out, err = metal.ListDiscovered(ctx, tx, tenant, f.site, store.PageQuery{Limit: 10})
			return err
		})
		return out, err
	}
	if got, err := list("acme"); err != nil || len(got) != 1 || got[0].ID != d1.ID || got[0].Inventory == nil {
		t.Fatalf("list: %v %v", got, err)
	}
	wantCode(t, func() error { _, err := list("globex"); return err }(), core.CodeNotFound)

	// Confirming the MAC of an uninspected node links the discovered
	// machine and ingests its inventory.
	n := f.enroll("m1", "https://10.0.0.1")
	var confirmed metal.Node
	if err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		confirmed, err = metal.ConfirmMAC(ctx, tx, f.types, "acme", n.Node.ID, mac, "idn_alice")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if confirmed.BMC.BootMAC != "3c:ec:ef:9a:07:00" || confirmed.BMC.BootMACConfirmedAt == nil || confirmed.Node.HardwareKey != d1.HardwareKey {
		t.Fatalf("confirmed: %+v key %q", confirmed.BMC, confirmed.Node.HardwareKey)
	}
	if got, _ := list("acme"); got[0].NodeID != n.Node.ID {
		t.Fatalf("not linked: %+v", got[0])
	}
}

func TestConfirmMACOfAnInspectedNodeMustBeOneOfItsNICs(t *testing.T) {
	f := newFixture(t, "acme")
	n := f.enroll("m1", "https://10.0.0.1")
	boot, seq := f.inspect(n.Node.ID, sampleInventory(t, 5))
	if err := f.tx(func(ctx context.Context, tx store.Tx) error {
		_, err := metal.IngestInspection(ctx, tx, f.types, boot.ID, seq)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	confirm := func(mac string) error {
		return f.tx(func(ctx context.Context, tx store.Tx) error {
			_, err := metal.ConfirmMAC(ctx, tx, f.types, "acme", n.Node.ID, mac, "idn_alice")
			return err
		})
	}
	if e := wantCode(t, confirm("aa:bb:cc:dd:ee:ff"), core.CodeInvalidInput); e.Details["field"] != "mac" {
		t.Fatalf("details: %v", e.Details)
	}
	if err := confirm("3C-EC-EF-9A-05-01"); err != nil {
		t.Fatal(err)
	}
}

// No secret value is ever in a row: the password sealed in the vault is in
// no table's text, after an enrolment and an operation that reference it.
func TestNoSecretValueInAnyRow(t *testing.T) {
	f := newFixture(t, "acme")
	kek, err := secrets.GenerateKEK()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := secrets.ParseKeyring(kek)
	if err != nil {
		t.Fatal(err)
	}
	v := secrets.NewVault(keys, "root")
	const password = "Zq8-unforgettable-BMC-password"
	if err := f.tx(func(ctx context.Context, tx store.Tx) error {
		_, err := v.Put(ctx, tx, secrets.PutRequest{TenantID: "acme", Name: "bmc-m1", Scope: "tenant", Value: password, By: "idn_alice"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	n := f.enroll("m1", "https://10.0.0.1")
	if _, err := f.begin(n.Node.ID, coremetal.Manage); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(testenv.DumpTables(t, f.s), password) {
		t.Error("a table holds the BMC password in clear")
	}
}
