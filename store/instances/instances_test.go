package instances_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

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

const tenant = "ten_inst"

type fixture struct {
	t      *testing.T
	st     *store.Store
	poolID string
	image  string
	types  domain.Types
}

// newFixture makes a vps-host pool with policy, a registered image whose
// bytes are uploaded, and n schedulable H100 nodes (224 logical CPUs, 2
// TiB, 8 GPUs each).
func newFixture(t *testing.T, policy string, n int) *fixture {
	t.Helper()
	ctx := context.Background()
	st := testenv.Store(t)
	catalog, err := core.DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, st: st, poolID: core.NewID("pool"), image: core.NewID("img"),
		types: domain.Types{Instance: catalog.FullName("instance"), Pool: catalog.FullName("pool")}}
	siteID := core.NewID("site")
	f.exec(`INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by)
		VALUES ($1, $2, $1, 'eu', 'eu-west', 'custom', 'idn_x')`, siteID, tenant)
	f.exec(`INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, policy, created_by)
		VALUES ($1, $2, $3, $1, 'vps-host', 'H100', 80, 'bcd', $4, 'idn_x')`, f.poolID, tenant, siteID, policy)
	f.exec(`INSERT INTO images (id, tenant_id, name, version, format, sha256, size_bytes, state, verified, signer_fingerprint, created_by)
		VALUES ($1, $2, 'debian', '12', 'raw', $3, 1024, 'available', true, 'SHA256:test', 'idn_x')`, f.image, tenant, strings.Repeat("ab", 32))
	sample, err := inventory.Sample("h100-8x-sxm.json")
	if err != nil {
		t.Fatal(err)
	}
	types := nodes.TypesOf(catalog)
	for i := range n {
		doc, err := json.Marshal(sample.Copy(i + 1))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			node, err := nodes.Create(ctx, tx, types, nodes.NewNode{PoolID: f.poolID, Name: fmt.Sprint("host-", i),
				ProvisionState: nodestate.Adopted, Role: nodestate.RoleHost, Connectivity: nodestate.Connected,
				Power: nodestate.PowerOn, ObservedGeneration: 1})
			if err != nil {
				return err
			}
			_, err = nodes.Ingest(ctx, tx, types, node.ID, doc)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.st.Pool.Exec(context.Background(), sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

func (f *fixture) count(sql string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.st.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// flavor makes a container flavor of the pool.
func (f *fixture) flavor(vcpu int, memoryMiB int64, gpus int) string {
	f.t.Helper()
	id := core.NewID("flv")
	f.exec(`INSERT INTO flavors (id, tenant_id, pool_id, name, vcpu, memory_mib, gpus, gpu_class, runtime)
		VALUES ($1, $2, $3, $1, $4, $5, $6, CASE WHEN $6 > 0 THEN 'gpu' ELSE '' END, 'container')`,
		id, tenant, f.poolID, vcpu, memoryMiB, gpus)
	return id
}

// create drafts and places one instance of the fixture's tenant.
func (f *fixture) create(flavorID string) (domain.Instance, error) {
	return f.createWith(tenant, f.image, flavorID, "")
}

// createWith drafts and places one instance of tenantID, as
// instances.create's two transactions do.
func (f *fixture) createWith(tenantID, image, flavorID, reservationID string) (domain.Instance, error) {
	ctx := context.Background()
	id := core.NewID("inst")
	if err := f.st.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		_, err := domain.Draft(ctx, tx, f.types, tenantID, id, "idn_owner", domain.Request{PoolID: f.poolID, FlavorID: flavorID,
			ImageID: image, Name: "web", ReservationID: reservationID})
		return err
	}); err != nil {
		return domain.Instance{}, err
	}
	var in domain.Instance
	err := f.st.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		in, err = domain.Place(ctx, tx, tenantID, id)
		return err
	})
	return in, err
}

func (f *fixture) tx(fn func(tx store.Tx) error) {
	f.t.Helper()
	if err := f.st.InTx(context.Background(), store.ReadWrite, fn); err != nil {
		f.t.Fatal(err)
	}
}

func TestPlacementCountsOvercommit(t *testing.T) {
	cases := []struct {
		name   string
		policy string
		vcpu   int
		memory int64
		fit    int
		reason string
	}{
		{"vcpu without overcommit", `{}`, 100, 1024, 2, "vcpu"},
		{"vcpu overcommitted 2x", `{"overcommit":{"vcpu":2}}`, 100, 1024, 4, "vcpu"},
		{"memory without overcommit", `{}`, 1, 900 * 1024, 2, "memory"},
		{"memory overcommitted 1.5x", `{"overcommit":{"memory":1.5}}`, 1, 900 * 1024, 3, "memory"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.policy, 1)
			flv := f.flavor(tc.vcpu, tc.memory, 0)
			for i := range tc.fit {
				in, err := f.create(flv)
				if err != nil || in.State != string(states.Creating) || in.NodeID == "" {
					t.Fatalf("instance %d = %+v, %v", i, in, err)
				}
			}
			_, err := f.create(flv)
			ce := core.AsError(err)
			if ce.Code != core.CodeInvalidState || ce.Details["reason"] != "noCapacity" {
				t.Fatalf("one too many = %v", err)
			}
			raw, _ := json.Marshal(ce.Details["nodes"])
			if !strings.Contains(string(raw), `"reason":"`+tc.reason+`"`) {
				t.Fatalf("reasons = %s, want %s", raw, tc.reason)
			}
			if got := f.count(`SELECT count(*) FROM allocations WHERE instance_id IS NOT NULL`); got != tc.fit {
				t.Fatalf("allocations = %d, want %d", got, tc.fit)
			}
		})
	}
}

// race runs create from callers goroutines at once and answers how many
// succeeded; an error refused does not accept fails the test.
func race(t *testing.T, callers int, create func() error, refused func(*core.Error) bool) int {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = create()
		}()
	}
	wg.Wait()
	placed := 0
	for _, err := range errs {
		switch {
		case err == nil:
			placed++
		case !refused(core.AsError(err)):
			t.Fatalf("create = %v", err)
		}
	}
	return placed
}

func TestConcurrentCreatesNeverOverbook(t *testing.T) {
	f := newFixture(t, `{}`, 1)
	flv := f.flavor(100, 1024, 1) // two fit the node's 224 CPUs
	placed := race(t, 8, func() error { _, err := f.create(flv); return err },
		func(ce *core.Error) bool {
			return ce.Code == core.CodeInvalidState && ce.Details["reason"] == "noCapacity"
		})
	if placed != 2 {
		t.Fatalf("placed %d, want 2", placed)
	}
	if got := f.count(`SELECT COALESCE(sum(vcpu), 0) FROM allocations WHERE released_at IS NULL`); got != 200 {
		t.Fatalf("vcpu booked = %d, want 200", got)
	}
	if got := f.count(`SELECT count(*) FROM device_bookings WHERE upper_inf(during)`); got != 2 {
		t.Fatalf("GPU bookings = %d, want 2", got)
	}
}

func TestSpecAndDeleteReleasesExactlyOnce(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, `{}`, 1)
	flv := f.flavor(4, 8192, 2)
	in, err := f.create(flv)
	if err != nil || len(in.Devices) != 2 {
		t.Fatalf("create = %+v, %v", in, err)
	}
	_, spec, err := nodes.Spec(ctx, f.st.Pool, in.NodeID)
	if err != nil || len(spec.Instances) != 1 {
		t.Fatalf("spec = %+v, %v", spec, err)
	}
	si := spec.Instances[0]
	if si.ID != in.ID || si.Desired != "running" || si.VCPU != 4 || si.MemoryMiB != 8192 || len(si.Devices) != 2 ||
		si.Image.ID != f.image || si.Image.Format != "raw" || si.Generation != in.Generation {
		t.Fatalf("spec instance = %+v", si)
	}

	// The node reports it running: the workflow's step records it.
	f.tx(func(tx store.Tx) error {
		changed, err := domain.Observe(ctx, tx, in.NodeID, true, []protocol.InstanceStatus{{ID: in.ID, Generation: in.Generation,
			State: protocol.InstanceRunning, Address: "10.88.0.2", VCPU: 4, MemoryMiB: 8192}})
		if err == nil && len(changed) != 1 {
			err = fmt.Errorf("changed = %v", changed)
		}
		return err
	})
	var p domain.Progress
	f.tx(func(tx store.Tx) (err error) { p, err = domain.Converge(ctx, tx, in.ID); return err })
	if p.State != "running" || !p.Settled {
		t.Fatalf("progress = %+v", p)
	}

	// A report from another node changes nothing.
	f.tx(func(tx store.Tx) error {
		changed, err := domain.Observe(ctx, tx, "node_other", false, []protocol.InstanceStatus{{ID: in.ID, Generation: in.Generation, State: "stopped"}})
		if err == nil && len(changed) != 0 {
			err = fmt.Errorf("another node's report changed %v", changed)
		}
		return err
	})

	// Stop: desired stopped, generation bumped (the instance's and the node's).
	var nodeGen int64
	if err := f.st.Pool.QueryRow(ctx, `SELECT generation FROM nodes WHERE id = $1`, in.NodeID).Scan(&nodeGen); err != nil {
		t.Fatal(err)
	}
	var stopped domain.Instance
	f.tx(func(tx store.Tx) (err error) {
		stopped, _, err = domain.Change(ctx, tx, tenant, in.ID, states.MethodStop)
		return err
	})
	if stopped.State != "stopping" || stopped.DesiredState != "stopped" || stopped.Generation != in.Generation+1 {
		t.Fatalf("stopped = %+v", stopped)
	}
	if got := f.count(`SELECT generation FROM nodes WHERE id = $1`, in.NodeID); int64(got) != nodeGen+1 {
		t.Fatalf("node generation = %d, want %d", got, nodeGen+1)
	}
	// A late answer to the older generation changes nothing.
	f.tx(func(tx store.Tx) error {
		_, err := domain.Observe(ctx, tx, in.NodeID, false, []protocol.InstanceStatus{{ID: in.ID, Generation: stopped.Generation, State: "stopped"}})
		if err != nil {
			return err
		}
		changed, err := domain.Observe(ctx, tx, in.NodeID, false, []protocol.InstanceStatus{{ID: in.ID, Generation: in.Generation, State: "running"}})
		if err == nil && len(changed) != 0 {
			err = fmt.Errorf("an older answer changed %v", changed)
		}
		return err
	})
	f.tx(func(tx store.Tx) (err error) { p, err = domain.Converge(ctx, tx, in.ID); return err })
	if p.State != "stopped" {
		t.Fatalf("after the stop's answer = %+v", p)
	}
	f.tx(func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE instances SET state = 'stopping' WHERE id = $1`, in.ID)
		return err
	})
	// Resize is refused while stopping (the table).
	f.tx(func(tx store.Tx) error {
		_, err := domain.Resize(ctx, tx, tenant, in.ID, flv)
		if core.AsError(err).Code != core.CodeInvalidState {
			return fmt.Errorf("resize while stopping = %v", err)
		}
		return nil
	})

	// Delete: the instance leaves the spec; once the node's full report
	// no longer holds it, one step ends it and frees its allocation.
	f.tx(func(tx store.Tx) error {
		_, _, err := domain.Change(ctx, tx, tenant, in.ID, states.MethodDelete)
		return err
	})
	if _, spec, _ := nodes.Spec(ctx, f.st.Pool, in.NodeID); len(spec.Instances) != 0 {
		t.Fatalf("spec after delete = %+v", spec.Instances)
	}
	f.tx(func(tx store.Tx) (err error) { p, err = domain.Converge(ctx, tx, in.ID); return err })
	if p.Done {
		t.Fatal("deleted before the node let it go")
	}
	f.tx(func(tx store.Tx) error { _, err := domain.Observe(ctx, tx, in.NodeID, true, nil); return err })
	for range 3 {
		f.tx(func(tx store.Tx) (err error) { p, err = domain.Converge(ctx, tx, in.ID); return err })
		if !p.Done || p.State != "deleted" {
			t.Fatalf("progress = %+v", p)
		}
	}
	if got := f.count(`SELECT count(*) FROM allocations WHERE instance_id = $1 AND released_at IS NOT NULL`, in.ID); got != 1 {
		t.Fatalf("released allocations = %d", got)
	}
	if got := f.count(`SELECT count(*) FROM device_bookings WHERE upper_inf(during)`); got != 0 {
		t.Fatalf("open GPU bookings = %d", got)
	}
	if got := f.count(`SELECT count(*) FROM events WHERE resource_id = $1 AND type = 'instance.deleted'`, in.ID); got != 1 {
		t.Fatalf("instance.deleted events = %d", got)
	}
	if got := f.count(`SELECT count(*) FROM authz_resources WHERE id = $1`, in.ID); got != 0 {
		t.Fatalf("authz rows = %d", got)
	}
	// Its capacity is free again: two more of the node's 8 GPUs and 8 vCPU.
	if _, err := f.create(flv); err != nil {
		t.Fatalf("create after delete = %v", err)
	}
}

func TestDraftRefusesBadInput(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, `{}`, 0)
	flv := f.flavor(1, 128, 0)
	pending := core.NewID("img")
	f.exec(`INSERT INTO images (id, tenant_id, name, version, format, sha256, size_bytes, created_by)
		VALUES ($1, $2, 'pending', '1', 'raw', $3, 1, 'idn_x')`, pending, tenant, strings.Repeat("cd", 32))
	cases := []struct {
		name  string
		req   domain.Request
		code  core.Code
		field string
	}{
		{"unknown pool", domain.Request{PoolID: "pool_missing", FlavorID: flv, ImageID: f.image}, core.CodeNotFound, ""},
		{"unknown flavor", domain.Request{PoolID: f.poolID, FlavorID: "flv_missing", ImageID: f.image}, core.CodeNotFound, ""},
		{"another tenant's image", domain.Request{PoolID: f.poolID, FlavorID: flv, ImageID: "img_missing"}, core.CodeNotFound, ""},
		{"image not uploaded", domain.Request{PoolID: f.poolID, FlavorID: flv, ImageID: pending}, core.CodeInvalidState, "imageId"},
		{"secret of another tenant", domain.Request{PoolID: f.poolID, FlavorID: flv, ImageID: f.image, UserData: "secret://ten_other/x"},
			core.CodeInvalidInput, "userData"},
		{"unknown reservation", domain.Request{PoolID: f.poolID, FlavorID: flv, ImageID: f.image, ReservationID: "rsv_x"},
			core.CodeNotFound, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := f.st.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
				_, err := domain.Draft(ctx, tx, f.types, tenant, core.NewID("inst"), "idn_owner", tc.req)
				return err
			})
			ce := core.AsError(err)
			if ce.Code != tc.code || (tc.field != "" && ce.Details["field"] != tc.field) {
				t.Fatalf("draft = %v %+v, want %s on %q", err, ce.Details, tc.code, tc.field)
			}
		})
	}
	if got := f.count(`SELECT count(*) FROM instances`); got != 0 {
		t.Fatalf("instances = %d after refusals", got)
	}
}
