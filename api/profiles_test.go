package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/api/profiles"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	coreprofiles "github.com/better-compute/better-compute/core/profiles"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	imagestore "github.com/better-compute/better-compute/store/images"
	metalstore "github.com/better-compute/better-compute/store/metal"
	nodestore "github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/secrets"
)

// profileImage writes an available image row of tenant directly: the
// profiles' tests need rows, not the registration path.
func (e *env) profileImage(tenant, name, version string) string {
	e.t.Helper()
	id := core.NewID(imagestore.IDPrefix)
	if _, err := e.store.Pool.Exec(context.Background(), `INSERT INTO images
		(id, tenant_id, name, version, format, sha256, size_bytes, state, created_by)
		VALUES ($1, $2, $3, $4, 'raw', $5, 4096, 'available', 'idn_x')`, id, tenant, name, version, strings.Repeat("c", 64)); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// metalNodeForProfiles enrolls a bare-metal node of acme in a pool of its
// own, through the store (the metal methods' BMC checks are not what the
// profiles test).
func (e *env) metalNodeForProfiles() string {
	e.t.Helper()
	ctx := context.Background()
	site, pool := core.NewID("site"), core.NewID("pool")
	if _, err := e.store.Pool.Exec(ctx, `INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by)
		VALUES ($1, 'acme', $1, 'eu', 'eu-west', 'custom', 'idn_x')`, site); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.store.Pool.Exec(ctx, `INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, created_by)
		VALUES ($1, 'acme', $2, $1, 'metal-host', 'H100', 80, 'bcd', 'idn_x')`, pool, site); err != nil {
		e.t.Fatal(err)
	}
	var id string
	err := e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		n, err := metalstore.Enroll(ctx, tx, nodestore.TypesOf(e.catalog), metalstore.Enrollment{TenantID: "acme", PoolID: pool, Name: "m1",
			BMC: metalstore.BMC{Redfish: &metalstore.RedfishEndpoint{Address: "https://127.0.0.1:8443", Username: "admin",
				PasswordSecret: "secret://acme/bmc"}, BootMAC: "52:54:00:00:00:01"},
			RootTenant: "root", By: "idn_x"})
		id = n.Node.ID
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

func problemAt(ps []profiles.Problem, field, reason string) bool {
	return slices.ContainsFunc(ps, func(p profiles.Problem) bool { return p.Field == field && p.Reason == reason })
}

func TestProfilesLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	doc := `{"target":"metal","image":{"name":"debian","version":"12"},"userData":"secret://acme/cloud-init",
		"hostConfig":{"hostname":"{{ .node.name }}.lab"}}`

	// The document's schema refuses unknown fields and names them.
	e.wantInvalid(e.boot.UserToken, "profiles.create", map[string]string{
		`{"tenantId":"acme","name":"p","document":{"target":"metal","image":{"name":"d","version":"1"},"colour":"red"}}`:                       "document.colour",
		`{"tenantId":"acme","name":"p","document":{"image":{"name":"d","version":"1"}}}`:                                                       "document.target",
		`{"tenantId":"acme","name":"p","document":{"target":"metal","image":{"name":"d","version":"1"},"hostConfig":{"hostname":"{{ .node"}}}`: "document.hostConfig.hostname",
		`{"tenantId":"acme","name":"P!","document":{"target":"metal","image":{"name":"d","version":"1"}}}`:                                     "name",
	})

	p, err := profiles.Create.Call(ctx, c, profiles.CreateInput{TenantID: "acme", Name: "debian", Document: json.RawMessage(doc)})
	if err != nil {
		t.Fatal(err)
	}
	if !core.ValidID("prof", p.ID) || p.Version != 1 || p.LatestVersion != 1 || len(p.Versions) != 1 || p.CreatedBy != e.boot.UserIdentityID {
		t.Fatalf("created %+v", p)
	}
	if _, err := profiles.Create.Call(ctx, c, profiles.CreateInput{TenantID: "acme", Name: "debian", Document: json.RawMessage(doc)}); codeOf(err) != core.CodeConflict {
		t.Fatalf("a taken name = %v, want CONFLICT", err)
	}

	// validate names the missing image and the missing secret, by field.
	v, err := profiles.Validate.Call(ctx, c, profiles.ValidateInput{TenantID: "acme", ProfileID: p.ID})
	if err != nil || v.Valid || !problemAt(v.Problems, "image", coreprofiles.ReasonNotFound) || !problemAt(v.Problems, "userData", coreprofiles.ReasonNotFound) {
		t.Fatalf("validate = %+v, %v", v, err)
	}
	e.profileImage("acme", "debian", "12")
	if err := e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		_, err := e.vault.Put(ctx, tx, secrets.PutRequest{TenantID: "acme", Name: "cloud-init", Scope: "tenant", Value: "#cloud-config\n", By: "idn_x"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if v, err := profiles.Validate.Call(ctx, c, profiles.ValidateInput{TenantID: "acme", ProfileID: p.ID}); err != nil || !v.Valid || len(v.Problems) != 0 {
		t.Fatalf("validate = %+v, %v", v, err)
	}

	// Against a node: validate and render.
	node := e.metalNodeForProfiles()
	if v, err := profiles.Validate.Call(ctx, c, profiles.ValidateInput{TenantID: "acme", ProfileID: p.ID, NodeID: node}); err != nil || !v.Valid || v.NodeID != node {
		t.Fatalf("validate on the node = %+v, %v", v, err)
	}
	r, err := profiles.Render.Call(ctx, c, profiles.RenderInput{TenantID: "acme", ProfileID: p.ID, NodeID: node})
	if err != nil || r.Context.Hostname != "m1.lab" || r.Context.UserDataSecret != "secret://acme/cloud-init" || r.Context.Image == nil ||
		r.Context.ProfileID != p.ID || r.Context.ProfileVersion != 1 || len(r.Steps) == 0 || r.Steps[0].Name != "check-image" {
		t.Fatalf("render = %+v, %v", r, err)
	}
	if _, err := profiles.Render.Call(ctx, c, profiles.RenderInput{TenantID: "acme", ProfileID: p.ID, NodeID: core.NewID("node")}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("render for a missing node = %v, want NOT_FOUND", err)
	}

	// update always makes a new version; the old one stays as it was.
	up, err := profiles.Update.Call(ctx, c, profiles.UpdateInput{TenantID: "acme", ProfileID: p.ID,
		Document: json.RawMessage(`{"target":"metal","image":{"name":"debian","version":"13"}}`)})
	if err != nil || up.Version != 2 || up.LatestVersion != 2 || len(up.Versions) != 2 {
		t.Fatalf("update = %+v, %v", up, err)
	}
	old, err := profiles.Get.Call(ctx, c, profiles.GetInput{TenantID: "acme", ProfileID: p.ID, Version: 1})
	if err != nil || old.Version != 1 || !strings.Contains(string(old.Document), `"12"`) || old.LatestVersion != 2 {
		t.Fatalf("get version 1 = %+v, %v", old, err)
	}
	latest, err := profiles.Get.Call(ctx, c, profiles.GetInput{TenantID: "acme", ProfileID: p.ID})
	if err != nil || latest.Version != 2 || !strings.Contains(string(latest.Document), `"13"`) {
		t.Fatalf("get = %+v, %v", latest, err)
	}
	// Version 2's image is missing: validate says so, render refuses naming it.
	if v, err := profiles.Validate.Call(ctx, c, profiles.ValidateInput{TenantID: "acme", ProfileID: p.ID}); err != nil || v.Valid || v.Version != 2 {
		t.Fatalf("validate version 2 = %+v, %v", v, err)
	}
	status, out := e.call(e.boot.UserToken, "profiles.render", `{"tenantId":"acme","profileId":"`+p.ID+`","nodeId":"`+node+`"}`)
	if status != 404 || !strings.Contains(out, `"field":"image"`) {
		t.Fatalf("render of version 2 = %d %s", status, out)
	}

	// list follows the list recipe; delete asks the workflow store
	// whether a live workflow runs the profile (none here).
	if list, err := profiles.List.Call(ctx, c, rpc.TenantListInput{TenantID: "acme"}); err != nil || len(list.Items) != 1 || list.Items[0].ID != p.ID {
		t.Fatalf("list = %+v, %v", list, err)
	}
	if _, err := profiles.Delete.Call(ctx, c, profiles.ProfileInput{TenantID: "acme", ProfileID: p.ID}); err != nil {
		t.Fatalf("delete of a profile no workflow runs = %v", err)
	}
}

// Another tenant's profile is NOT_FOUND, its node too; a list keeps only
// the items the caller may read.
func TestProfilesAcrossTenantsAndListItems(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	var keep string
	for _, name := range []string{"open", "closed"} {
		p, err := profiles.Create.Call(ctx, c, profiles.CreateInput{TenantID: "acme", Name: name,
			Document: json.RawMessage(`{"target":"metal","image":{"name":"debian","version":"12"}}`)})
		if err != nil {
			t.Fatal(err)
		}
		if name == "open" {
			keep = p.ID
		}
	}
	g := e.client(e.globex)
	for name, call := range map[string]func() error{
		"get": func() error {
			_, err := profiles.Get.Call(ctx, g, profiles.GetInput{TenantID: "globex", ProfileID: keep})
			return err
		},
		"validate": func() error {
			_, err := profiles.Validate.Call(ctx, g, profiles.ValidateInput{TenantID: "globex", ProfileID: keep})
			return err
		},
		"update": func() error {
			_, err := profiles.Update.Call(ctx, g, profiles.UpdateInput{TenantID: "globex", ProfileID: keep,
				Document: json.RawMessage(`{"target":"metal","image":{"name":"x","version":"1"}}`)})
			return err
		},
		"delete": func() error {
			_, err := profiles.Delete.Call(ctx, g, profiles.ProfileInput{TenantID: "globex", ProfileID: keep})
			return err
		},
	} {
		if err := call(); codeOf(err) != core.CodeNotFound {
			t.Errorf("globex %s of acme's profile = %v, want NOT_FOUND", name, err)
		}
	}
	if list, err := profiles.List.Call(ctx, g, rpc.TenantListInput{TenantID: "globex"}); err != nil || len(list.Items) != 0 {
		t.Fatalf("globex list = %+v, %v", list, err)
	}
	// A globex profile validated against acme's node: the node is read in
	// globex, so it is NOT_FOUND naming nodeId.
	node := e.metalNodeForProfiles()
	gp, err := profiles.Create.Call(ctx, g, profiles.CreateInput{TenantID: "globex", Name: "mine",
		Document: json.RawMessage(`{"target":"metal","image":{"name":"debian","version":"12"}}`)})
	if err != nil {
		t.Fatal(err)
	}
	status, out := e.call(e.globex, "profiles.validate", `{"tenantId":"globex","profileId":"`+gp.ID+`","nodeId":"`+node+`"}`)
	if status != 404 || !strings.Contains(out, `"field":"nodeId"`) {
		t.Fatalf("validate against another tenant's node = %d %s", status, out)
	}

	policy := fmt.Sprintf(`permit (principal, action in [Action::"compute:profiles:read"], resource is Resource)
when { resource.type == "compute-tenant" || resource.id == %q };`, keep)
	if _, err := e.admin.PutPolicy(ctx, iam.PutPolicyInput{TenantID: "acme", Name: "sam-reads-open", Cedar: policy}); err != nil {
		t.Fatal(err)
	}
	list, err := profiles.List.Call(ctx, e.client(e.stranger), rpc.TenantListInput{TenantID: "acme"})
	if err != nil || len(list.Items) != 1 || list.Items[0].ID != keep {
		t.Fatalf("sam's list = %+v, %v; want only %s", list, err, keep)
	}
	if _, err := profiles.Create.Call(ctx, e.client(e.stranger), profiles.CreateInput{TenantID: "acme", Name: "x",
		Document: json.RawMessage(`{"target":"metal","image":{"name":"debian","version":"12"}}`)}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("sam's create = %v, want ACCESS_DENIED", err)
	}
}
