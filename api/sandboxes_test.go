package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/api/instances"
	"github.com/better-compute/better-compute/api/sandboxes"
	"github.com/better-compute/better-compute/core"
	coresandboxes "github.com/better-compute/better-compute/core/sandboxes"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/nodes"
	sandboxdomain "github.com/better-compute/better-compute/store/sandboxes"
)

// Templates check what they name; a sandbox's TTL stays within its
// template's maximum; its deadline moves only by extend; its workload is
// an instance that instances.* never answer; another tenant sees none of
// it.
func TestSandboxesTemplatesAndLifetimes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.client(e.boot.UserToken)
	p, nodeID, image, flavor := vpsPool(t, e)

	// Template refusals: a VM runtime on a container flavor, a default above
	// the maximum, an unknown image.
	bad := []struct {
		in     sandboxes.TemplateInput
		code   core.Code
		reason string
	}{
		{sandboxes.TemplateInput{Name: "vm", Runtime: coresandboxes.RuntimeVM, ImageID: image}, core.CodeInvalidInput, "flavorRuntime"},
		{sandboxes.TemplateInput{Name: "ttl", DefaultTTLSeconds: 600, MaxTTLSeconds: 60, ImageID: image}, core.CodeInvalidInput, "aboveMax"},
		{sandboxes.TemplateInput{Name: "img", ImageID: core.NewID("img")}, core.CodeNotFound, ""},
	}
	for _, b := range bad {
		b.in.TenantID, b.in.PoolID, b.in.FlavorID = "acme", p.ID, flavor["small"]
		_, err := sandboxes.CreateTemplate.Call(ctx, a, b.in)
		if codeOf(err) != b.code || (b.reason != "" && core.AsError(err).Details["reason"] != b.reason) {
			t.Fatalf("template %s = %v %+v, want %s %s", b.in.Name, err, core.AsError(err).Details, b.code, b.reason)
		}
	}
	tpl, err := sandboxes.CreateTemplate.Call(ctx, a, sandboxes.TemplateInput{TenantID: "acme", Name: "py", PoolID: p.ID,
		FlavorID: flavor["small"], ImageID: image, MaxTTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Runtime != "gvisor" || tpl.DefaultTTLSeconds != 300 || tpl.MaxTTLSeconds != 600 || tpl.TTLAction != "delete" || tpl.VCPU != 2 {
		t.Fatalf("template = %+v", tpl)
	}
	if _, err := sandboxes.CreateTemplate.Call(ctx, a, sandboxes.TemplateInput{TenantID: "acme", Name: "py", PoolID: p.ID,
		FlavorID: flavor["small"], ImageID: image}); codeOf(err) != core.CodeConflict {
		t.Fatalf("same name = %v", err)
	}

	// A TTL above the template's maximum is refused before anything is made.
	if _, err := sandboxes.Create.Call(ctx, a, sandboxes.CreateInput{TenantID: "acme", IdempotencyKey: "s0", TemplateID: tpl.ID,
		TTLSeconds: 601}); codeOf(err) != core.CodeInvalidInput || core.AsError(err).Details["field"] != "ttlSeconds" {
		t.Fatalf("ttl above max = %v", err)
	}
	if n := e.count(`SELECT count(*) FROM sandboxes WHERE state <> 'draft'`); n != 0 {
		t.Fatalf("%d sandboxes after a refusal", n)
	}

	in := sandboxes.CreateInput{TenantID: "acme", IdempotencyKey: "s1", TemplateID: tpl.ID, TTLSeconds: 120}
	s, err := sandboxes.Create.Call(ctx, a, in)
	if err != nil {
		t.Fatal(err)
	}
	if s.State != "starting" || s.NodeID != nodeID || s.InstanceID == "" || s.Runtime != "gvisor" ||
		s.ExpiresAt-s.CreatedAt < 119_000 || s.ExpiresAt-s.CreatedAt > 121_000 {
		t.Fatalf("sandbox = %+v", s)
	}
	if again, err := sandboxes.Create.Call(ctx, a, in); err != nil || again.ID != s.ID || again.ExpiresAt != s.ExpiresAt {
		t.Fatalf("replay = %+v, %v", again, err)
	}
	// The workload runs under gVisor on the node and is no instance of the API's.
	if got := e.count(`SELECT count(*) FROM instances WHERE id = $1 AND runtime = 'gvisor' AND sandbox_id = $2 AND node_id = $3`,
		s.InstanceID, s.ID, nodeID); got != 1 {
		t.Fatalf("workload rows = %d", got)
	}
	if _, err := instances.Get.Call(ctx, a, instances.InstanceInput{TenantID: "acme", InstanceID: s.InstanceID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("instances.get of the workload = %v", err)
	}
	if l, err := instances.List.Call(ctx, a, instances.ListInput{TenantID: "acme", Scope: "all"}); err != nil || len(l.Items) != 0 {
		t.Fatalf("instances.list = %+v, %v", l, err)
	}
	// Another tenant: NOT_FOUND, and an empty list.
	if _, err := sandboxes.Get.Call(ctx, e.client(e.globex), sandboxes.SandboxInput{TenantID: "globex", SandboxID: s.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex get = %v", err)
	}
	if l, err := sandboxes.List.Call(ctx, a, sandboxes.ListInput{TenantID: "acme"}); err != nil || len(l.Items) != 1 {
		t.Fatalf("list = %+v, %v", l, err)
	}

	// Exec before the workload runs: INVALID_STATE notRunning; neither it
	// nor a read moves the deadline.
	if _, err := sandboxes.Get.Call(ctx, a, sandboxes.SandboxInput{TenantID: "acme", SandboxID: s.ID}); err != nil {
		t.Fatal(err)
	}
	// Extend: past the template's maximum, in the past, then within it.
	for _, at := range []int64{s.CreatedAt + 601_000, s.CreatedAt - 1} {
		if _, err := sandboxes.Extend.Call(ctx, a, sandboxes.ExtendInput{TenantID: "acme", SandboxID: s.ID, ExpiresAt: at}); codeOf(err) != core.CodeInvalidInput {
			t.Fatalf("extend to %d = %v", at, err)
		}
	}
	want := s.CreatedAt + 600_000
	ext, err := sandboxes.Extend.Call(ctx, a, sandboxes.ExtendInput{TenantID: "acme", SandboxID: s.ID, ExpiresAt: want})
	if err != nil || ext.ExpiresAt != want {
		t.Fatalf("extend = %+v, %v", ext, err)
	}

	// A template live sandboxes run from cannot be deleted.
	if _, err := sandboxes.DeleteTemplate.Call(ctx, a, sandboxes.TemplateRef{TenantID: "acme", TemplateID: tpl.ID}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("template delete = %v", err)
	}
	del, err := sandboxes.Delete.Call(ctx, a, sandboxes.SandboxInput{TenantID: "acme", SandboxID: s.ID})
	if err != nil || del.State != "deleting" || del.EndReason != "deleted" || del.ExpiresAt != want {
		t.Fatalf("delete = %+v, %v", del, err)
	}
	if _, err := sandboxes.Extend.Call(ctx, a, sandboxes.ExtendInput{TenantID: "acme", SandboxID: s.ID, ExpiresAt: want}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("extend while deleting = %v", err)
	}
	if got := e.count(`SELECT count(*) FROM instances WHERE id = $1 AND desired_state = 'deleted'`, s.InstanceID); got != 1 {
		t.Fatalf("the workload is not being deleted")
	}
}

// Snapshots are refused where they cannot be taken (a workload not
// running, memory without gVisor, one already being taken), are asked of
// the node through its NodeSpec, stay with their tenant, and a restore is
// refused before anything starts when its template's runtime changed, and
// its snapshot cannot be deleted while the restore runs.
func TestSandboxSnapshotRules(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.client(e.boot.UserToken)
	p, nodeID, image, flavor := vpsPool(t, e)
	tpl, err := sandboxes.CreateTemplate.Call(ctx, a, sandboxes.TemplateInput{TenantID: "acme", Name: "runc", PoolID: p.ID,
		FlavorID: flavor["small"], ImageID: image, Runtime: coresandboxes.RuntimeRunc, TTLAction: coresandboxes.TTLSnapshot})
	if err != nil {
		t.Fatal(err)
	}
	s, err := sandboxes.Create.Call(ctx, a, sandboxes.CreateInput{TenantID: "acme", IdempotencyKey: "s1", TemplateID: tpl.ID})
	if err != nil {
		t.Fatal(err)
	}
	take := func(memory bool) (sandboxes.Snapshot, error) {
		return sandboxes.TakeSnapshot.Call(ctx, a, sandboxes.SnapshotInput{TenantID: "acme", SandboxID: s.ID, IncludeMemory: memory})
	}
	if _, err := take(false); core.AsError(err).Details["reason"] != "notRunning" {
		t.Fatalf("snapshot of a starting sandbox = %v", err)
	}
	// The node reports the workload running.
	e.exec(`UPDATE instances SET state = 'running', observed_state = 'running', observed_generation = generation WHERE id = $1`, s.InstanceID)
	if _, err := take(true); codeOf(err) != core.CodeInvalidInput || core.AsError(err).Details["field"] != "includeMemory" {
		t.Fatalf("memory snapshot under runc = %v", err)
	}
	snap, err := take(false)
	if err != nil || snap.State != "creating" || snap.SandboxID != s.ID || snap.Runtime != "runc" || snap.Reason != "requested" {
		t.Fatalf("snapshot = %+v, %v", snap, err)
	}
	if _, err := take(false); core.AsError(err).Details["reason"] != "snapshotting" {
		t.Fatalf("a second snapshot at once = %v", err)
	}
	_, spec, err := nodes.Spec(ctx, e.store.Pool, nodeID)
	if err != nil || len(spec.Instances) != 1 || len(spec.Instances[0].Snapshots) != 1 || spec.Instances[0].Snapshots[0].ID != snap.ID {
		t.Fatalf("the node's spec = %+v, %v", spec.Instances, err)
	}
	if _, err := sandboxes.GetSnapshot.Call(ctx, e.client(e.globex), sandboxes.SnapshotRef{TenantID: "globex", SnapshotID: snap.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex get = %v", err)
	}
	// The node delivers it (as the agent listener records an upload).
	e.exec(`UPDATE sandbox_snapshots SET state = 'ready', sha256 = $2, size_bytes = 10240, ready_at = now() WHERE id = $1`,
		snap.ID, strings.Repeat("cd", 32))

	// A restore into a template whose runtime changed is refused; nothing is made.
	gvisor := coresandboxes.RuntimeGVisor
	if _, err := sandboxes.UpdateTemplate.Call(ctx, a, sandboxes.TemplateUpdateInput{TenantID: "acme", TemplateID: tpl.ID, Runtime: &gvisor}); err != nil {
		t.Fatal(err)
	}
	restore := sandboxes.CreateInput{TenantID: "acme", IdempotencyKey: "r1", FromSnapshot: snap.ID}
	if _, err := sandboxes.Create.Call(ctx, a, restore); core.AsError(err).Details["reason"] != "runtimeChanged" {
		t.Fatalf("restore after a runtime change = %v", err)
	}
	runc := coresandboxes.RuntimeRunc
	if _, err := sandboxes.UpdateTemplate.Call(ctx, a, sandboxes.TemplateUpdateInput{TenantID: "acme", TemplateID: tpl.ID, Runtime: &runc}); err != nil {
		t.Fatal(err)
	}
	restore.IdempotencyKey = "r2"
	r, err := sandboxes.Create.Call(ctx, a, restore)
	if err != nil || r.FromSnapshotID != snap.ID || r.TemplateID != tpl.ID {
		t.Fatalf("restore = %+v, %v", r, err)
	}
	_, spec, err = nodes.Spec(ctx, e.store.Pool, nodeID)
	if err != nil {
		t.Fatal(err)
	}
	var restored bool
	for _, in := range spec.Instances {
		restored = restored || (in.ID == r.InstanceID && in.Restore != nil && in.Restore.SnapshotID == snap.ID && !in.Restore.Memory)
	}
	if !restored {
		t.Fatalf("the restored workload's spec = %+v", spec.Instances)
	}
	if _, err := sandboxes.DeleteSnapshot.Call(ctx, a, sandboxes.SnapshotRef{TenantID: "acme", SnapshotID: snap.ID}); core.AsError(err).Details["reason"] != "inUse" {
		t.Fatalf("deleting a snapshot in use = %v", err)
	}

	// The host is lost: both sandboxes end with workloadGone at their
	// workflows' next step; the snapshot stays.
	e.exec(`UPDATE nodes SET connectivity = 'lost' WHERE id = $1`, nodeID)
	for _, id := range []string{s.ID, r.ID} {
		if err := e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			_, err := sandboxdomain.Step(ctx, tx, id, e.catalog.FullName(coresandboxes.SnapshotResourceType))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		got, err := sandboxes.Get.Call(ctx, a, sandboxes.SandboxInput{TenantID: "acme", SandboxID: id})
		if err != nil || got.State != "deleting" || got.EndReason != "workloadGone" {
			t.Fatalf("sandbox %s on a lost host = %+v, %v", id, got, err)
		}
	}
	if kept, err := sandboxes.GetSnapshot.Call(ctx, a, sandboxes.SnapshotRef{TenantID: "acme", SnapshotID: snap.ID}); err != nil || kept.State != "ready" {
		t.Fatalf("the snapshot after the host's loss = %+v, %v", kept, err)
	}
}

// A template's env is checked (names, another tenant's secret, a vm) and,
// when it names secrets, takes compute:secrets:manage: a caller who may
// manage sandboxes but not secrets is denied, and nothing is made; its
// workloads carry the env and their NodeSpec says so.
func TestSandboxTemplateEnv(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.client(e.boot.UserToken)
	p, nodeID, image, flavor := vpsPool(t, e)
	in := func(name string, env map[string]string) sandboxes.TemplateInput {
		return sandboxes.TemplateInput{TenantID: "acme", Name: name, PoolID: p.ID, FlavorID: flavor["small"], ImageID: image, Env: env}
	}
	for _, b := range []struct {
		env    map[string]string
		reason string
	}{
		{map[string]string{"1BAD": "x"}, "name"},
		{map[string]string{"TOKEN": "secret://globex/token"}, "secretRef"},
		{map[string]string{"TOKEN": "secret://acme"}, "secretRef"},
	} {
		if _, err := sandboxes.CreateTemplate.Call(ctx, a, in("bad", b.env)); codeOf(err) != core.CodeInvalidInput || core.AsError(err).Details["reason"] != b.reason {
			t.Fatalf("env %v = %v, want %s", b.env, err, b.reason)
		}
	}
	if _, err := e.admin.PutPolicy(ctx, iam.PutPolicyInput{TenantID: "acme", Name: "sandboxers", Cedar: `permit (principal in Group::"sandboxers",
	action in [Action::"compute:sandboxes:manage", Action::"compute:sandboxes:read"], resource is Resource)
when { resource.tenantId == principal.tenantId };`}); err != nil {
		t.Fatal(err)
	}
	sandboxer := e.client(e.person("acme", "sandra", []string{"sandboxers"}))
	withSecret := map[string]string{"TOKEN": "secret://acme/token", "MODE": "test"}
	if _, err := sandboxes.CreateTemplate.Call(ctx, sandboxer, in("secretive", withSecret)); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("a template naming secrets without compute:secrets:manage = %v", err)
	}
	if n := e.count(`SELECT count(*) FROM sandbox_templates`); n != 0 {
		t.Fatalf("%d templates after the denial", n)
	}
	// Plain values need no secrets decision.
	plain, err := sandboxes.CreateTemplate.Call(ctx, sandboxer, in("plain", map[string]string{"MODE": "test"}))
	if err != nil || plain.Env["MODE"] != "test" {
		t.Fatalf("plain env = %+v, %v", plain, err)
	}
	// Naming a secret in an update needs it too.
	if _, err := sandboxes.UpdateTemplate.Call(ctx, sandboxer, sandboxes.TemplateUpdateInput{TenantID: "acme", TemplateID: plain.ID,
		Env: &withSecret}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("an update naming secrets = %v", err)
	}
	tpl, err := sandboxes.CreateTemplate.Call(ctx, a, in("secretive", withSecret))
	if err != nil || tpl.Env["TOKEN"] != "secret://acme/token" {
		t.Fatalf("template = %+v, %v", tpl, err)
	}
	s, err := sandboxes.Create.Call(ctx, a, sandboxes.CreateInput{TenantID: "acme", IdempotencyKey: "env", TemplateID: tpl.ID})
	if err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT count(*) FROM instances WHERE id = $1 AND env = $2::jsonb`, s.InstanceID, `{"TOKEN": "secret://acme/token", "MODE": "test"}`); n != 1 {
		t.Fatal("the workload does not carry the template's env")
	}
	_, spec, err := nodes.Spec(ctx, e.store.Pool, nodeID)
	if err != nil || len(spec.Instances) != 1 || !spec.Instances[0].Env {
		t.Fatalf("the node's spec = %+v, %v", spec.Instances, err)
	}
}
