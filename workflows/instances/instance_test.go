package instances

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/testsuite"

	activities "github.com/better-compute/better-compute/activities/instances"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	states "github.com/better-compute/better-compute/core/instances"
	"github.com/better-compute/better-compute/core/inventory"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/instances"
	"github.com/better-compute/better-compute/store/nodes"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const tenant = "ten_wf"

// placed makes a vps-host pool with one H100 host and places one GPU
// instance on it, over the real store.
func placed(t *testing.T, st *store.Store) domain.Instance {
	t.Helper()
	ctx := context.Background()
	catalog, err := core.DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	siteID, poolID, image, flavor := core.NewID("site"), core.NewID("pool"), core.NewID("img"), core.NewID("flv")
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by) VALUES ($1, $2, $1, 'eu', 'eu-west', 'custom', 'idn_x')`,
			[]any{siteID, tenant}},
		{`INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, created_by)
			VALUES ($1, $2, $3, $1, 'vps-host', 'H100', 80, 'bcd', 'idn_x')`, []any{poolID, tenant, siteID}},
		{`INSERT INTO images (id, tenant_id, name, version, format, sha256, size_bytes, state, created_by)
			VALUES ($1, $2, 'debian', '12', 'raw', $3, 1024, 'available', 'idn_x')`, []any{image, tenant, strings.Repeat("ab", 32)}},
		{`INSERT INTO flavors (id, tenant_id, pool_id, name, vcpu, memory_mib, gpus, gpu_class, runtime)
			VALUES ($1, $2, $3, 'g', 4, 4096, 1, 'gpu', 'container')`, []any{flavor, tenant, poolID}},
	} {
		if _, err := st.Pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatalf("%s: %v", q.sql, err)
		}
	}
	sample, err := inventory.Sample("h100-8x-sxm.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, _ := json.Marshal(sample)
	types := domain.Types{Instance: catalog.FullName("instance"), Pool: catalog.FullName("pool")}
	id := core.NewID("inst")
	var in domain.Instance
	for _, step := range []func(tx store.Tx) error{
		func(tx store.Tx) error {
			n, err := nodes.Create(ctx, tx, nodes.TypesOf(catalog), nodes.NewNode{PoolID: poolID, Name: "h", ProvisionState: nodestate.Adopted,
				Role: nodestate.RoleHost, Connectivity: nodestate.Connected, Power: nodestate.PowerOn, ObservedGeneration: 1})
			if err != nil {
				return err
			}
			_, err = nodes.Ingest(ctx, tx, nodes.TypesOf(catalog), n.ID, doc)
			return err
		},
		func(tx store.Tx) error {
			_, err := domain.Draft(ctx, tx, types, tenant, id, "idn_o", domain.Request{PoolID: poolID, FlavorID: flavor, ImageID: image, Name: "w"})
			return err
		},
		func(tx store.Tx) (err error) { in, err = domain.Place(ctx, tx, tenant, id); return err },
	} {
		if err := st.InTx(ctx, store.ReadWrite, step); err != nil {
			t.Fatal(err)
		}
	}
	return in
}

// report records a node report as the agent gateway does.
func report(t *testing.T, st *store.Store, in domain.Instance, full bool, statuses ...protocol.InstanceStatus) {
	t.Helper()
	if err := st.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
		_, err := domain.Observe(context.Background(), tx, in.NodeID, full, statuses)
		return err
	}); err != nil {
		t.Error(err)
	}
}

func stateOf(t *testing.T, st *store.Store, id string) string {
	t.Helper()
	var s string
	if err := st.Pool.QueryRow(context.Background(), `SELECT state FROM instances WHERE id = $1`, id).Scan(&s); err != nil {
		t.Error(err)
	}
	return s
}

// The workflow over the real store: each case's reports and API changes
// come at workflow times, with the signals the gateway and the API send.
func TestInstanceWorkflowConverges(t *testing.T) {
	cases := []struct {
		name string
		// silent: the node never reports the instance running.
		silent    bool
		wantMid   string // the state at 10 minutes
		wantAfter string // the state when the workflow ends
	}{
		{"reported running, then deleted", false, "running", "deleted"},
		{"never reported: failed after the bound, then deleted", true, "failed", "deleted"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := testenv.Store(t)
			in := placed(t, st)
			var ts testsuite.WorkflowTestSuite
			env := ts.NewTestWorkflowEnvironment()
			a := &activities.Instances{Store: st}
			Register(env, a)
			env.RegisterDelayedCallback(func() {
				if !tc.silent {
					report(t, st, in, true, protocol.InstanceStatus{ID: in.ID, Generation: in.Generation, State: protocol.InstanceRunning, Address: "10.88.0.2"})
					env.SignalWorkflow(activities.SignalStatus, nil)
				}
			}, time.Second)
			env.RegisterDelayedCallback(func() {
				if got := stateOf(t, st, in.ID); got != tc.wantMid {
					t.Errorf("state at 10 min = %s, want %s", got, tc.wantMid)
				}
				err := st.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
					_, _, err := domain.Change(context.Background(), tx, tenant, in.ID, states.MethodDelete)
					return err
				})
				if err != nil {
					t.Error(err)
				}
				env.SignalWorkflow(activities.SignalDesiredChanged, nil)
			}, 10*time.Minute)
			env.RegisterDelayedCallback(func() {
				if got := stateOf(t, st, in.ID); got != "deleting" {
					t.Errorf("state before the node lets go = %s", got)
				}
				report(t, st, in, true) // the runtime no longer holds it
				env.SignalWorkflow(activities.SignalStatus, nil)
			}, 11*time.Minute)
			env.ExecuteWorkflow(InstanceWorkflow, activities.InstanceParams{TenantID: tenant, InstanceID: in.ID, PoolID: in.PoolID,
				ConvergeBound: 2 * time.Minute, PollEvery: 10 * time.Second})
			if !env.IsWorkflowCompleted() || env.GetWorkflowError() != nil {
				t.Fatalf("completed %v, error %v", env.IsWorkflowCompleted(), env.GetWorkflowError())
			}
			if got := stateOf(t, st, in.ID); got != tc.wantAfter {
				t.Fatalf("final state = %s", got)
			}
			var released int
			if err := st.Pool.QueryRow(context.Background(), `SELECT count(*) FROM allocations WHERE instance_id = $1 AND released_at IS NOT NULL`,
				in.ID).Scan(&released); err != nil || released != 1 {
				t.Fatalf("released = %d, %v", released, err)
			}
		})
	}
}
