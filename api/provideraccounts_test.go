package api_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/flavors"
	"github.com/better-compute/better-compute/api/pools"
	pa "github.com/better-compute/better-compute/api/provideraccounts"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/drivers/providers"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/secrets"
)

// fixedProviders is a providers.Factory whose Providers answer from fixed
// data, for the offers mapping (the godo driver and its fake provider are
// tested on their own); fail, when set, is every call's error.
type fixedProviders struct {
	mu     sync.Mutex
	opened []providers.Credential
	fail   error
}

func (f *fixedProviders) Open(_ context.Context, c providers.Credential) (providers.Provider, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opened = append(f.opened, c)
	return fixedProvider{f: f}, nil
}

func (f *fixedProviders) setFail(err error) {
	f.mu.Lock()
	f.fail = err
	f.mu.Unlock()
}

func (f *fixedProviders) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fail
}

func (f *fixedProviders) lastOpened() providers.Credential {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.opened[len(f.opened)-1]
}

type fixedProvider struct {
	providers.Provider // the machine calls: offers never makes them
	f                  *fixedProviders
}

func (fixedProvider) Kind() string { return "digitalocean" }

func (p fixedProvider) Regions(context.Context) ([]providers.Region, error) {
	return []providers.Region{
		{Slug: "nyc3", Name: "New York 3", Available: true, Sizes: []string{"s-1vcpu-1gb", "g-2vcpu-8gb"}},
		{Slug: "ams3", Name: "Amsterdam 3", Available: true, Sizes: []string{"s-1vcpu-1gb"}},
		{Slug: "sgp1", Name: "Singapore 1", Available: true, Sizes: []string{"s-1vcpu-1gb", "gpu-h100x1-80gb"}},
	}, p.f.err()
}

func (p fixedProvider) Sizes(context.Context) ([]providers.Size, error) {
	return []providers.Size{
		{Slug: "s-1vcpu-1gb", VCPU: 1, MemoryMiB: 1024, DiskGiB: 25, PriceHourly: 0.00893, PriceMonthly: 6, Regions: []string{"nyc3", "ams3", "sgp1"}, Available: true},
		{Slug: "g-2vcpu-8gb", VCPU: 2, MemoryMiB: 8192, DiskGiB: 25, PriceHourly: 0.09375, PriceMonthly: 63, Regions: []string{"nyc3"}, Available: true},
		{Slug: "gpu-h100x1-80gb", VCPU: 20, MemoryMiB: 240 * 1024, DiskGiB: 720, GPUs: 1, GPUModel: "H100", PriceHourly: 3.39, PriceMonthly: 2522.16, Regions: []string{"sgp1"}, Available: true},
	}, p.f.err()
}

func (p fixedProvider) Images(context.Context) ([]providers.Image, error) {
	return []providers.Image{
		{ID: "1001", Slug: "ubuntu-24-04-x64", Name: "24.04 (LTS) x64", Distribution: "Ubuntu", Regions: []string{"nyc3", "ams3", "sgp1"}},
		{ID: "1002", Slug: "debian-12-x64", Name: "12 x64", Distribution: "Debian", Regions: []string{"sgp1"}},
	}, p.f.err()
}

// providersEnv is the API with a provider factory.
type providersEnv struct {
	*env
	providers *fixedProviders
}

func newProvidersEnv(t *testing.T) *providersEnv {
	t.Helper()
	e := newEnv(t)
	pe := &providersEnv{env: e, providers: &fixedProviders{}}
	srv, err := api.New(api.Deps{Store: e.store, IAM: e.outer, Catalog: e.catalog, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Secrets: e.vault, Providers: pe.providers})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	e.server, e.url = srv, hs.URL
	return pe
}

// The token the tests' secrets hold: shaped like a DigitalOcean token, so
// the raw-token checks would catch it anywhere but in the vault.
const doToken = "dop_v1_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func (e *env) putSecret(tenant, name, value string) string {
	e.t.Helper()
	ctx := context.Background()
	var ref string
	if err := e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		s, err := e.vault.Put(ctx, tx, secrets.PutRequest{TenantID: tenant, Name: name, Scope: "tenant", Value: value, By: "idn_x"})
		ref = s.Ref
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	return ref
}

func TestProviderAccountsLifecycle(t *testing.T) {
	e := newProvidersEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	ref := e.putSecret("acme", "do-token", doToken)
	globexRef := e.putSecret("globex", "do-token", doToken)

	// Bad input: the schema's, then the domain's rules; nothing is written.
	e.wantInvalid(e.boot.UserToken, "providerAccounts.create", map[string]string{
		`{"tenantId":"acme","name":"do","credentialRef":"` + ref + `"}`:                                                          "provider",
		`{"tenantId":"acme","provider":"aws","name":"do","credentialRef":"` + ref + `"}`:                                         "provider",
		`{"tenantId":"acme","provider":"digitalocean","name":"do","credentialRef":"` + doToken + `"}`:                            "credentialRef",
		`{"tenantId":"acme","provider":"digitalocean","name":"do","credentialRef":"secret://acme/` + doToken[:40] + `"}`:         "credentialRef",
		`{"tenantId":"acme","provider":"digitalocean","name":"do","credentialRef":"secret://acme/missing"}`:                      "credentialRef",
		`{"tenantId":"acme","provider":"digitalocean","name":"do","credentialRef":"` + globexRef + `"}`:                          "credentialRef",
		`{"tenantId":"acme","provider":"digitalocean","name":"do","credentialRef":"` + ref + `","baseUrl":"http://127.0.0.1:1"}`: "baseUrl",
		`{"tenantId":"acme","provider":"digitalocean","name":"do","credentialRef":"` + ref + `","regions":["nyc3","nyc3"]}`:      "regions.1",
		`{"tenantId":"acme","provider":"digitalocean","name":"do","credentialRef":"` + ref + `","regions":["NYC3"]}`:             "regions.0",
		`{"tenantId":"acme","provider":"digitalocean","name":"Do!","credentialRef":"` + ref + `"}`:                               "name",
	})
	reasons := []struct {
		name, body, field, reason string
	}{
		{"a token where the reference goes", `"credentialRef":"secret://acme/` + doToken[:40] + `"`, "credentialRef", "rawToken"},
		{"another tenant's secret", `"credentialRef":"` + globexRef + `"`, "credentialRef", "secretNotFound"},
		{"a missing secret", `"credentialRef":"secret://acme/missing"`, "credentialRef", "secretNotFound"},
		{"an address override outside the root tenant", `"credentialRef":"` + ref + `","baseUrl":"http://127.0.0.1:1"`, "baseUrl", "baseUrl"},
	}
	for _, tc := range reasons {
		status, out := e.call(e.boot.UserToken, "providerAccounts.create", `{"tenantId":"acme","provider":"digitalocean","name":"do",`+tc.body+`}`)
		if status != 400 || !strings.Contains(out, `"field":"`+tc.field+`"`) || !strings.Contains(out, `"reason":"`+tc.reason+`"`) {
			t.Errorf("%s: %d %s; want INVALID_INPUT %s/%s", tc.name, status, out, tc.field, tc.reason)
		}
		if strings.Contains(out, doToken[:40]) {
			t.Errorf("%s: the answer echoes the token: %s", tc.name, out)
		}
	}
	var n int
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM provider_accounts`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("refused creates wrote %d accounts (%v)", n, err)
	}

	a, err := pa.Create.Call(ctx, c, pa.CreateInput{TenantID: "acme", Provider: "digitalocean", Name: "do", CredentialRef: ref,
		Regions: []string{"nyc3", "ams3"}})
	if err != nil {
		t.Fatal(err)
	}
	if !core.ValidID("pacct", a.ID) || a.TenantID != "acme" || a.CredentialRef != ref || len(a.Regions) != 2 || a.Previews ||
		a.BaseURL != "" || a.CreatedBy != e.boot.UserIdentityID || a.CreatedAt == 0 || a.DeletedAt != 0 {
		t.Fatalf("created %+v", a)
	}
	if got := e.decidedOn("providerAccounts.create", "acme"); got != "compute-tenant/acme" {
		t.Fatalf("a tenant's account was decided on %s", got)
	}
	if row, err := store.GetAuthzResource(ctx, e.store.Pool, "compute-provider-account", a.ID); err != nil || row.TenantID != "acme" || len(row.SharedWith) != 0 {
		t.Fatalf("authz row = %+v, %v", row, err)
	}
	if _, err := pa.Create.Call(ctx, c, pa.CreateInput{TenantID: "acme", Provider: "digitalocean", Name: "do", CredentialRef: ref}); codeOf(err) != core.CodeConflict {
		t.Fatalf("a taken name = %v, want CONFLICT", err)
	}
	if got, err := pa.Get.Call(ctx, c, pa.AccountInput{TenantID: "acme", ProviderAccountID: a.ID}); err != nil || got.ID != a.ID || got.Name != "do" {
		t.Fatalf("get = %+v, %v", got, err)
	}
	if list, err := pa.List.Call(ctx, c, rpc.TenantListInput{TenantID: "acme"}); err != nil || len(list.Items) != 1 || list.Items[0].ID != a.ID {
		t.Fatalf("list = %+v, %v", list, err)
	}

	// update changes what it names and keeps the rest; its rules are create's.
	name, yes := "do-main", true
	up, err := pa.Update.Call(ctx, c, pa.UpdateInput{TenantID: "acme", ProviderAccountID: a.ID, Name: &name, Previews: &yes, Regions: &[]string{}})
	if err != nil || up.Name != "do-main" || !up.Previews || len(up.Regions) != 0 || up.CredentialRef != ref || up.UpdatedAt < a.UpdatedAt {
		t.Fatalf("update = %+v, %v", up, err)
	}
	for field, body := range map[string]string{
		"baseUrl":       `"baseUrl":"http://127.0.0.1:1"`,
		"credentialRef": `"credentialRef":"` + globexRef + `"`,
	} {
		status, out := e.call(e.boot.UserToken, "providerAccounts.update", `{"tenantId":"acme","providerAccountId":"`+a.ID+`",`+body+`}`)
		if status != 400 || !strings.Contains(out, `"field":"`+field+`"`) {
			t.Errorf("update of %s = %d %s", field, status, out)
		}
	}

	// The root tenant's accounts are the fleet's, decided on compute-fleet;
	// only they may send the credential to another address.
	rootRef := e.putSecret(api.DefaultRootTenant, "do-fleet", doToken)
	root, err := pa.Create.Call(ctx, e.client(e.boot.AdminToken), pa.CreateInput{TenantID: api.DefaultRootTenant, Provider: "digitalocean",
		Name: "fleet", CredentialRef: rootRef, BaseURL: "http://127.0.0.1:9/v2"})
	if err != nil || root.BaseURL != "http://127.0.0.1:9/v2" {
		t.Fatalf("root's account = %+v, %v", root, err)
	}
	if got := e.decidedOn("providerAccounts.create", api.DefaultRootTenant); got != "compute-fleet/global" {
		t.Fatalf("the fleet's account was decided on %s", got)
	}
	for _, bad := range []string{"ftp://x", "http://user:pw@x", "http://x/?token=1", "http://x/#f"} {
		status, out := e.call(e.boot.AdminToken, "providerAccounts.update",
			fmt.Sprintf(`{"tenantId":%q,"providerAccountId":%q,"baseUrl":%q}`, api.DefaultRootTenant, root.ID, bad))
		if status != 400 || !strings.Contains(out, `"field":"baseUrl"`) {
			t.Errorf("baseUrl %q = %d %s", bad, status, out)
		}
	}

	// The token is nowhere but sealed in the vault.
	var leaked int
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM provider_accounts p WHERE p::text LIKE '%' || $1 || '%'`, doToken[7:30]).Scan(&leaked); err != nil || leaked != 0 {
		t.Fatalf("%d account rows hold the token (%v)", leaked, err)
	}

	// delete refuses while a live pool names the account.
	s := e.site(e.boot.UserToken, "acme", "do-nyc", "custom")
	pool, err := pools.Create.Call(ctx, c, pools.CreateInput{TenantID: "acme", SiteID: s.ID, Name: "droplets", Class: "provider",
		GPUModel: "H100", GPUMemoryGb: 80, ProviderAccountID: a.ID})
	if err != nil {
		t.Fatal(err)
	}
	status, out := e.call(e.boot.UserToken, "providerAccounts.delete", `{"tenantId":"acme","providerAccountId":"`+a.ID+`"}`)
	if status != 409 || !strings.Contains(out, `"INVALID_STATE"`) || !strings.Contains(out, `"reason":"pools"`) {
		t.Fatalf("delete of an account a pool uses = %d %s", status, out)
	}
	if _, err := pools.Archive.Call(ctx, c, pools.PoolInput{TenantID: "acme", PoolID: pool.ID}); err != nil {
		t.Fatal(err)
	}
	gone, err := pa.Delete.Call(ctx, c, pa.AccountInput{TenantID: "acme", ProviderAccountID: a.ID})
	if err != nil || gone.DeletedAt == 0 {
		t.Fatalf("delete = %+v, %v", gone, err)
	}
	for what, call := range map[string]func() error{
		"get": func() error {
			_, err := pa.Get.Call(ctx, c, pa.AccountInput{TenantID: "acme", ProviderAccountID: a.ID})
			return err
		},
		"delete": func() error {
			_, err := pa.Delete.Call(ctx, c, pa.AccountInput{TenantID: "acme", ProviderAccountID: a.ID})
			return err
		},
		"update": func() error {
			_, err := pa.Update.Call(ctx, c, pa.UpdateInput{TenantID: "acme", ProviderAccountID: a.ID, Name: &name})
			return err
		},
	} {
		if err := call(); codeOf(err) != core.CodeNotFound {
			t.Errorf("%s of a deleted account = %v, want NOT_FOUND", what, err)
		}
	}
	// Its name is free again.
	if _, err := pa.Create.Call(ctx, c, pa.CreateInput{TenantID: "acme", Provider: "digitalocean", Name: "do-main", CredentialRef: ref}); err != nil {
		t.Fatalf("the deleted account's name: %v", err)
	}
}

// Another tenant's account is NOT_FOUND exactly like a missing one, for
// every method; a list keeps only the caller's own.
func TestProviderAccountsAcrossTenants(t *testing.T) {
	e := newProvidersEnv(t)
	ctx := context.Background()
	ref := e.putSecret("acme", "do-token", doToken)
	a, err := pa.Create.Call(ctx, e.client(e.boot.UserToken), pa.CreateInput{TenantID: "acme", Provider: "digitalocean", Name: "do", CredentialRef: ref})
	if err != nil {
		t.Fatal(err)
	}
	missing := core.NewID("pacct")
	for _, method := range []string{"get", "offers", "update", "delete"} {
		extra := ""
		if method == "update" {
			extra = `,"name":"mine"`
		}
		var bodies []string
		for _, id := range []string{a.ID, missing} {
			status, out := e.call(e.globex, "providerAccounts."+method, `{"tenantId":"globex","providerAccountId":"`+id+`"`+extra+`}`)
			if status != 404 {
				t.Errorf("globex %s of %s = %d %s, want 404", method, id, status, out)
			}
			bodies = append(bodies, strings.ReplaceAll(out, id, "ID"))
		}
		if bodies[0] != bodies[1] {
			t.Errorf("globex %s: acme's account answers %s, a missing one %s", method, bodies[0], bodies[1])
		}
	}
	if list, err := pa.List.Call(ctx, e.client(e.globex), rpc.TenantListInput{TenantID: "globex"}); err != nil || len(list.Items) != 0 {
		t.Fatalf("globex lists %+v, %v", list, err)
	}
	if got, err := pa.Get.Call(ctx, e.client(e.boot.UserToken), pa.AccountInput{TenantID: "acme", ProviderAccountID: a.ID}); err != nil || got.Name != "do" {
		t.Fatalf("acme's account after globex's calls = %+v, %v", got, err)
	}
	if len(e.providers.opened) != 0 {
		t.Fatalf("globex's offers opened a provider: %d", len(e.providers.opened))
	}
}

func TestProviderAccountsOffers(t *testing.T) {
	e := newProvidersEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	ref := e.putSecret("acme", "do-token", doToken)
	a, err := pa.Create.Call(ctx, c, pa.CreateInput{TenantID: "acme", Provider: "digitalocean", Name: "do", CredentialRef: ref,
		Regions: []string{"nyc3", "ams3"}})
	if err != nil {
		t.Fatal(err)
	}
	s := e.site(e.boot.UserToken, "acme", "do-nyc", "custom")
	pool, err := pools.Create.Call(ctx, c, pools.CreateInput{TenantID: "acme", SiteID: s.ID, Name: "droplets", Class: "provider",
		GPUModel: "H100", GPUMemoryGb: 80, ProviderAccountID: a.ID})
	if err != nil {
		t.Fatal(err)
	}
	flavor := func(name, size string, vcpu int, mem float64, disk int) flavors.Flavor {
		f, err := flavors.Create.Call(ctx, c, flavors.CreateInput{TenantID: "acme", PoolID: pool.ID, Name: name, ProviderSize: size,
			VCPU: vcpu, MemoryGiB: mem, DiskGiB: disk})
		if err != nil {
			t.Fatalf("flavor %s: %v", name, err)
		}
		return f
	}
	small := flavor("small", "s-1vcpu-1gb", 1, 1, 25)
	wrong := flavor("general", "g-2vcpu-8gb", 2, 4, 25)    // the size has 8 GiB
	gpu := flavor("h100", "gpu-h100x1-80gb", 20, 240, 720) // offered only in sgp1

	got, err := pa.Offers.Call(ctx, c, pa.AccountInput{TenantID: "acme", ProviderAccountID: a.ID})
	if err != nil {
		t.Fatal(err)
	}
	if cred := e.providers.lastOpened(); cred.Token != doToken || cred.Kind != "digitalocean" || cred.BaseURL != "" {
		t.Fatalf("the provider was opened with kind %q, base %q and the right token: %v", cred.Kind, cred.BaseURL, cred.Token == doToken)
	}
	var regions, sizes, images []string
	for _, r := range got.Regions {
		regions = append(regions, r.Slug)
	}
	for _, s := range got.Sizes {
		sizes = append(sizes, s.Slug+":"+strings.Join(s.Regions, "+"))
	}
	for _, im := range got.Images {
		images = append(images, im.Slug+":"+strings.Join(im.Regions, "+"))
	}
	if strings.Join(regions, ",") != "nyc3,ams3" || strings.Join(sizes, ",") != "s-1vcpu-1gb:nyc3+ams3,g-2vcpu-8gb:nyc3" ||
		strings.Join(images, ",") != "ubuntu-24-04-x64:nyc3+ams3" {
		t.Fatalf("offers narrowed to the account's regions: regions %v, sizes %v, images %v", regions, sizes, images)
	}
	first := got.Sizes[0]
	if first.Shape != (pa.Shape{VCPU: 1, MemoryGiB: 1, DiskGiB: 25}) || first.PriceMonthly != 6 || first.PriceHourly != 0.00893 ||
		len(first.Flavors) != 1 || first.Flavors[0].FlavorID != small.ID || !first.Flavors[0].Matches || first.Flavors[0].PoolID != pool.ID {
		t.Fatalf("the small size = %+v", first)
	}
	if second := got.Sizes[1]; second.Shape.MemoryGiB != 8 || len(second.Flavors) != 1 || second.Flavors[0].FlavorID != wrong.ID || second.Flavors[0].Matches {
		t.Fatalf("a flavor whose shape is not its size's = %+v", second)
	}
	if len(got.UnmatchedFlavors) != 1 || got.UnmatchedFlavors[0].FlavorID != gpu.ID {
		t.Fatalf("unmatched = %+v; want the h100 flavor, whose size is not in the account's regions", got.UnmatchedFlavors)
	}
	// The resolution is recorded, for the account, with the caller.
	var purpose, kind, who, resource string
	if err := e.store.Pool.QueryRow(ctx, `SELECT purpose, identity_kind, identity_id, resource_id FROM secret_resolutions
		WHERE tenant_id = 'acme' AND name = 'do-token'`).Scan(&purpose, &kind, &who, &resource); err != nil ||
		purpose != pa.OffersPurpose || who != e.boot.UserIdentityID || resource != a.ID || kind == "" {
		t.Fatalf("resolution = %s %s %s %s, %v", purpose, kind, who, resource, err)
	}

	// Provider failures are UNAVAILABLE; a rate limit says when to retry;
	// the token never shows.
	retryAt := time.UnixMilli(time.Now().Add(time.Minute).UnixMilli())
	for _, tc := range []struct {
		name   string
		err    error
		reason string
	}{
		{"rate limited", fmt.Errorf("sizes: %w", &providers.RateLimited{RetryAt: retryAt}), "rateLimited"},
		{"unavailable", fmt.Errorf("sizes: %w", providers.ErrUnavailable), "providerUnavailable"},
		{"refused", fmt.Errorf("sizes: %w", providers.ErrRefused), "providerRefused"},
		{"anything else", errors.New("connection reset"), "providerUnavailable"},
	} {
		e.providers.setFail(tc.err)
		status, out := e.call(e.boot.UserToken, "providerAccounts.offers", `{"tenantId":"acme","providerAccountId":"`+a.ID+`"}`)
		if status != 503 || !strings.Contains(out, `"UNAVAILABLE"`) || !strings.Contains(out, `"reason":"`+tc.reason+`"`) {
			t.Errorf("%s: %d %s", tc.name, status, out)
		}
		if tc.reason == "rateLimited" && !strings.Contains(out, fmt.Sprintf(`"retryAt":%d`, retryAt.UnixMilli())) {
			t.Errorf("%s: no retryAt %d in %s", tc.name, retryAt.UnixMilli(), out)
		}
		if strings.Contains(out, doToken[7:30]) {
			t.Errorf("%s: the answer holds the token", tc.name)
		}
	}
}

// Without a provider factory offers is UNAVAILABLE, before any resolution.
func TestProviderAccountsOffersWithoutProviders(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ref := e.putSecret("acme", "do-token", doToken)
	a, err := pa.Create.Call(ctx, e.client(e.boot.UserToken), pa.CreateInput{TenantID: "acme", Provider: "digitalocean", Name: "do", CredentialRef: ref})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pa.Offers.Call(ctx, e.client(e.boot.UserToken), pa.AccountInput{TenantID: "acme", ProviderAccountID: a.ID}); codeOf(err) != core.CodeUnavailable {
		t.Fatalf("offers without providers = %v, want UNAVAILABLE", err)
	}
	var n int
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM secret_resolutions`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d resolutions (%v)", n, err)
	}
}
