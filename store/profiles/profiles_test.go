package profiles_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/inventory"
	coreprofiles "github.com/better-compute/better-compute/core/profiles"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/images"
	"github.com/better-compute/better-compute/store/metal"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/profiles"
	"github.com/better-compute/better-compute/store/secrets"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const typ = "compute-profile"

type fixture struct {
	t     *testing.T
	s     *store.Store
	vault *secrets.Vault
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	kek, err := secrets.GenerateKEK()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := secrets.ParseKeyring(kek)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, s: testenv.Store(t), vault: secrets.NewVault(keys, "root")}
}

func (f *fixture) tx(fn func(ctx context.Context, tx store.Tx) error) error {
	return f.s.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error { return fn(context.Background(), tx) })
}

func (f *fixture) must(err error) {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
}

// image writes an image row directly: the profiles need rows, not the
// registration path.
func (f *fixture) image(tenant, name, version, state string, verified bool) string {
	f.t.Helper()
	id := core.NewID(images.IDPrefix)
	signer := ""
	if verified {
		signer = "SHA256:test"
	}
	_, err := f.s.Pool.Exec(context.Background(), `INSERT INTO images
		(id, tenant_id, name, version, format, sha256, size_bytes, state, verified, signer_fingerprint, created_by)
		VALUES ($1, $2, $3, $4, 'raw', $5, 4096, $6, $7, $8, 'idn_x')`,
		id, tenant, name, version, strings.Repeat("b", 64), state, verified, signer)
	f.must(err)
	return id
}

func (f *fixture) create(tenant, name, doc string) profiles.Profile {
	f.t.Helper()
	var p profiles.Profile
	f.must(f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		p, _, err = profiles.Create(ctx, tx, typ, tenant, "idn_alice", name, json.RawMessage(doc))
		return err
	}))
	return p
}

func codeOf(err error) core.Code {
	var ce *core.Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	return ""
}

func detail(err error, key string) any {
	var ce *core.Error
	if errors.As(err, &ce) {
		return ce.Details[key]
	}
	return nil
}

func TestVersionsAreImmutable(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	p := f.create("acme", "debian", `{"target":"metal","image":{"name":"debian","version":"12"}}`)
	if !core.ValidID("prof", p.ID) || p.LatestVersion != 1 || p.Target != "metal" {
		t.Fatalf("created %+v", p)
	}
	// Every update is a new version, the same document too.
	for want := 2; want <= 3; want++ {
		f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
			up, v, err := profiles.Update(ctx, tx, "acme", p.ID, "idn_bob", json.RawMessage(`{"target":"metal","image":{"name":"debian","version":"13"}}`))
			if err == nil && (up.LatestVersion != want || v.Version != want || v.CreatedBy != "idn_bob") {
				t.Errorf("update = %+v %+v", up, v)
			}
			return err
		}))
	}
	// The version rows refuse every change, whoever writes them.
	for _, q := range []string{
		`UPDATE profile_versions SET document = '{}' WHERE profile_id = $1`,
		`DELETE FROM profile_versions WHERE profile_id = $1`,
	} {
		if _, err := f.s.Pool.Exec(ctx, q, p.ID); err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Errorf("%s = %v; want the append-only refusal", q, err)
		}
	}
	if _, err := f.s.Pool.Exec(ctx, `TRUNCATE profile_versions CASCADE`); err == nil {
		t.Errorf("TRUNCATE of the versions went through")
	}
	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		_, v1, err := profiles.GetVersion(ctx, tx, "acme", p.ID, 1)
		if err != nil || !strings.Contains(string(v1.Document), `"12"`) {
			t.Errorf("version 1 = %s, %v", v1.Document, err)
		}
		_, latest, err := profiles.GetVersion(ctx, tx, "acme", p.ID, 0)
		if err != nil || latest.Version != 3 {
			t.Errorf("latest = %+v, %v", latest, err)
		}
		if _, _, err := profiles.GetVersion(ctx, tx, "acme", p.ID, 4); codeOf(err) != core.CodeNotFound || detail(err, "field") != "version" {
			t.Errorf("version 4 = %v", err)
		}
		vs, err := profiles.Versions(ctx, tx, p.ID)
		if err != nil || len(vs) != 3 || vs[0].Version != 1 || vs[2].Version != 3 {
			t.Errorf("versions = %+v, %v", vs, err)
		}
		// Another tenant's profile is NOT_FOUND, as a missing one.
		if _, err := profiles.Get(ctx, tx, "globex", p.ID, false); codeOf(err) != core.CodeNotFound {
			t.Errorf("globex get = %v", err)
		}
		if _, _, err := profiles.Update(ctx, tx, "globex", p.ID, "idn_x", json.RawMessage(`{"target":"metal","image":{"name":"x","version":"1"}}`)); codeOf(err) != core.CodeNotFound {
			t.Errorf("globex update = %v", err)
		}
		// The target never changes.
		if _, _, err := profiles.Update(ctx, tx, "acme", p.ID, "idn_x", json.RawMessage(`{"target":"vps","image":{"name":"x","version":"1"}}`)); codeOf(err) != core.CodeInvalidInput || detail(err, "field") != "document.target" {
			t.Errorf("target change = %v", err)
		}
		return nil
	}))
	// A taken name is CONFLICT; a bad document INVALID_INPUT naming its field.
	_ = f.tx(func(ctx context.Context, tx store.Tx) error {
		_, _, err := profiles.Create(ctx, tx, typ, "acme", "idn_x", "debian", json.RawMessage(`{"target":"metal","image":{"name":"x","version":"1"}}`))
		if codeOf(err) != core.CodeConflict {
			t.Errorf("duplicate = %v", err)
		}
		return err
	})
	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		_, _, err := profiles.Create(ctx, tx, typ, "acme", "idn_x", "other", json.RawMessage(`{"target":"metal","image":{"name":"x","version":"1"},"steps":[{"name":"r","on":"ramdisk","action":"reboot"}]}`))
		if codeOf(err) != core.CodeInvalidInput || detail(err, "field") != "document.steps[0].on" {
			t.Errorf("bad steps = %v %v", err, detail(err, "problems"))
		}
		return nil
	}))
}

func TestCheckNamesMissingImageAndSecret(t *testing.T) {
	f := newFixture(t)
	p := f.create("acme", "p", `{"target":"metal","image":{"name":"nosuch","version":"1"},"userData":"secret://acme/cloud-init"}`)
	foreign := f.image("globex", "theirs", "1", "available", true)
	q := f.create("acme", "q", `{"target":"metal","image":{"id":"`+foreign+`"}}`)
	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		c, err := profiles.Check(ctx, tx, f.vault, "acme", p.ID, 0, nil)
		if err != nil {
			return err
		}
		want := []provisioning.Problem{
			{Field: "image", Reason: coreprofiles.ReasonNotFound},
			{Field: "userData", Reason: coreprofiles.ReasonNotFound},
		}
		for _, w := range want {
			if !slices.ContainsFunc(c.Problems, func(p provisioning.Problem) bool { return p.Field == w.Field && p.Reason == w.Reason }) {
				t.Errorf("problems = %+v; want %s %s", c.Problems, w.Field, w.Reason)
			}
		}
		// Another tenant's private image is as missing as a missing one.
		c, err = profiles.Check(ctx, tx, f.vault, "acme", q.ID, 0, nil)
		if err != nil || len(c.Problems) != 1 || c.Problems[0].Field != "image" || c.Problems[0].Reason != coreprofiles.ReasonNotFound {
			t.Errorf("foreign image: %+v, %v", c.Problems, err)
		}
		return nil
	}))
	// Once the image and the secret exist, the profile has no problem.
	f.image("acme", "nosuch", "1", "available", false)
	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		_, err := f.vault.Put(ctx, tx, secrets.PutRequest{TenantID: "acme", Name: "cloud-init", Scope: "tenant", Value: "#cloud-config\n", By: "idn_alice"})
		return err
	}))
	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		c, err := profiles.Check(ctx, tx, f.vault, "acme", p.ID, 0, nil)
		if err != nil || len(c.Problems) != 0 || c.Image == nil {
			t.Errorf("check = %+v, %v", c, err)
		}
		return nil
	}))
}

// metalNode enrolls a node in a pool of acme's (requireVerified its
// policy's rule) and ingests an inventory for it.
func (f *fixture) metalNode(requireVerified bool) string {
	f.t.Helper()
	ctx := context.Background()
	cat, err := core.DefaultCatalog()
	f.must(err)
	types := nodes.TypesOf(cat)
	site, pool := core.NewID("site"), core.NewID("pool")
	_, err = f.s.Pool.Exec(ctx, `INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by)
		VALUES ($1, 'acme', $1, 'eu', 'eu-west', 'custom', 'idn_x')`, site)
	f.must(err)
	policy := `{}`
	if requireVerified {
		policy = `{"requireVerifiedImages": true}`
	}
	_, err = f.s.Pool.Exec(ctx, `INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, policy, created_by)
		VALUES ($1, 'acme', $2, $1, 'metal-host', 'H100', 80, 'bcd', $3, 'idn_x')`, pool, site, policy)
	f.must(err)
	var id string
	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		n, err := metal.Enroll(ctx, tx, types, metal.Enrollment{TenantID: "acme", PoolID: pool, Name: "gpu-" + strings.ToLower(pool[len(pool)-6:]),
			BMC: metal.BMC{Redfish: &metal.RedfishEndpoint{Address: "https://127.0.0.1:" + "8443", Username: "admin",
				PasswordSecret: "secret://acme/bmc"}, BootMAC: "52:54:00:aa:bb:cc"},
			Labels: map[string]string{"rack": "r7"}, RootTenant: "root", By: "idn_alice"})
		if err != nil {
			return err
		}
		id = n.Node.ID
		inv, err := inventory.Sample("cpu-only.json")
		if err != nil {
			return err
		}
		doc, err := json.Marshal(inv)
		if err != nil {
			return err
		}
		_, err = nodes.Ingest(ctx, tx, types, id, doc)
		return err
	}))
	return id
}

func TestExpand(t *testing.T) {
	f := newFixture(t)
	f.image("acme", "debian", "12", "available", false)
	f.image("acme", "debian", "13", "available", true)
	f.image("acme", "debian", "14", "pending", false)
	node := f.metalNode(false)
	strict := f.metalNode(true)
	plain := f.create("acme", "plain", `{"target":"metal","image":{"name":"debian","version":"12"},
		"hostConfig":{"hostname":"{{ .node.name }}-{{ .node.labels.rack }}"},
		"steps":[{"name":"ramdisk","on":"site","action":"boot-ramdisk"},
			{"name":"write","on":"ramdisk","action":"write-image","args":{"rootDevice":"{{ (index .node.disks 0).name }}"}},
			{"name":"reboot","on":"ramdisk","action":"reboot","await":"rejoin"}]}`)
	verified := f.create("acme", "verified", `{"target":"metal","image":{"name":"debian","version":"12"},"requireVerifiedImage":true}`)
	pending := f.create("acme", "pending", `{"target":"metal","image":{"name":"debian","version":"14"}}`)
	good := f.create("acme", "good", `{"target":"metal","image":{"name":"debian","version":"13"},"requireVerifiedImage":true}`)

	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		tg, err := profiles.TargetForNode(ctx, tx, "acme", node)
		if err != nil {
			return err
		}
		if tg.Kind != "metal" || tg.Node.BootMAC != "52:54:00:aa:bb:cc" || tg.Node.Labels["rack"] != "r7" || len(tg.Node.Disks) == 0 || len(tg.Node.NICs) == 0 {
			t.Errorf("target = %+v", tg)
		}
		if _, err := profiles.TargetForNode(ctx, tx, "globex", node); codeOf(err) != core.CodeNotFound {
			t.Errorf("globex target = %v", err)
		}
		r, err := profiles.Expand(ctx, tx, f.vault, "acme", plain.ID, 0, tg)
		if err != nil {
			return err
		}
		if r.Context.ProfileID != plain.ID || r.Context.ProfileVersion != 1 || r.Context.Image == nil || r.Context.Image.Version != "12" ||
			r.Context.Hostname != tg.Node.Name+"-r7" || len(r.Steps) != 3 || r.Steps[1].Args["rootDevice"] != tg.Node.Disks[0].Name {
			t.Errorf("rendered = %+v", r)
		}
		// Verified only, by the profile or by the pool; available only.
		if _, err := profiles.Expand(ctx, tx, f.vault, "acme", verified.ID, 0, tg); codeOf(err) != core.CodeInvalidState || detail(err, "reason") != coreprofiles.ReasonImageNotVerified || detail(err, "field") != "image" {
			t.Errorf("unverified image = %v", err)
		}
		st, err := profiles.TargetForNode(ctx, tx, "acme", strict)
		if err != nil {
			return err
		}
		if _, err := profiles.Expand(ctx, tx, f.vault, "acme", plain.ID, 0, st); codeOf(err) != core.CodeInvalidState || detail(err, "reason") != coreprofiles.ReasonImageNotVerified {
			t.Errorf("unverified image in a strict pool = %v", err)
		}
		if r, err := profiles.Expand(ctx, tx, f.vault, "acme", good.ID, 0, st); err != nil || !r.Context.RequireVerified || !r.Context.Image.Verified {
			t.Errorf("verified image = %+v, %v", r.Context, err)
		}
		if _, err := profiles.Expand(ctx, tx, f.vault, "acme", pending.ID, 0, tg); codeOf(err) != core.CodeInvalidState || detail(err, "reason") != coreprofiles.ReasonImageNotAvail {
			t.Errorf("pending image = %v", err)
		}
		// Another tenant's profile is NOT_FOUND.
		if _, err := profiles.Expand(ctx, tx, f.vault, "globex", plain.ID, 0, tg); codeOf(err) != core.CodeNotFound {
			t.Errorf("globex expand = %v", err)
		}
		return nil
	}))

	// A profile a live workflow runs is not deleted; one none runs is.
	running := func(n int) profiles.LiveWorkflows {
		return func(ctx context.Context, tx store.Tx, tenantID, profileID string) (int, error) { return n, nil }
	}
	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		if _, err := profiles.Delete(ctx, tx, "acme", plain.ID, running(1)); codeOf(err) != core.CodeInvalidState || detail(err, "reason") != "liveWorkflows" {
			t.Errorf("delete while running = %v", err)
		}
		if _, err := profiles.Delete(ctx, tx, "acme", plain.ID, nil); codeOf(err) != core.CodeUnavailable {
			t.Errorf("delete without the workflow store = %v", err)
		}
		d, err := profiles.Delete(ctx, tx, "acme", plain.ID, running(0))
		if err != nil || d.DeletedAt == nil {
			t.Errorf("delete = %+v, %v", d, err)
		}
		tg, err := profiles.TargetForNode(ctx, tx, "acme", node)
		if err != nil {
			return err
		}
		if _, err := profiles.Expand(ctx, tx, f.vault, "acme", plain.ID, 1, tg); codeOf(err) != core.CodeInvalidState {
			t.Errorf("expand of a deleted profile = %v", err)
		}
		if _, err := profiles.Delete(ctx, tx, "acme", plain.ID, running(0)); codeOf(err) != core.CodeInvalidState {
			t.Errorf("second delete = %v", err)
		}
		return nil
	}))
}
