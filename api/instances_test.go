package api_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api/instances"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/testutil"
)

// vpsPool makes acme's vps-host pool with one schedulable H100 host
// (224 logical CPUs, 2 TiB, 8 GPUs), a registered, uploaded and verified
// image, and flavors: small (2 vCPU, 4 GiB), gpu (4 vCPU, 2 GPUs), bigger
// (8 vCPU) and huge (1000 vCPU).
func vpsPool(t *testing.T, e *env) (pool pools.Pool, nodeID, image string, flavor map[string]string) {
	t.Helper()
	ctx := context.Background()
	s := e.site(e.boot.UserToken, "acme", "fra-vps", "custom")
	p, err := pools.Create.Call(ctx, e.client(e.boot.UserToken), pools.CreateInput{TenantID: "acme", SiteID: s.ID,
		Name: "vps", Class: "vps-host", GPUModel: "H100", GPUMemoryGb: 80})
	if err != nil {
		t.Fatal(err)
	}
	n := e.node(schedulableNode(p.ID, "host-a"), fixture(t, "h100-8x-sxm.json"))
	image = core.NewID("img")
	e.exec(`INSERT INTO images (id, tenant_id, name, version, format, sha256, size_bytes, state, verified, signer_fingerprint, created_by)
		VALUES ($1, 'acme', 'debian', '12', 'raw', $2, 1024, 'available', true, 'SHA256:test', 'idn_x')`, image, strings.Repeat("ab", 32))
	flavor = map[string]string{}
	for _, f := range []struct {
		name       string
		vcpu, gpus int
	}{{"small", 2, 0}, {"gpu", 4, 2}, {"bigger", 8, 0}, {"huge", 1000, 0}} {
		id := core.NewID("flv")
		e.exec(`INSERT INTO flavors (id, tenant_id, pool_id, name, vcpu, memory_mib, gpus, gpu_class, runtime)
			VALUES ($1, 'acme', $2, $3, $4, 4096, $5, CASE WHEN $5 > 0 THEN 'gpu' ELSE '' END, 'container')`, id, p.ID, f.name, f.vcpu, f.gpus)
		flavor[f.name] = id
	}
	return p, n.ID, image, flavor
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.store.Pool.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func TestInstancesCreateAndLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.client(e.boot.UserToken)
	p, nodeID, image, flavor := vpsPool(t, e)
	in := instances.CreateInput{TenantID: "acme", IdempotencyKey: "i1", PoolID: p.ID, FlavorID: flavor["gpu"], ImageID: image,
		Name: "web-1", UserData: "#cloud-config\n"}

	got, err := instances.Create.Call(ctx, a, in)
	if err != nil {
		t.Fatal(err)
	}
	if want := core.DerivedID("inst", "acme", e.identityOf(e.boot.UserToken), "i1"); got.ID != want {
		t.Fatalf("id %s, want the derived %s", got.ID, want)
	}
	if got.State != "creating" || got.DesiredState != "running" || got.NodeID != nodeID || len(got.Devices) != 2 ||
		!got.HasUserData || got.VCPU != 4 || got.WorkflowID != got.ID {
		t.Fatalf("instance = %+v", got)
	}
	// The draft's authorization row carries what the decision read.
	var attrs string
	if err := e.store.Pool.QueryRow(ctx, `SELECT attributes::text FROM authz_resources WHERE id = $1`, got.ID).Scan(&attrs); err != nil ||
		!strings.Contains(attrs, `"imageVerified": true`) || !strings.Contains(attrs, `"gpus": 2`) || !strings.Contains(attrs, `"vcpu": 4`) {
		t.Fatalf("authz attributes = %s, %v", attrs, err)
	}
	// The replay answers the stored instance; nothing more is booked.
	if again, err := instances.Create.Call(ctx, a, in); err != nil || again.ID != got.ID {
		t.Fatalf("replay = %+v, %v", again, err)
	}
	if n := e.count(`SELECT count(*) FROM allocations WHERE instance_id IS NOT NULL`); n != 1 {
		t.Fatalf("allocations = %d", n)
	}

	// Reads: the owner's list, another tenant's NOT_FOUND.
	if g, err := instances.Get.Call(ctx, a, instances.InstanceInput{TenantID: "acme", InstanceID: got.ID}); err != nil || g.ID != got.ID {
		t.Fatalf("get = %+v, %v", g, err)
	}
	if _, err := instances.Get.Call(ctx, e.client(e.globex), instances.InstanceInput{TenantID: "globex", InstanceID: got.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex get = %v", err)
	}
	list, err := instances.List.Call(ctx, a, instances.ListInput{TenantID: "acme"})
	if err != nil || len(list.Items) != 1 || list.Items[0].ID != got.ID {
		t.Fatalf("list = %+v, %v", list, err)
	}

	// The state table: each call in the state it meets.
	steps := []struct {
		call  func() (instances.Instance, error)
		state string
		code  core.Code
	}{
		{func() (instances.Instance, error) {
			return instances.Start.Call(ctx, a, instances.InstanceInput{TenantID: "acme", InstanceID: got.ID})
		}, "creating", ""},
		{func() (instances.Instance, error) {
			return instances.Resize.Call(ctx, a, instances.ResizeInput{TenantID: "acme", InstanceID: got.ID, FlavorID: flavor["small"]})
		}, "", core.CodeInvalidState},
		{func() (instances.Instance, error) {
			return instances.Stop.Call(ctx, a, instances.InstanceInput{TenantID: "acme", InstanceID: got.ID})
		}, "stopping", ""},
		{func() (instances.Instance, error) {
			return instances.Stop.Call(ctx, a, instances.InstanceInput{TenantID: "acme", InstanceID: got.ID})
		}, "stopping", ""},
		{func() (instances.Instance, error) {
			return instances.Start.Call(ctx, a, instances.InstanceInput{TenantID: "acme", InstanceID: got.ID})
		}, "starting", ""},
		{func() (instances.Instance, error) {
			return instances.Delete.Call(ctx, a, instances.InstanceInput{TenantID: "acme", InstanceID: got.ID})
		}, "deleting", ""},
		{func() (instances.Instance, error) {
			return instances.Start.Call(ctx, a, instances.InstanceInput{TenantID: "acme", InstanceID: got.ID})
		}, "", core.CodeInvalidState},
	}
	for i, s := range steps {
		out, err := s.call()
		if s.code != "" {
			if codeOf(err) != s.code {
				t.Fatalf("step %d = %+v, %v; want %s", i, out, err, s.code)
			}
			continue
		}
		if err != nil || out.State != s.state {
			t.Fatalf("step %d = %+v, %v; want state %s", i, out, err, s.state)
		}
	}
}

func TestInstancesResizeAndRefusals(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.client(e.boot.UserToken)
	p, _, image, flavor := vpsPool(t, e)
	create := func(key, flv string) (instances.Instance, error) {
		return instances.Create.Call(ctx, a, instances.CreateInput{TenantID: "acme", IdempotencyKey: key, PoolID: p.ID,
			FlavorID: flv, ImageID: image, Name: "vm"})
	}
	// A flavor that fits no node: the placement reasons, nothing booked,
	// the draft failed.
	_, err := create("huge", flavor["huge"])
	ce := core.AsError(err)
	if ce.Code != core.CodeInvalidState || ce.Details["reason"] != "noCapacity" || ce.Details["nodes"] == nil {
		t.Fatalf("huge = %v %+v", err, ce.Details)
	}
	if n := e.count(`SELECT count(*) FROM allocations WHERE instance_id IS NOT NULL`); n != 0 {
		t.Fatalf("allocations after a refusal = %d", n)
	}
	testutil.EventuallyNil(t, 5*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM instances WHERE state = 'failed'`); n != 1 {
			return fmt.Errorf("failed drafts = %d", n)
		}
		return nil
	})
	// Bad input: command on a ... wrong id prefix is INVALID_INPUT.
	if _, err := instances.Create.Call(ctx, a, instances.CreateInput{TenantID: "acme", IdempotencyKey: "bad", PoolID: p.ID,
		FlavorID: "nope", ImageID: image, Name: "vm"}); codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("bad flavor id = %v", err)
	}

	// Resize a stopped instance: the scalars rebook on its node; a GPU
	// count change is UNSUPPORTED (reason gpus).
	in, err := create("s1", flavor["small"])
	if err != nil {
		t.Fatal(err)
	}
	e.exec(`UPDATE instances SET state = 'stopped', desired_state = 'stopped' WHERE id = $1`, in.ID)
	out, err := instances.Resize.Call(ctx, a, instances.ResizeInput{TenantID: "acme", InstanceID: in.ID, FlavorID: flavor["bigger"]})
	if err != nil || out.State != "resizing" || out.VCPU != 8 || out.Generation != in.Generation+1 {
		t.Fatalf("resize = %+v, %v", out, err)
	}
	if n := e.count(`SELECT vcpu FROM allocations WHERE instance_id = $1`, in.ID); n != 8 {
		t.Fatalf("allocation vcpu = %d", n)
	}
	e.exec(`UPDATE instances SET state = 'stopped' WHERE id = $1`, in.ID)
	_, err = instances.Resize.Call(ctx, a, instances.ResizeInput{TenantID: "acme", InstanceID: in.ID, FlavorID: flavor["gpu"]})
	if ce := core.AsError(err); ce.Code != core.CodeUnsupported || ce.Details["reason"] != "gpus" {
		t.Fatalf("gpu resize = %v", err)
	}
	_, err = instances.Resize.Call(ctx, a, instances.ResizeInput{TenantID: "acme", InstanceID: in.ID, FlavorID: flavor["huge"]})
	if ce := core.AsError(err); ce.Code != core.CodeInvalidState || ce.Details["reason"] != "noCapacity" {
		t.Fatalf("huge resize = %v", err)
	}
	// A secret:// user data takes the secrets decision; the tenant admin
	// has it.
	if _, err := instances.Create.Call(ctx, a, instances.CreateInput{TenantID: "acme", IdempotencyKey: "sec", PoolID: p.ID,
		FlavorID: flavor["small"], ImageID: image, Name: "vm", UserData: "secret://acme/cloud-init"}); err != nil {
		t.Fatalf("secret user data = %v", err)
	}
	// The stranger (no policy) is denied, and its draft marked denied.
	if _, err := instances.Create.Call(ctx, e.client(e.stranger), instances.CreateInput{TenantID: "acme", IdempotencyKey: "x",
		PoolID: p.ID, FlavorID: flavor["small"], ImageID: image, Name: "vm"}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("stranger = %v", err)
	}
}

// An instance on a binding instance reservation: it takes the
// reservation's node and atoms, a second one is refused inUse, and the
// reservation's cancel deletes it.
func TestInstancesOnReservation(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.client(e.boot.UserToken)
	p, nodeID, image, flavor := vpsPool(t, e)
	r, err := reservations.Create.Call(ctx, a, reservations.CreateInput{TenantID: "acme", IdempotencyKey: "r1", PoolID: p.ID,
		Devices: placement.Request{Class: "gpu", Count: 2}, Duration: 3600, Binding: "instance"})
	if err != nil || r.State != "placed" || len(r.Allocations) != 1 || r.Allocations[0].NodeID != nodeID {
		t.Fatalf("reservation = %+v, %v", r, err)
	}
	in := instances.CreateInput{TenantID: "acme", IdempotencyKey: "on-r1", PoolID: p.ID, FlavorID: flavor["gpu"], ImageID: image,
		Name: "gpu-1", ReservationID: r.ID}
	got, err := instances.Create.Call(ctx, a, in)
	if err != nil {
		t.Fatal(err)
	}
	if got.ReservationID != r.ID || got.NodeID != nodeID || fmt.Sprint(got.Devices) != fmt.Sprint(r.Allocations[0].Atoms) {
		t.Fatalf("instance = %+v, want the reservation's atoms %v", got, r.Allocations[0].Atoms)
	}
	second := in
	second.IdempotencyKey, second.Name = "on-r1-again", "gpu-2"
	if _, err := instances.Create.Call(ctx, a, second); core.AsError(err).Code != core.CodeConflict ||
		core.AsError(err).Details["reason"] != "inUse" {
		t.Fatalf("second instance = %v", err)
	}
	small := second
	small.IdempotencyKey, small.FlavorID = "small-on-r1", flavor["small"]
	if _, err := instances.Create.Call(ctx, a, small); core.AsError(err).Code != core.CodeInvalidInput ||
		core.AsError(err).Details["field"] != "flavorId" {
		t.Fatalf("flavor without GPUs = %v", err)
	}
	if _, err := reservations.Cancel.Call(ctx, a, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID}); err != nil {
		t.Fatal(err)
	}
	after, err := instances.Get.Call(ctx, a, instances.InstanceInput{TenantID: "acme", InstanceID: got.ID})
	if err != nil || after.DesiredState != "deleted" || after.State != "deleting" {
		t.Fatalf("instance after the cancel = %+v, %v", after, err)
	}
}

// A secret:// user data needs compute:secrets:manage too: the envelope asks
// it right after the draft's decision, for the same caller, with no
// transaction open; a denial marks the draft denied and books nothing, and a
// replay decides nothing.
func TestInstancesCreateSecretsDecisionOutsideTransactions(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, _, image, flavor := vpsPool(t, e)
	for name, cedar := range map[string]string{
		"vm-users": `permit (principal in Group::"vm-users", action == Action::"compute:instances:create", resource is Resource)
when { resource.type == "compute-instance" && resource.tenantId == principal.tenantId };`,
		"vm-secrets": `permit (principal in Group::"vm-secrets", action == Action::"compute:secrets:manage", resource is Resource)
when { resource.type == "compute-tenant" && resource.tenantId == principal.tenantId };`,
	} {
		if _, err := e.admin.PutPolicy(ctx, iam.PutPolicyInput{TenantID: "acme", Name: name, Cedar: cedar}); err != nil {
			t.Fatal(err)
		}
	}
	plain := e.person("acme", "val", []string{"vm-users"})
	withSecrets := e.person("acme", "vera", []string{"vm-users", "vm-secrets"})

	// Every Require is recorded with the number of this database's
	// transactions left open at that moment (an IAM call inside one would
	// find its own).
	type asked struct {
		action, resourceType string
		openTx               int
	}
	var mu sync.Mutex
	var log []asked
	require := func(r iam.Request) error {
		var open int
		if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state LIKE 'idle in transaction%'`).Scan(&open); err != nil {
			return err
		}
		mu.Lock()
		log = append(log, asked{r.Action, r.Resource.Type, open})
		mu.Unlock()
		return e.outer.inner.Require(ctx, r)
	}
	e.outer.onRequire.Store(&require)
	t.Cleanup(func() { e.outer.onRequire.Store(nil) })
	taken := func() []asked {
		mu.Lock()
		defer mu.Unlock()
		out := log
		log = nil
		return out
	}
	body := func(key, userData string) string {
		return fmt.Sprintf(`{"tenantId":"acme","idempotencyKey":%q,"poolId":%q,"flavorId":%q,"imageId":%q,"name":"vm","userData":%q}`,
			key, p.ID, flavor["small"], image, userData)
	}
	instance, secretsCheck := e.catalog.FullName("instance"), e.catalog.FullName("tenant")
	for _, tc := range []struct {
		name, token, key, userData string
		status                     int
		state                      string
		asked                      []asked
	}{
		{"no secrets:manage", plain, "v1", "secret://acme/cloud-init", 403, "denied",
			[]asked{{"compute:instances:create", instance, 0}, {"compute:secrets:manage", secretsCheck, 0}}},
		{"plain user data takes no secrets decision", plain, "v2", "#cloud-config\n", 200, "creating",
			[]asked{{"compute:instances:create", instance, 0}}},
		{"with secrets:manage", withSecrets, "s1", "secret://acme/cloud-init", 200, "creating",
			[]asked{{"compute:instances:create", instance, 0}, {"compute:secrets:manage", secretsCheck, 0}}},
		{"the replay decides nothing", withSecrets, "s1", "secret://acme/cloud-init", 200, "creating", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			taken()
			status, answer := e.call(tc.token, "instances.create", body(tc.key, tc.userData))
			if status != tc.status {
				t.Fatalf("create = %d %s", status, answer)
			}
			if got := taken(); !slices.Equal(got, tc.asked) {
				t.Fatalf("IAM was asked %+v, want %+v", got, tc.asked)
			}
			id := core.DerivedID("inst", "acme", e.identityOf(tc.token), tc.key)
			if n := e.count(`SELECT count(*) FROM instances WHERE id = $1 AND state = $2`, id, tc.state); n != 1 {
				t.Fatalf("instance %s is not %s", id, tc.state)
			}
			booked := e.count(`SELECT count(*) FROM allocations WHERE instance_id = $1`, id)
			if want := map[bool]int{true: 1, false: 0}[tc.status == 200]; booked != want {
				t.Fatalf("allocations = %d, want %d", booked, want)
			}
		})
	}
	// The secrets denial answers what a denial of the draft answers.
	taken()
	_, secretsDenial := e.call(plain, "instances.create", body("v3", "secret://acme/cloud-init"))
	status, draftDenial := e.call(e.stranger, "instances.create", body("x1", "#cloud-config\n"))
	if status != 403 || secretsDenial != draftDenial {
		t.Fatalf("secrets denial %s, draft denial %d %s", secretsDenial, status, draftDenial)
	}
}
