package api_test

import (
	"context"
	"crypto/sha256"
	"regexp"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/api/sites"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	sitedomain "github.com/better-compute/better-compute/store/sites"
)

// site makes a site in tenant as token.
func (e *env) site(token, tenant, name, kind string) sites.Site {
	e.t.Helper()
	s, err := sites.Create.Call(context.Background(), e.client(token), sites.CreateInput{
		TenantID: tenant, Name: name, Region: "eu-central", IAMRegion: "eu-central-1", Kind: kind})
	if err != nil {
		e.t.Fatalf("sites.create %s/%s: %v", tenant, name, err)
	}
	return s
}

// wantInvalid posts each body to method and wants INVALID_INPUT naming field.
func (e *env) wantInvalid(token, method string, cases map[string]string) {
	e.t.Helper()
	for body, field := range cases {
		status, out := e.call(token, method, body)
		if status != 400 || !strings.Contains(out, `"INVALID_INPUT"`) || !strings.Contains(out, `"field":"`+field+`"`) {
			e.t.Errorf("%s %s = %d %s; want INVALID_INPUT on %s", method, body, status, out, field)
		}
	}
}

func TestSitesLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	if !core.ValidID("site", s.ID) || s.TenantID != "acme" || s.Kind != "custom" || s.Region != "eu-central" ||
		s.IAMRegion != "eu-central-1" || s.CreatedBy != e.boot.UserIdentityID || s.DeletedAt != nil {
		t.Fatalf("created %+v", s)
	}
	// The projection row came with it, with the declared attributes.
	row, err := store.GetAuthzResource(ctx, e.store.Pool, "compute-site", s.ID)
	if err != nil || row.TenantID != "acme" || row.Attributes["region"] != "eu-central" ||
		row.Attributes["iamRegion"] != "eu-central-1" || row.Attributes["kind"] != "custom" {
		t.Fatalf("authz row = %+v, %v", row, err)
	}
	if _, err := sites.Create.Call(ctx, c, sites.CreateInput{TenantID: "acme", Name: "fra-1", Region: "x", IAMRegion: "eu-x", Kind: "custom"}); codeOf(err) != core.CodeConflict {
		t.Fatalf("duplicate name = %v, want CONFLICT", err)
	}
	if got, err := sites.Get.Call(ctx, c, sites.SiteInput{TenantID: "acme", SiteID: s.ID}); err != nil || got != s {
		t.Fatalf("get = %+v, %v", got, err)
	}
	if _, err := sites.Get.Call(ctx, c, sites.SiteInput{TenantID: "acme", SiteID: core.NewID("site")}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("get of a missing site = %v, want NOT_FOUND", err)
	}
	if list, err := sites.List.Call(ctx, c, rpc.TenantListInput{TenantID: "acme"}); err != nil || len(list.Items) != 1 || list.Items[0].ID != s.ID {
		t.Fatalf("list = %+v, %v", list, err)
	}
	name, region := "fra-2", "eu-west"
	up, err := sites.Update.Call(ctx, c, sites.UpdateInput{TenantID: "acme", SiteID: s.ID, Name: &name, Region: &region})
	if err != nil || up.Name != "fra-2" || up.Region != "eu-west" || up.IAMRegion != "eu-central-1" || up.Kind != "custom" {
		t.Fatalf("update = %+v, %v", up, err)
	}
	if row, _ := store.GetAuthzResource(ctx, e.store.Pool, "compute-site", s.ID); row.Attributes["region"] != "eu-west" {
		t.Fatalf("authz row after update = %+v", row)
	}
	if _, err := sites.Update.Call(ctx, c, sites.UpdateInput{TenantID: "acme", SiteID: core.NewID("site"), Name: &name}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("update of a missing site = %v, want NOT_FOUND", err)
	}
	del, err := sites.Delete.Call(ctx, c, sites.SiteInput{TenantID: "acme", SiteID: s.ID})
	if err != nil || del.DeletedAt == nil {
		t.Fatalf("delete = %+v, %v", del, err)
	}
	if _, err := sites.Delete.Call(ctx, c, sites.SiteInput{TenantID: "acme", SiteID: s.ID}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("second delete = %v, want INVALID_STATE", err)
	}
	if _, err := sites.Delete.Call(ctx, c, sites.SiteInput{TenantID: "acme", SiteID: core.NewID("site")}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("delete of a missing site = %v, want NOT_FOUND", err)
	}
	if _, err := sites.Update.Call(ctx, c, sites.UpdateInput{TenantID: "acme", SiteID: s.ID, Name: &name}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("update of a deleted site = %v, want INVALID_STATE", err)
	}
	if got, err := sites.Get.Call(ctx, c, sites.SiteInput{TenantID: "acme", SiteID: s.ID}); err != nil || got.DeletedAt == nil {
		t.Fatalf("get of a deleted site = %+v, %v", got, err)
	}
	if list, err := sites.List.Call(ctx, c, rpc.TenantListInput{TenantID: "acme"}); err != nil || len(list.Items) != 0 {
		t.Fatalf("list after delete = %+v, %v", list, err)
	}
	// The name is free again.
	e.site(e.boot.UserToken, "acme", "fra-2", "custom")
}

func TestSitesInvalidInput(t *testing.T) {
	e := newEnv(t)
	ok := `"tenantId":"acme","name":"fra-1","region":"eu-central","iamRegion":"eu-central-1"`
	e.wantInvalid(e.boot.UserToken, "sites.create", map[string]string{
		`{` + ok + `,"kind":"cloud"}`:            "kind",
		`{` + ok + `}`:                           "kind",
		`{` + ok + `,"kind":"custom","extra":1}`: "extra",
		`{"tenantId":"acme","kind":"custom","name":"Fra_1","region":"eu","iamRegion":"eu-c"}`:     "name",
		`{"tenantId":"acme","kind":"custom","name":"fra","region":"eu","iamRegion":"EU-central"}`: "iamRegion",
		`{"tenantId":"acme","kind":"custom","name":"fra","region":"eu","iamRegion":"europe"}`:     "iamRegion",
		`{"tenantId":"acme","kind":"custom","name":"fra","iamRegion":"eu-c"}`:                     "region",
	})
	site := core.NewID("site")
	e.wantInvalid(e.boot.UserToken, "sites.get", map[string]string{
		`{"tenantId":"acme"}`:                               "siteId",
		`{"tenantId":"acme","siteId":"pool_x"}`:             "siteId",
		`{"tenantId":"acme","siteId":"` + site + `","x":1}`: "x",
	})
	e.wantInvalid(e.boot.UserToken, "sites.list", map[string]string{`{"tenantId":"acme","kind":"custom"}`: "kind"})
	e.wantInvalid(e.boot.UserToken, "sites.update", map[string]string{
		`{"tenantId":"acme","siteId":"` + site + `","kind":"shared"}`: "kind", // the kind never changes
		`{"tenantId":"acme","siteId":"` + site + `","name":""}`:       "name",
	})
	e.wantInvalid(e.boot.UserToken, "sites.delete", map[string]string{`{"tenantId":"acme"}`: "siteId"})
	e.wantInvalid(e.boot.UserToken, "siteTokens.create", map[string]string{
		`{"tenantId":"acme","siteId":"` + site + `","name":"` + strings.Repeat("n", 129) + `"}`: "name",
		`{"tenantId":"acme","siteId":"` + site + `","token":"bcst_x"}`:                          "token",
	})
	e.wantInvalid(e.boot.UserToken, "siteTokens.revoke", map[string]string{
		`{"tenantId":"acme","siteId":"` + site + `"}`:                   "tokenId",
		`{"tenantId":"acme","siteId":"` + site + `","tokenId":"tok_x"}`: "tokenId",
	})
}

// sites.create decides shared and dedicated sites on compute-fleet, which
// resolves only in the root tenant: a tenant's user is denied, the root
// admin may. They are the platform's own: a root caller naming another
// tenant is INVALID_INPUT.
func TestSitesCreateSharedNeedsTheFleet(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, kind := range []string{"shared", "dedicated"} {
		_, err := sites.Create.Call(ctx, e.client(e.boot.UserToken), sites.CreateInput{TenantID: "acme", Name: "s-" + kind, Region: "eu", IAMRegion: "eu-west", Kind: kind})
		if codeOf(err) != core.CodeAccessDenied {
			t.Fatalf("acme user creating a %s site = %v, want ACCESS_DENIED", kind, err)
		}
		s := e.site(e.boot.AdminToken, "root", "s-"+kind, kind)
		if s.TenantID != "root" || s.Kind != kind {
			t.Fatalf("root created %+v", s)
		}
	}
	_, err := sites.Create.Call(ctx, e.client(e.boot.AdminToken), sites.CreateInput{TenantID: "acme", Name: "plat", Region: "eu", IAMRegion: "eu-west", Kind: "shared"})
	if codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("a shared site in acme = %v, want INVALID_INPUT", err)
	}
	// The platform's sites are not in a tenant's view.
	if list, err := sites.List.Call(ctx, e.client(e.boot.UserToken), rpc.TenantListInput{TenantID: "acme"}); err != nil || len(list.Items) != 0 {
		t.Fatalf("acme's list = %+v, %v", list, err)
	}
}

// Another tenant's site is NOT_FOUND in one's own tenant, and a foreign
// tenantId is ACCESS_DENIED before any query or decision.
func TestSitesAcrossTenants(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	g := e.client(e.globex)
	if _, err := sites.Get.Call(ctx, g, sites.SiteInput{TenantID: "globex", SiteID: s.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex get of acme's site = %v, want NOT_FOUND", err)
	}
	name := "mine"
	if _, err := sites.Update.Call(ctx, g, sites.UpdateInput{TenantID: "globex", SiteID: s.ID, Name: &name}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex update = %v, want NOT_FOUND", err)
	}
	if _, err := sites.Delete.Call(ctx, g, sites.SiteInput{TenantID: "globex", SiteID: s.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex delete = %v, want NOT_FOUND", err)
	}
	if _, err := sites.CreateToken.Call(ctx, g, sites.CreateTokenInput{TenantID: "globex", SiteID: s.ID, Name: ""}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex token = %v, want NOT_FOUND", err)
	}
	if list, err := sites.List.Call(ctx, g, rpc.TenantListInput{TenantID: "globex"}); err != nil || len(list.Items) != 0 {
		t.Fatalf("globex list = %+v, %v", list, err)
	}
	if _, err := api.SystemWhoami.Call(ctx, g, rpc.NoInput{}); err != nil { // warm the authentication cache
		t.Fatal(err)
	}
	pool := core.NewID("pool")
	for method, body := range map[string]string{
		"sites.get":         `{"tenantId":"acme","siteId":"` + s.ID + `"}`,
		"sites.delete":      `{"tenantId":"acme","siteId":"` + s.ID + `"}`,
		"siteTokens.create": `{"tenantId":"acme","siteId":"` + s.ID + `"}`,
		"sites.list":        `{"tenantId":"acme"}`,
		"pools.get":         `{"tenantId":"acme","poolId":"` + pool + `"}`,
		"pools.offer":       `{"tenantId":"acme","poolId":"` + pool + `","toTenantId":"globex"}`,
		"quotas.get":        `{"tenantId":"acme"}`,
	} {
		e.outer.reset()
		e.queries.n.Store(0)
		status, out := e.call(e.globex, method, body)
		if status != 403 || !strings.Contains(out, "ACCESS_DENIED") {
			t.Fatalf("foreign %s = %d %s", method, status, out)
		}
		if a, d, q := e.outer.authenticate.Load(), e.outer.decisions(), e.queries.n.Load(); a != 1 || d != 0 || q != 0 {
			t.Fatalf("foreign %s cost %d authenticate, %d decisions, %d queries; want 1, 0, 0", method, a, d, q)
		}
	}
}

var siteTokenPattern = regexp.MustCompile(`^bcst_[a-z2-7]{52}$`)

func TestSiteTokens(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	tok, err := sites.CreateToken.Call(ctx, c, sites.CreateTokenInput{TenantID: "acme", SiteID: s.ID, Name: "agent-1"})
	if err != nil || !core.ValidID("stok", tok.ID) || tok.SiteID != s.ID || tok.Name != "agent-1" || tok.RevokedAt != nil ||
		!siteTokenPattern.MatchString(tok.Token) {
		t.Fatalf("create = %+v, %v", tok, err)
	}
	other, err := sites.CreateToken.Call(ctx, c, sites.CreateTokenInput{TenantID: "acme", SiteID: s.ID, Name: ""})
	if err != nil || other.Token == tok.Token {
		t.Fatalf("second token = %+v, %v", other, err)
	}
	// Only the SHA-256 is stored: no column of any row holds the token.
	var dump string
	if err := e.store.Pool.QueryRow(ctx, `SELECT string_agg(row_to_json(t)::text, ' ') FROM site_tokens t`).Scan(&dump); err != nil {
		t.Fatal(err)
	}
	for _, plain := range []string{tok.Token, other.Token} {
		if strings.Contains(dump, strings.TrimPrefix(plain, "bcst_")) {
			t.Fatalf("site_tokens holds a token in plain text: %s", dump)
		}
	}
	var hash []byte
	if err := e.store.Pool.QueryRow(ctx, `SELECT token_hash FROM site_tokens WHERE id = $1`, tok.ID).Scan(&hash); err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256([]byte(tok.Token)); string(hash) != string(sum[:]) || string(sitedomain.HashToken(tok.Token)) != string(hash) {
		t.Fatalf("stored hash %x is not SHA-256 of the token", hash)
	}
	// Revoke; a revoked token stays revoked, with its first revokedAt.
	rev, err := sites.RevokeToken.Call(ctx, c, sites.RevokeTokenInput{TenantID: "acme", SiteID: s.ID, TokenID: tok.ID})
	if err != nil || rev.RevokedAt == nil || rev.Token != "" {
		t.Fatalf("revoke = %+v, %v", rev, err)
	}
	again, err := sites.RevokeToken.Call(ctx, c, sites.RevokeTokenInput{TenantID: "acme", SiteID: s.ID, TokenID: tok.ID})
	if err != nil || again.RevokedAt == nil || *again.RevokedAt != *rev.RevokedAt {
		t.Fatalf("second revoke = %+v, %v", again, err)
	}
	if _, err := sites.RevokeToken.Call(ctx, c, sites.RevokeTokenInput{TenantID: "acme", SiteID: s.ID, TokenID: core.NewID("stok")}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("revoke of a missing token = %v, want NOT_FOUND", err)
	}
	s2 := e.site(e.boot.UserToken, "acme", "fra-2", "custom")
	if _, err := sites.RevokeToken.Call(ctx, c, sites.RevokeTokenInput{TenantID: "acme", SiteID: s2.ID, TokenID: other.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("revoke through another site = %v, want NOT_FOUND", err)
	}
	if _, err := sites.CreateToken.Call(ctx, c, sites.CreateTokenInput{TenantID: "acme", SiteID: core.NewID("site"), Name: ""}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("token for a missing site = %v, want NOT_FOUND", err)
	}
	// Deleting the site revokes its tokens; a deleted site takes no more.
	if _, err := sites.Delete.Call(ctx, c, sites.SiteInput{TenantID: "acme", SiteID: s.ID}); err != nil {
		t.Fatal(err)
	}
	var live int
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM site_tokens WHERE site_id = $1 AND revoked_at IS NULL`, s.ID).Scan(&live); err != nil || live != 0 {
		t.Fatalf("%d live tokens on a deleted site, %v", live, err)
	}
	if _, err := sites.CreateToken.Call(ctx, c, sites.CreateTokenInput{TenantID: "acme", SiteID: s.ID, Name: ""}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("token for a deleted site = %v, want INVALID_STATE", err)
	}
}
