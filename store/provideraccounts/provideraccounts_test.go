package provideraccounts_test

import (
	"context"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/provideraccounts"
	"github.com/better-compute/better-compute/store/secrets"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const token = "dop_v1_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

type fixture struct {
	t     *testing.T
	s     *store.Store
	vault *secrets.Vault
	m     *provideraccounts.Accounts
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
	v := secrets.NewVault(keys, "root")
	return &fixture{t: t, s: testenv.Store(t), vault: v, m: provideraccounts.NewAccounts(v, "root", "")}
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

// account puts acme's token and makes an account with it.
func (f *fixture) account() provideraccounts.Account {
	f.t.Helper()
	var a provideraccounts.Account
	f.must(f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		s, err := f.vault.Put(ctx, tx, secrets.PutRequest{TenantID: "acme", Name: "do", Scope: "tenant", Value: token, By: "idn_x"})
		if err != nil {
			return err
		}
		a, err = f.m.Create(ctx, tx, provideraccounts.New{TenantID: "acme", Provider: "digitalocean", Name: "do",
			CredentialRef: s.Ref, CreatedBy: "idn_x"})
		return err
	}))
	return a
}

// pool inserts a provider pool of acme naming the account, after ForPool
// (what the pools domain does), in tx.
func pool(ctx context.Context, tx store.Tx, accountID string) error {
	if _, err := provideraccounts.ForPool(ctx, tx, "acme", accountID); err != nil {
		return err
	}
	site := core.NewID("site")
	if _, err := tx.Exec(ctx, `INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by)
		VALUES ($1, 'acme', $1, 'nyc', 'us-east', 'custom', 'idn_x')`, site); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, provider_account_id, created_by)
		VALUES ($1, 'acme', $2, $1, 'provider', 'H100', 80, 'none', $3, 'idn_x')`, core.NewID("pool"), site, accountID)
	return err
}

func TestCheck(t *testing.T) {
	ref := "secret://acme/do"
	for _, tc := range []struct {
		name                           string
		tenant, credentialRef, baseURL string
		regions                        []string
		field, reason                  string
	}{
		{"valid", "acme", ref, "", []string{"nyc3", "ams3"}, "", ""},
		{"the root tenant's override", "root", "secret://root/do", "https://fake.example:8443/", nil, "", ""},
		{"a prefixed token as the reference's name", "acme", "secret://acme/" + token[:30], "", nil, "credentialRef", "rawToken"},
		{"a bare 64-hex token in a region", "acme", ref, "", []string{strings.Repeat("ab", 32)}, "regions.0", "rawToken"},
		{"a token in the address", "root", "secret://root/do", "https://x/" + token, nil, "baseUrl", "rawToken"},
		{"not a reference", "acme", "vault://acme/do", "", nil, "credentialRef", "secretRef"},
		{"an override outside the root tenant", "acme", ref, "https://x", nil, "baseUrl", "baseUrl"},
		{"an address with credentials", "root", "secret://root/do", "https://u:p@x", nil, "baseUrl", "url"},
		{"an address with a query", "root", "secret://root/do", "https://x/?a=1", nil, "baseUrl", "url"},
		{"not http", "root", "secret://root/do", "file:///etc/passwd", nil, "baseUrl", "url"},
		{"a repeated region", "acme", ref, "", []string{"nyc3", "nyc3"}, "regions.1", "unique"},
		{"a bad region", "acme", ref, "", []string{"NYC 3"}, "regions.0", "pattern"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := provideraccounts.Check(tc.tenant, "root", "digitalocean", "do", tc.credentialRef, tc.baseURL, tc.regions)
			if tc.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			ce := core.AsError(err)
			if ce == nil || ce.Code != core.CodeInvalidInput || ce.Details["field"] != tc.field || ce.Details["reason"] != tc.reason {
				t.Fatalf("= %v %v, want INVALID_INPUT %s/%s", err, ce.Details, tc.field, tc.reason)
			}
			if strings.Contains(ce.Message, token[7:30]) {
				t.Fatalf("the message echoes the token: %s", ce.Message)
			}
		})
	}
}

// A pool being created with the account (ForPool's share lock held) makes
// a concurrent delete wait and then refuse; a delete in flight makes the
// pool's ForPool wait and then find the account gone. Either order ends
// with no live pool on a deleted account.
func TestDeleteAndPoolCreateSerialize(t *testing.T) {
	t.Run("the pool first", func(t *testing.T) {
		f := newFixture(t)
		a := f.account()
		ctx := context.Background()
		tx, err := f.s.Pool.Begin(ctx)
		f.must(err)
		defer tx.Rollback(ctx)
		f.must(pool(ctx, tx, a.ID))
		done := make(chan error, 1)
		go func() {
			done <- f.tx(func(ctx context.Context, tx store.Tx) error {
				_, err := f.m.Delete(ctx, tx, "acme", a.ID)
				return err
			})
		}()
		f.must(tx.Commit(ctx))
		if err := <-done; core.AsError(err).Code != core.CodeInvalidState || core.AsError(err).Details["reason"] != "pools" {
			t.Fatalf("delete = %v, want INVALID_STATE reason pools", err)
		}
	})
	t.Run("the delete first", func(t *testing.T) {
		f := newFixture(t)
		a := f.account()
		ctx := context.Background()
		tx, err := f.s.Pool.Begin(ctx)
		f.must(err)
		defer tx.Rollback(ctx)
		if _, err := f.m.Delete(ctx, tx, "acme", a.ID); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			done <- f.tx(func(ctx context.Context, tx store.Tx) error { return pool(ctx, tx, a.ID) })
		}()
		f.must(tx.Commit(ctx))
		err = <-done
		if ce := core.AsError(err); ce.Code != core.CodeNotFound || ce.Details["field"] != "providerAccountId" {
			t.Fatalf("a pool on an account being deleted = %v, want NOT_FOUND on providerAccountId", err)
		}
	})
}

// Another tenant's account, or a deleted one, is NOT_FOUND to every read.
func TestLoadIsTenantScoped(t *testing.T) {
	f := newFixture(t)
	a := f.account()
	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		if _, err := provideraccounts.Load(ctx, tx, "globex", a.ID, false); core.AsError(err).Code != core.CodeNotFound {
			t.Errorf("globex's Load = %v", err)
		}
		if _, err := provideraccounts.ForPool(ctx, tx, "globex", a.ID); core.AsError(err).Code != core.CodeNotFound {
			t.Errorf("a globex pool on acme's account = %v", err)
		}
		if got, err := provideraccounts.Get(ctx, tx, a.ID); err != nil || got.ID != a.ID {
			t.Errorf("Get = %+v, %v", got, err)
		}
		return nil
	}))
	// Token resolves the credential, and records it.
	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		got, err := provideraccounts.Token(ctx, tx, f.vault, a, secrets.Use{Purpose: "test", IdentityKind: "test", IdentityID: "t"})
		if err != nil || got != token {
			t.Errorf("Token = %v, %v", got == token, err)
		}
		return err
	}))
}
