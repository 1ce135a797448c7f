package lifecycle

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	activities "github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/inventory"
	coremetal "github.com/better-compute/better-compute/core/metal"
	"github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/metal"
	nodestore "github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/workflows/metal"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The lifecycle over the real store (store/metal through DBStore) and a
// real Temporal, with a simulated site whose ramdisk reports through the
// same store functions the agent gateway calls: enroll → manage → inspect
// → provide → deploy → undeploy → retire, and an owed start the
// reconciler makes.
func TestLifecycleOverPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st := testenv.Store(t)
	catalog, err := core.DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	types := nodestore.TypesOf(catalog)
	const tenant = "ten_metal"
	siteID, poolID := core.NewID("site"), core.NewID("pool")
	if _, err := st.Pool.Exec(ctx, `INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by)
		VALUES ($1, $2, $1, 'eu', 'eu-west', 'custom', 'idn_x')`, siteID, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool.Exec(ctx, `INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, created_by)
		VALUES ($1, $2, $3, $1, 'metal-host', 'H100', 80, 'bcd', 'idn_x')`, poolID, tenant, siteID); err != nil {
		t.Fatal(err)
	}
	var node domain.Node
	if err := st.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		node, err = domain.Enroll(ctx, tx, types, domain.Enrollment{TenantID: tenant, PoolID: poolID, Name: "m1",
			BMC: domain.BMC{Redfish: &domain.RedfishEndpoint{Address: "https://10.0.0.9", Username: "admin",
				PasswordSecret: "secret://" + tenant + "/bmc"}}, By: "idn_x"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	nodeID := node.Node.ID
	sample, err := inventory.Sample("cpu-only.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := json.Marshal(sample.Copy(7))
	if err != nil {
		t.Fatal(err)
	}

	w := startWorldOn(t, ctx, siteID, activities.NewDBStore(st, catalog), newFakeSite(newFakeStore()))
	// The deploy's provisioning steps run over a fake ProvisionStore (the
	// workflow's own tests run them in full); the lifecycle around them is
	// PostgreSQL's.
	prov := newFakeStore()
	w.a.Provision = prov
	// The ramdisk: the site mints the boot's token, the machine reports
	// its inventory with it and posts the results of its steps.
	var silent atomic.Bool // the machine boots but its ramdisk never reports
	w.site.onBoot = func(ctx context.Context, r metal.BootRequest) error {
		if silent.Load() {
			return nil
		}
		return st.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			tok, err := domain.MintBootToken(ctx, tx, siteID, r.BootID)
			if err != nil {
				return err
			}
			b, err := domain.Report(ctx, tx, tok.Token, doc)
			if err != nil {
				return err
			}
			var results []protocol.RamdiskStepResult
			for _, s := range b.Steps {
				if s.Name == protocol.StepWipeDisks {
					results = append(results, protocol.RamdiskStepResult{Name: s.Name, OK: true, DurationMs: 40})
				}
			}
			if len(results) == 0 {
				return nil
			}
			_, err = domain.Results(ctx, tx, tok.Token, results)
			return err
		})
	}
	begin := func(op coremetal.Operation) activities.MetalParams {
		t.Helper()
		var n domain.Node
		if err := st.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
			n, err = domain.BeginOperation(ctx, tx, types, domain.Begin{TenantID: tenant, NodeID: nodeID, Operation: op, By: "idn_x"})
			return err
		}); err != nil {
			t.Fatalf("begin %s: %v", op, err)
		}
		return activities.MetalParams{TenantID: tenant, NodeID: nodeID, OpSeq: n.Lifecycle.OpSeq}
	}
	load := func() activities.Lifecycle {
		t.Helper()
		lc, err := w.a.Store.Load(ctx, tenant, nodeID)
		if err != nil {
			t.Fatal(err)
		}
		return lc
	}
	for _, step := range []struct {
		op   coremetal.Operation
		want nodes.ProvisionState
	}{
		{coremetal.Manage, nodes.Enrolling}, {coremetal.Inspect, nodes.Enrolling}, {coremetal.Provide, nodes.Ready},
		{coremetal.Deploy, nodes.Deployed}, {coremetal.Undeploy, nodes.Ready},
	} {
		began := time.Now()
		p := begin(step.op)
		if step.op == coremetal.Deploy {
			// The provisioning workflow metal.deploy would have made:
			// store/workflows persists it; here the fake holds it.
			prov.mu.Lock()
			prov.newWorkflow(nodeID, tenant, p.OpSeq, []provisioning.Step{
				{Name: "check-image", On: provisioning.RunnerControlPlane, Action: provisioning.ActionCheckImage},
				{Name: "settle", On: provisioning.RunnerControlPlane, Action: provisioning.ActionSleep, Args: map[string]any{"seconds": 1}}})
			prov.mu.Unlock()
		}
		if err := activities.StartLifecycle(ctx, w.c, controlPlaneQueue, p); err != nil {
			t.Fatal(err)
		}
		var res activities.LifecycleResult
		if err := w.c.GetWorkflow(ctx, activities.MetalWorkflowID(nodeID), "").Get(ctx, &res); err != nil {
			t.Fatalf("%s: %v", step.op, err)
		}
		lc := load()
		if res.Outcome != activities.OutcomeFinished || lc.State != step.want || lc.Operation != "" {
			t.Fatalf("%s: result %+v, node %s op %q last error %+v", step.op, res, lc.State, lc.Operation, lc.LastError)
		}
		t.Logf("%-8s over PostgreSQL: %v", step.op, time.Since(began).Round(time.Millisecond))
	}
	if lc := load(); !lc.Managed || !lc.Inspected || lc.HardwareKey == "" || lc.OpenBoot != "" {
		t.Fatalf("after the lifecycle: %+v", lc)
	}
	// An abort through the API's helper, while inspect waits for a ramdisk
	// that never reports: the node fails (aborted), the machine is off, and
	// recover takes it back to ready.
	silent.Store(true)
	p := begin(coremetal.Inspect)
	if err := activities.StartLifecycle(ctx, w.c, controlPlaneQueue, p); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "inspect awaits the ramdisk", func() bool { return load().Step == coremetal.StepAwaitRamdisk })
	offs := w.site.count("EndBoot off")
	if lost, err := activities.AbortLifecycle(ctx, w.c, nodeID, "idn_x"); lost || err != nil {
		t.Fatalf("abort: lost %v, %v", lost, err)
	}
	if lc := load(); lc.State != nodes.Failed || lc.LastError == nil || lc.LastError.Reason != coremetal.ReasonAborted ||
		lc.LastError.Step != coremetal.StepAwaitRamdisk || lc.Power != nodes.PowerOff || w.site.count("EndBoot off") != offs+1 {
		t.Fatalf("after abort: %s power %s last error %+v", lc.State, lc.Power, lc.LastError)
	}
	silent.Store(false)
	p = begin(coremetal.Recover)
	if err := activities.StartLifecycle(ctx, w.c, controlPlaneQueue, p); err != nil {
		t.Fatal(err)
	}
	if err := w.c.GetWorkflow(ctx, activities.MetalWorkflowID(nodeID), "").Get(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if lc := load(); lc.State != nodes.Ready || lc.OpenBoot != "" {
		t.Fatalf("after recover: %s, open boot %q", lc.State, lc.OpenBoot)
	}

	// retire's start is lost after the API's commit: the reconciler makes it.
	begin(coremetal.Retire)
	w.a.OwedGrace = time.Nanosecond
	if n := w.reconcile(); n != 1 {
		t.Fatalf("the reconciler acted %d times, want 1", n)
	}
	var res activities.LifecycleResult
	if err := w.c.GetWorkflow(ctx, activities.MetalWorkflowID(nodeID), "").Get(ctx, &res); err != nil {
		t.Fatal(err)
	}
	if lc := load(); res.Outcome != activities.OutcomeFinished || lc.State != nodes.Retired {
		t.Fatalf("retire: %+v, node %s", res, lc.State)
	}
}
