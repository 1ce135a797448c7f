package secrets_test

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/secrets"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const root = "root"

func keyring(t *testing.T, keys ...string) *secrets.Keyring {
	t.Helper()
	k, err := secrets.ParseKeyring(strings.Join(keys, "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newKEK(t *testing.T) string {
	t.Helper()
	k, err := secrets.GenerateKEK()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func put(t *testing.T, s *store.Store, v *secrets.Vault, p secrets.PutRequest) (secrets.Secret, error) {
	t.Helper()
	if p.Scope == "" {
		p.Scope = "tenant"
	}
	if p.By == "" {
		p.By = "idn_alice"
	}
	var out secrets.Secret
	err := s.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) (err error) {
		out, err = v.Put(context.Background(), tx, p)
		return err
	})
	return out, err
}

func use(tenant string) secrets.Use {
	return secrets.Use{TenantID: tenant, Purpose: "bmc-credentials", IdentityKind: "site", IdentityID: "site_1",
		ResourceType: "node", ResourceID: "node_1", RequestID: "req_1"}
}

func resolve(t *testing.T, s *store.Store, v *secrets.Vault, ref string, u secrets.Use) (string, error) {
	t.Helper()
	var value string
	err := s.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) (err error) {
		value, err = v.Resolve(context.Background(), tx, ref, u)
		return err
	})
	return value, err
}

func wantCode(t *testing.T, err error, code core.Code) {
	t.Helper()
	if got := core.AsError(err).Code; err == nil || got != code {
		t.Fatalf("error = %v, want %s", err, code)
	}
}

func TestPutThenResolveRoundTripsAndVersions(t *testing.T) {
	s := testenv.Store(t)
	v := secrets.NewVault(keyring(t, newKEK(t)), root)
	first, err := put(t, s, v, secrets.PutRequest{TenantID: "ten_a", Name: "bmc.rack1", Value: "hunter2", Description: "rack 1"})
	if err != nil {
		t.Fatal(err)
	}
	if first.Ref != "secret://ten_a/bmc.rack1" || first.Version != 1 || first.Scope != "tenant" || first.Description != "rack 1" {
		t.Fatalf("first put = %+v", first)
	}
	if got, err := resolve(t, s, v, first.Ref, use("ten_a")); err != nil || got != "hunter2" {
		t.Fatalf("Resolve = %q, %v", got, err)
	}
	second, err := put(t, s, v, secrets.PutRequest{TenantID: "ten_a", Name: "bmc.rack1", Value: "correct horse", By: "idn_bob"})
	if err != nil {
		t.Fatal(err)
	}
	if second.Version != 2 || second.CreatedBy != "idn_alice" || second.UpdatedBy != "idn_bob" || second.CreatedAt != first.CreatedAt {
		t.Fatalf("second put = %+v", second)
	}
	if got, err := resolve(t, s, v, first.Ref, use("ten_a")); err != nil || got != "correct horse" {
		t.Fatalf("Resolve after the new version = %q, %v", got, err)
	}
	var n int
	var purpose, identity, resource string
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*), min(purpose), min(identity_id), min(resource_id)
		FROM secret_resolutions WHERE tenant_id = 'ten_a' AND name = 'bmc.rack1'`).Scan(&n, &purpose, &identity, &resource); err != nil {
		t.Fatal(err)
	}
	if n != 2 || purpose != "bmc-credentials" || identity != "site_1" || resource != "node_1" {
		t.Fatalf("resolutions: %d, %q, %q, %q", n, purpose, identity, resource)
	}
}

func TestTamperedOrMovedCiphertextDoesNotOpen(t *testing.T) {
	s := testenv.Store(t)
	v := secrets.NewVault(keyring(t, newKEK(t)), root)
	if _, err := put(t, s, v, secrets.PutRequest{TenantID: "ten_a", Name: "pw", Value: "s3cret"}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := s.Pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	// A copy into another tenant, and one under another name.
	exec(`INSERT INTO secrets (tenant_id, name, scope, description, version, kek_id, sealed, created_by, updated_by)
		SELECT 'ten_b', name, scope, description, version, kek_id, sealed, created_by, updated_by FROM secrets WHERE tenant_id = 'ten_a'`)
	exec(`INSERT INTO secrets (tenant_id, name, scope, description, version, kek_id, sealed, created_by, updated_by)
		SELECT tenant_id, 'other', scope, description, version, kek_id, sealed, created_by, updated_by FROM secrets WHERE tenant_id = 'ten_a'`)
	_, err := resolve(t, s, v, "secret://ten_b/pw", use("ten_b"))
	wantCode(t, err, core.CodeInternal)
	_, err = resolve(t, s, v, "secret://ten_a/other", use("ten_a"))
	wantCode(t, err, core.CodeInternal)
	// An old version's ciphertext presented as a newer version.
	exec(`UPDATE secrets SET version = 2 WHERE tenant_id = 'ten_a' AND name = 'pw'`)
	_, err = resolve(t, s, v, "secret://ten_a/pw", use("ten_a"))
	wantCode(t, err, core.CodeInternal)
	exec(`UPDATE secrets SET version = 1 WHERE tenant_id = 'ten_a' AND name = 'pw'`)
	if got, err := resolve(t, s, v, "secret://ten_a/pw", use("ten_a")); err != nil || got != "s3cret" {
		t.Fatalf("Resolve of the untouched row = %q, %v", got, err)
	}
	// One flipped bit of the payload (its last byte is the GCM tag's).
	exec(`UPDATE secrets SET sealed = overlay(sealed placing decode(lpad(to_hex(get_byte(sealed, length(sealed) - 1) # 1), 2, '0'), 'hex')
		from length(sealed)) WHERE tenant_id = 'ten_a' AND name = 'pw'`)
	_, err = resolve(t, s, v, "secret://ten_a/pw", use("ten_a"))
	wantCode(t, err, core.CodeInternal)
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("the error names the value: %v", err)
	}
}

func TestRotationWithTwoKEKsThenRewrap(t *testing.T) {
	s := testenv.Store(t)
	ctx := context.Background()
	oldKEK, newKEKText := newKEK(t), newKEK(t)
	before := secrets.NewVault(keyring(t, oldKEK), root)
	for _, name := range []string{"a", "b", "c"} {
		if _, err := put(t, s, before, secrets.PutRequest{TenantID: "ten_a", Name: name, Value: "value-" + name}); err != nil {
			t.Fatal(err)
		}
	}
	// The new key first: it seals; the old one still opens.
	both := keyring(t, newKEKText, oldKEK)
	rotated := secrets.NewVault(both, root)
	if got, err := resolve(t, s, rotated, "secret://ten_a/a", use("ten_a")); err != nil || got != "value-a" {
		t.Fatalf("Resolve of an old row after the rotation = %q, %v", got, err)
	}
	if _, err := put(t, s, rotated, secrets.PutRequest{TenantID: "ten_a", Name: "d", Value: "value-d"}); err != nil {
		t.Fatal(err)
	}
	var kek string
	if err := s.Pool.QueryRow(ctx, `SELECT kek_id FROM secrets WHERE name = 'd'`).Scan(&kek); err != nil || kek != both.PrimaryID() {
		t.Fatalf("a new row's kek = %q (%v), want the primary %s", kek, err, both.PrimaryID())
	}
	// The old key alone cannot open what the new one sealed.
	_, err := resolve(t, s, before, "secret://ten_a/d", use("ten_a"))
	wantCode(t, err, core.CodeUnavailable)

	n, err := rotated.Rewrap(ctx, s)
	if err != nil || n != 3 {
		t.Fatalf("Rewrap = %d, %v; want 3", n, err)
	}
	if n, err := rotated.Rewrap(ctx, s); err != nil || n != 0 {
		t.Fatalf("second Rewrap = %d, %v; want 0", n, err)
	}
	newOnly := secrets.NewVault(keyring(t, newKEKText), root)
	for _, name := range []string{"a", "b", "c", "d"} {
		if got, err := resolve(t, s, newOnly, "secret://ten_a/"+name, use("ten_a")); err != nil || got != "value-"+name {
			t.Fatalf("Resolve %s with the new key only = %q, %v", name, got, err)
		}
	}
}

func TestNoKEKRefusesAndStoresNothing(t *testing.T) {
	s := testenv.Store(t)
	v := secrets.NewVault(nil, root)
	_, err := put(t, s, v, secrets.PutRequest{TenantID: "ten_a", Name: "pw", Value: "s3cret"})
	wantCode(t, err, core.CodeUnavailable)
	_, err = resolve(t, s, v, "secret://ten_a/pw", use("ten_a"))
	wantCode(t, err, core.CodeUnavailable)
	var n int
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM secrets`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows (%v)", n, err)
	}
}

func TestResolveAcrossTenantsIsNotFound(t *testing.T) {
	s := testenv.Store(t)
	v := secrets.NewVault(keyring(t, newKEK(t)), root)
	if _, err := put(t, s, v, secrets.PutRequest{TenantID: "ten_a", Name: "pw", Value: "a-only"}); err != nil {
		t.Fatal(err)
	}
	if _, err := put(t, s, v, secrets.PutRequest{TenantID: root, Name: "fleet-bmc", Scope: "fleet", Value: "fleet-pw"}); err != nil {
		t.Fatal(err)
	}
	_, other := resolve(t, s, v, "secret://ten_a/pw", use("ten_b"))
	_, missing := resolve(t, s, v, "secret://ten_b/pw", use("ten_b"))
	wantCode(t, other, core.CodeNotFound)
	if other.Error() != missing.Error() {
		t.Fatalf("another tenant's secret answers %q, a missing one %q", other, missing)
	}
	if got, err := resolve(t, s, v, "secret://root/fleet-bmc", use("ten_b")); err != nil || got != "fleet-pw" {
		t.Fatalf("a fleet secret for ten_b = %q, %v", got, err)
	}
	// The root tenant's own secret is not the fleet's.
	if _, err := put(t, s, v, secrets.PutRequest{TenantID: root, Name: "root-own", Value: "root-pw"}); err != nil {
		t.Fatal(err)
	}
	_, rootOwn := resolve(t, s, v, "secret://root/root-own", use("ten_b"))
	wantCode(t, rootOwn, core.CodeNotFound)
	if got, err := resolve(t, s, v, "secret://root/root-own", use(root)); err != nil || got != "root-pw" {
		t.Fatalf("root's own secret for root = %q, %v", got, err)
	}
	exists := func(tenant, ref string) bool {
		t.Helper()
		var found bool
		if err := s.InTx(context.Background(), store.ReadOnly, func(tx store.Tx) (err error) {
			found, err = v.Exists(context.Background(), tx, tenant, ref)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return found
	}
	if !exists("ten_a", "secret://ten_a/pw") || !exists("ten_b", "secret://root/fleet-bmc") || exists("ten_b", "secret://ten_a/pw") ||
		exists("ten_b", "secret://root/root-own") || !exists(root, "secret://root/root-own") || exists("ten_a", "secret://ten_a/nope") {
		t.Fatal("Exists disagrees with Resolve")
	}
	_, err := resolve(t, s, v, "vault://ten_a/pw", use("ten_a"))
	wantCode(t, err, core.CodeInvalidInput)
	var n int
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM secret_resolutions`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d resolutions recorded (%v), want only the two that resolved", n, err)
	}
}

func TestScopes(t *testing.T) {
	s := testenv.Store(t)
	v := secrets.NewVault(keyring(t, newKEK(t)), root)
	_, err := put(t, s, v, secrets.PutRequest{TenantID: "ten_a", Name: "x", Scope: "fleet", Value: "v"})
	wantCode(t, err, core.CodeInvalidInput)
	if _, err := put(t, s, v, secrets.PutRequest{TenantID: root, Name: "x", Scope: "fleet", Value: "v"}); err != nil {
		t.Fatal(err)
	}
	_, err = put(t, s, v, secrets.PutRequest{TenantID: root, Name: "x", Scope: "tenant", Value: "v"})
	wantCode(t, err, core.CodeConflict)
	del := func(scope string) error {
		return s.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
			_, err := v.Delete(context.Background(), tx, root, scope, "x")
			return err
		})
	}
	wantCode(t, del("tenant"), core.CodeNotFound)
	if err := del("fleet"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, del("fleet"), core.CodeNotFound)
}

func TestIdempotentPut(t *testing.T) {
	s := testenv.Store(t)
	v := secrets.NewVault(keyring(t, newKEK(t)), root)
	p := secrets.PutRequest{TenantID: "ten_a", Name: "pw", Value: "one", IdempotencyKey: "k1"}
	first, err := put(t, s, v, p)
	if err != nil {
		t.Fatal(err)
	}
	again, err := put(t, s, v, p)
	if err != nil || again != first {
		t.Fatalf("replay = %+v, %v; want %+v", again, err, first)
	}
	changed := p
	changed.Value = "two"
	_, err = put(t, s, v, changed)
	wantCode(t, err, core.CodeConflict)
	if _, err := put(t, s, v, secrets.PutRequest{TenantID: "ten_a", Name: "pw", Value: "two", IdempotencyKey: "k2"}); err != nil {
		t.Fatal(err)
	}
	// The first key still answers its own put, not the later version.
	if again, err := put(t, s, v, p); err != nil || again.Version != 1 {
		t.Fatalf("replay after a later put = %+v, %v", again, err)
	}
	// Another caller's key is its own.
	other := p
	other.By = "idn_bob"
	if got, err := put(t, s, v, other); err != nil || got.Version != 3 {
		t.Fatalf("another caller's put = %+v, %v", got, err)
	}
}

func TestLoadKeyring(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "kek")
	if err := secrets.EnsureKEKFile(file); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(file)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("generated file: %v, %v", info, err)
	}
	k1, err := secrets.LoadKeyring(file, func(string) string { return "" })
	if err != nil || k1 == nil {
		t.Fatalf("LoadKeyring(file) = %v, %v", k1, err)
	}
	if err := secrets.EnsureKEKFile(file); err != nil { // kept, not replaced
		t.Fatal(err)
	}
	if k2, err := secrets.LoadKeyring(file, func(string) string { return "" }); err != nil || k2.PrimaryID() != k1.PrimaryID() {
		t.Fatalf("the second start's key = %v, %v", k2, err)
	}
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.LoadKeyring(file, func(string) string { return "" }); err == nil {
		t.Fatal("a file others may read was accepted")
	}
	kek := newKEK(t)
	env := func(name string) string {
		if name == secrets.EnvKEK {
			return kek
		}
		return ""
	}
	if k, err := secrets.LoadKeyring("", env); err != nil || k == nil {
		t.Fatalf("LoadKeyring(env) = %v, %v", k, err)
	}
	if k, err := secrets.LoadKeyring("", func(string) string { return "" }); err != nil || k != nil {
		t.Fatalf("LoadKeyring(nothing) = %v, %v; want none", k, err)
	}
	short := base64.StdEncoding.EncodeToString([]byte("sixteen byte key"))
	for _, bad := range []string{"not base64 at all!", short, "# only a comment"} {
		_, err := secrets.ParseKeyring(bad)
		if err == nil || strings.Contains(err.Error(), bad) {
			t.Errorf("ParseKeyring(%q) = %v", bad, err)
		}
	}
	if _, err := secrets.ParseKeyring(kek + "\n" + kek); err == nil {
		t.Error("one key given twice was accepted")
	}
}
