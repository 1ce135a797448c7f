package api_test

import (
	"context"
	"slices"
	"testing"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/sandboxes"
	"github.com/better-compute/better-compute/core"
	coresandboxes "github.com/better-compute/better-compute/core/sandboxes"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	nodesdomain "github.com/better-compute/better-compute/store/nodes"
	sandboxesdomain "github.com/better-compute/better-compute/store/sandboxes"
)

// Volumes: create is an admission that puts the volume on one host of
// its pool (and in that host's NodeSpec); list scopes mine and all; a
// resize grows only, decided with the new size pending; templates mount
// volumes of one host, each decided on, and their sandboxes run on that
// host with the mounts; a volume in use is not deleted; another tenant
// sees none of it.
func TestSandboxVolumes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.client(e.boot.UserToken)
	ann := e.client(e.person("acme", "ann", []string{"admins"}))
	p, _, image, flavor := vpsPool(t, e)
	e.node(schedulableNode(p.ID, "host-b"), fixture(t, "h100-8x-sxm.json"))
	observe := func() { e.exec(`UPDATE nodes SET observed_generation = generation WHERE pool_id = $1`, p.ID) }

	in := sandboxes.VolumeCreateInput{TenantID: "acme", IdempotencyKey: "v1", PoolID: p.ID, SizeGiB: 10}
	v1, err := sandboxes.CreateVolume.Call(ctx, a, in)
	if err != nil {
		t.Fatal(err)
	}
	if v1.State != "creating" || v1.NodeID == "" || v1.SizeGiB != 10 || v1.PoolID != p.ID || len(v1.ID) < 5 || v1.ID[:4] != "vol_" {
		t.Fatalf("volume = %+v", v1)
	}
	if again, err := sandboxes.CreateVolume.Call(ctx, a, in); err != nil || again.ID != v1.ID {
		t.Fatalf("replay = %+v, %v", again, err)
	}
	_, spec, err := nodesdomain.Spec(ctx, e.store.Pool, v1.NodeID)
	if err != nil || !slices.Equal(spec.Volumes, []nodespec.Volume{{ID: v1.ID, SizeGiB: 10}}) {
		t.Fatalf("the host's spec volumes = %+v, %v", spec.Volumes, err)
	}
	observe()
	if got, err := sandboxes.GetVolume.Call(ctx, a, sandboxes.VolumeInput{TenantID: "acme", VolumeID: v1.ID}); err != nil || got.State != "ready" {
		t.Fatalf("get once observed = %+v, %v", got, err)
	}
	// The second volume goes to the other host (the one holding fewer GiB).
	v2, err := sandboxes.CreateVolume.Call(ctx, a, sandboxes.VolumeCreateInput{TenantID: "acme", IdempotencyKey: "v2", PoolID: p.ID, SizeGiB: 1})
	if err != nil || v2.NodeID == v1.NodeID {
		t.Fatalf("second volume = %+v, %v", v2, err)
	}
	v3, err := sandboxes.CreateVolume.Call(ctx, ann, sandboxes.VolumeCreateInput{TenantID: "acme", IdempotencyKey: "v3", PoolID: p.ID, SizeGiB: 1})
	if err != nil {
		t.Fatal(err)
	}
	observe()

	// Scope mine (the default) is the caller's own; all the tenant's.
	ids := func(l sandboxes.VolumeList) []string {
		var out []string
		for _, v := range l.Items {
			out = append(out, v.ID)
		}
		return out
	}
	for _, c := range []struct {
		scope string
		want  []string
	}{{"", []string{v2.ID, v1.ID}}, {"mine", []string{v2.ID, v1.ID}}, {"all", []string{v3.ID, v2.ID, v1.ID}}} {
		l, err := sandboxes.ListVolumes.Call(ctx, a, sandboxes.VolumeListInput{TenantID: "acme", Scope: c.scope})
		if err != nil || !slices.Equal(ids(l), c.want) {
			t.Fatalf("list scope %q = %v, %v; want %v", c.scope, ids(l), err, c.want)
		}
	}
	// Another tenant: NOT_FOUND, and nothing listed.
	if _, err := sandboxes.GetVolume.Call(ctx, e.client(e.globex), sandboxes.VolumeInput{TenantID: "globex", VolumeID: v1.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex get = %v", err)
	}
	if _, err := sandboxes.ResizeVolume.Call(ctx, e.client(e.globex), sandboxes.VolumeResizeInput{TenantID: "globex", VolumeID: v1.ID, SizeGiB: 20}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex resize = %v", err)
	}
	if l, err := sandboxes.ListVolumes.Call(ctx, e.client(e.globex), sandboxes.VolumeListInput{TenantID: "globex", Scope: "all"}); err != nil || len(l.Items) != 0 {
		t.Fatalf("globex list = %+v, %v", l, err)
	}

	// Resize: grow only; the decision sees the new size as pending.
	if _, err := e.admin.PutPolicy(ctx, iam.PutPolicyInput{TenantID: "acme", Name: "volumes-up-to-500", Cedar: `forbid (principal, action == Action::"compute:sandboxes:manage", resource is Resource)
when { context has pending && context.pending has sizeGiB && context.pending.sizeGiB > 500 };`}); err != nil {
		t.Fatal(err)
	}
	resize := func(size int) (sandboxes.Volume, error) {
		return sandboxes.ResizeVolume.Call(ctx, a, sandboxes.VolumeResizeInput{TenantID: "acme", VolumeID: v1.ID, SizeGiB: size})
	}
	if _, err := resize(5); codeOf(err) != core.CodeInvalidInput || core.AsError(err).Details["reason"] != "shrink" {
		t.Fatalf("shrink = %v %+v", err, core.AsError(err).Details)
	}
	if _, err := resize(600); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("resize past the policy's bound = %v", err)
	}
	grown, err := resize(20)
	if err != nil || grown.SizeGiB != 20 || grown.State != "resizing" {
		t.Fatalf("grow = %+v, %v", grown, err)
	}
	if _, spec, _ := nodesdomain.Spec(ctx, e.store.Pool, v1.NodeID); !slices.Equal(spec.Volumes, []nodespec.Volume{{ID: v1.ID, SizeGiB: 20}}) {
		t.Fatalf("the host's spec after the resize = %+v", spec.Volumes)
	}
	observe()

	// Templates: volumes of one host, in the pool, at allowed paths, not
	// for vm.
	vmFlavor := core.NewID("flv")
	e.exec(`INSERT INTO flavors (id, tenant_id, pool_id, name, vcpu, memory_mib, runtime) VALUES ($1, 'acme', $2, 'vm', 1, 1024, 'vm')`, vmFlavor, p.ID)
	bad := []struct {
		name, flavor string
		runtime      coresandboxes.Runtime
		volumes      []sandboxes.MountInput
		reason       string
	}{
		{"root", flavor["small"], "", []sandboxes.MountInput{{VolumeID: v1.ID, MountPath: "/"}}, "minLength"}, // the schema's
		{"proc", flavor["small"], "", []sandboxes.MountInput{{VolumeID: v1.ID, MountPath: "/proc/x"}}, "mountPath"},
		{"unclean", flavor["small"], "", []sandboxes.MountInput{{VolumeID: v1.ID, MountPath: "/data/../etc"}}, "mountPath"},
		{"hosts", flavor["small"], "", []sandboxes.MountInput{{VolumeID: v1.ID, MountPath: "/a"}, {VolumeID: v2.ID, MountPath: "/b"}}, "hosts"},
		{"twice", flavor["small"], "", []sandboxes.MountInput{{VolumeID: v1.ID, MountPath: "/a"}, {VolumeID: v1.ID, MountPath: "/b"}}, "duplicateVolume"},
		{"vm", vmFlavor, coresandboxes.RuntimeVM, []sandboxes.MountInput{{VolumeID: v1.ID, MountPath: "/data"}}, "runtime"},
	}
	for _, b := range bad {
		_, err := sandboxes.CreateTemplate.Call(ctx, a, sandboxes.TemplateInput{TenantID: "acme", Name: b.name, PoolID: p.ID,
			FlavorID: b.flavor, ImageID: image, Runtime: b.runtime, Volumes: b.volumes})
		if codeOf(err) != core.CodeInvalidInput || core.AsError(err).Details["reason"] != b.reason {
			t.Fatalf("template %s = %v %+v, want reason %s", b.name, err, core.AsError(err).Details, b.reason)
		}
	}

	// Each volume is decided on: read-only needs compute:sandboxes:read,
	// read-write compute:sandboxes:manage.
	if _, err := e.admin.PutPolicy(ctx, iam.PutPolicyInput{TenantID: "acme", Name: "template-makers", Cedar: `permit (principal in Group::"template-makers", action == Action::"compute:sandboxes:manage", resource is Resource)
when { resource.type == "compute-tenant" && resource.tenantId == principal.tenantId };
permit (principal in Group::"template-makers", action == Action::"compute:sandboxes:read", resource is Resource)
when { resource.tenantId == principal.tenantId };`}); err != nil {
		t.Fatal(err)
	}
	maker := e.client(e.person("acme", "tim", []string{"template-makers"}))
	mk := func(c *api.Client, name string, readOnly bool) (sandboxes.Template, error) {
		return sandboxes.CreateTemplate.Call(ctx, c, sandboxes.TemplateInput{TenantID: "acme", Name: name, PoolID: p.ID,
			FlavorID: flavor["small"], ImageID: image, Volumes: []sandboxes.MountInput{{VolumeID: v1.ID, MountPath: "/data", ReadOnly: readOnly}}})
	}
	if _, err := mk(maker, "rw", false); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("a read-write mount by a reader = %v", err)
	}
	if ro, err := mk(maker, "ro", true); err != nil || len(ro.Volumes) != 1 || !ro.Volumes[0].ReadOnly {
		t.Fatalf("a read-only mount by a reader = %+v, %v", ro, err)
	}
	tpl, err := mk(a, "data", false)
	if err != nil || !slices.Equal(tpl.Volumes, []sandboxes.TemplateVolume{{VolumeID: v1.ID, MountPath: "/data"}}) {
		t.Fatalf("template = %+v, %v", tpl, err)
	}

	// Its sandbox runs on the volume's host with the mount.
	s, err := sandboxes.Create.Call(ctx, a, sandboxes.CreateInput{TenantID: "acme", IdempotencyKey: "s-vol", TemplateID: tpl.ID})
	if err != nil || s.NodeID != v1.NodeID {
		t.Fatalf("sandbox = %+v, %v; want it on %s", s, err, v1.NodeID)
	}
	_, spec, err = nodesdomain.Spec(ctx, e.store.Pool, v1.NodeID)
	i := slices.IndexFunc(spec.Instances, func(in nodespec.Instance) bool { return in.ID == s.InstanceID })
	if err != nil || i < 0 || !slices.Equal(spec.Instances[i].Mounts, []nodespec.Mount{{VolumeID: v1.ID, Path: "/data"}}) {
		t.Fatalf("the host's spec instances = %+v, %v", spec.Instances, err)
	}

	// A warm pool's workloads live on the volume's host too, mounting it.
	warmTpl, err := sandboxes.CreateTemplate.Call(ctx, a, sandboxes.TemplateInput{TenantID: "acme", Name: "warm", PoolID: p.ID,
		FlavorID: flavor["small"], ImageID: image, WarmPoolSize: 1, Volumes: []sandboxes.MountInput{{VolumeID: v1.ID, MountPath: "/kb", ReadOnly: true}}})
	if err != nil {
		t.Fatal(err)
	}
	var warm sandboxesdomain.Warm
	if err := e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		warm, err = sandboxesdomain.TopUp(ctx, tx, warmTpl.ID)
		return err
	}); err != nil || len(warm.Placed) != 1 {
		t.Fatalf("top-up = %+v, %v", warm, err)
	}
	if n := e.count(`SELECT count(*) FROM instances WHERE id = $1 AND node_id = $2 AND mounts = $3::jsonb`, warm.Placed[0], v1.NodeID,
		`[{"volumeId": "`+v1.ID+`", "path": "/kb", "readOnly": true}]`); n != 1 {
		t.Fatalf("the warm workload is not on the volume's host with its mount")
	}

	// In use: a live template names it; then (the templates gone) a live
	// workload mounts it.
	del := func(id string) (sandboxes.Volume, error) {
		return sandboxes.DeleteVolume.Call(ctx, a, sandboxes.VolumeInput{TenantID: "acme", VolumeID: id})
	}
	if _, err := del(v1.ID); codeOf(err) != core.CodeInvalidState || core.AsError(err).Details["reason"] != "inUse" {
		t.Fatalf("delete of a template's volume = %v %+v", err, core.AsError(err).Details)
	}
	e.exec(`UPDATE sandbox_templates SET deleted_at = now() WHERE tenant_id = 'acme'`)
	if _, err := del(v1.ID); codeOf(err) != core.CodeInvalidState || core.AsError(err).Details["workloads"] != float64(2) {
		t.Fatalf("delete of a mounted volume = %v %+v", err, core.AsError(err).Details)
	}
	gone, err := del(v2.ID)
	if err != nil || gone.State != "deleting" {
		t.Fatalf("delete = %+v, %v", gone, err)
	}
	if _, spec, _ := nodesdomain.Spec(ctx, e.store.Pool, v2.NodeID); slices.ContainsFunc(spec.Volumes, func(v nodespec.Volume) bool { return v.ID == v2.ID }) {
		t.Fatalf("the deleted volume's host still lists %+v", spec.Volumes)
	}
	observe()
	// Read once more (its read decision cached) it is deleted; listed no more.
	if got, err := sandboxes.GetVolume.Call(ctx, a, sandboxes.VolumeInput{TenantID: "acme", VolumeID: v2.ID}); (err != nil && codeOf(err) != core.CodeNotFound) || (err == nil && got.State != "deleted") {
		t.Fatalf("get of a deleted volume = %+v, %v", got, err)
	}
	if l, err := sandboxes.ListVolumes.Call(ctx, a, sandboxes.VolumeListInput{TenantID: "acme"}); err != nil || !slices.Equal(ids(l), []string{v1.ID}) {
		t.Fatalf("list after the delete = %v, %v", ids(l), err)
	}
}
