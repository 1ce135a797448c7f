package api_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/internal/testenv"

	"github.com/better-compute/better-compute/api"
	secretsapi "github.com/better-compute/better-compute/api/secrets"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/secrets"
)

// testVault is a vault with a fresh key-encryption key of its own.
func testVault(t testing.TB) *secrets.Vault {
	t.Helper()
	kek, err := secrets.GenerateKEK()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := secrets.ParseKeyring(kek)
	if err != nil {
		t.Fatal(err)
	}
	return secrets.NewVault(keys, api.DefaultRootTenant)
}

// decidedOn is the resource the last audited call of method in tenant was
// decided on.
func (e *env) decidedOn(method, tenant string) string {
	e.t.Helper()
	var typ, id string
	if err := e.store.Pool.QueryRow(context.Background(), `SELECT resource_type, resource_id FROM audit_events
		WHERE method = $1 AND tenant_id = $2 ORDER BY at DESC, id DESC LIMIT 1`, method, tenant).Scan(&typ, &id); err != nil {
		e.t.Fatal(err)
	}
	return typ + "/" + id
}

func TestSecretsPutReplacesAndDeleteRemoves(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken) // acme's admin
	first, err := secretsapi.Put.Call(ctx, c, secretsapi.PutInput{TenantID: "acme", Name: "bmc.rack-1", Value: "first-value", Description: "rack 1 BMCs"})
	if err != nil {
		t.Fatal(err)
	}
	if first.Ref != "secret://acme/bmc.rack-1" || first.Version != 1 || first.Scope != "tenant" || first.CreatedAt == 0 || first.UpdatedAt == 0 {
		t.Fatalf("put = %+v", first)
	}
	if got := e.decidedOn("secrets.put", "acme"); got != "compute-tenant/acme" {
		t.Fatalf("secrets.put was decided on %s", got)
	}
	second, err := secretsapi.Put.Call(ctx, c, secretsapi.PutInput{TenantID: "acme", Name: "bmc.rack-1", Value: "second-value"})
	if err != nil || second.Version != 2 || second.Ref != first.Ref {
		t.Fatalf("second put = %+v, %v", second, err)
	}
	value, err := resolveIn(e, "acme", first.Ref)
	if err != nil || value != "second-value" {
		t.Fatalf("the stored value resolves to %q, %v", value, err)
	}

	// An idempotency key: the retry answers byte for byte and makes no
	// version; the key with another value is CONFLICT.
	body := `{"tenantId":"acme","name":"bmc.rack-1","value":"third-value","idempotencyKey":"k-1"}`
	status, once := e.call(e.boot.UserToken, "secrets.put", body)
	status2, twice := e.call(e.boot.UserToken, "secrets.put", body)
	if status != http.StatusOK || status2 != http.StatusOK || once != twice || !strings.Contains(once, `"version":3`) {
		t.Fatalf("put with a key = %d %s, then %d %s", status, once, status2, twice)
	}
	if status, out := e.call(e.boot.UserToken, "secrets.put", strings.Replace(body, "third", "fourth", 1)); status != http.StatusConflict {
		t.Fatalf("the key with another value = %d %s, want 409", status, out)
	}

	deleted, err := secretsapi.Delete.Call(ctx, c, secretsapi.DeleteInput{TenantID: "acme", Name: "bmc.rack-1"})
	if err != nil || deleted.Ref != first.Ref || deleted.Version != 3 {
		t.Fatalf("delete = %+v, %v", deleted, err)
	}
	if _, err := secretsapi.Delete.Call(ctx, c, secretsapi.DeleteInput{TenantID: "acme", Name: "bmc.rack-1"}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("deleting it again: %v, want NOT_FOUND", err)
	}
	if _, err := resolveIn(e, "acme", first.Ref); codeOf(err) != core.CodeNotFound {
		t.Fatalf("resolving a deleted secret: %v, want NOT_FOUND", err)
	}
	if got := e.decidedOn("secrets.delete", "acme"); got != "compute-tenant/acme" {
		t.Fatalf("secrets.delete was decided on %s", got)
	}
	// A name of the wrong grammar never reaches the store.
	if _, err := secretsapi.Put.Call(ctx, c, secretsapi.PutInput{TenantID: "acme", Name: "Bad/Name", Value: "v"}); codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("a bad name: %v, want INVALID_INPUT", err)
	}
}

// resolveIn resolves ref as a site agent would for a node of tenant.
func resolveIn(e *env, tenant, ref string) (string, error) {
	var value string
	err := e.store.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) (err error) {
		value, err = e.vault.Resolve(context.Background(), tx, ref, secrets.Use{TenantID: tenant, Purpose: "test",
			IdentityKind: "site", IdentityID: "site_test"})
		return err
	})
	return value, err
}

// A tenant caller is decided on compute-tenant; a fleet secret is root's,
// decided on compute-fleet; a tenant-only operator of the root tenant can
// put root's own secrets and not the fleet's; and a caller of another
// tenant, or one without a policy, is ACCESS_DENIED with the same answer
// whether the secret exists or not.
func TestSecretsDecisions(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	root := api.DefaultRootTenant
	if _, err := e.admin.PutPolicy(ctx, iam.PutPolicyInput{TenantID: root, Name: "tenant-secrets", Cedar: `permit (
  principal in Group::"secret-ops",
  action == Action::"compute:secrets:manage",
  resource is Resource
) when { resource.type == "compute-tenant" && resource.tenantId == principal.tenantId };`}); err != nil {
		t.Fatal(err)
	}
	ops := e.person(root, "ops", []string{"secret-ops"})

	fleet, err := secretsapi.Put.Call(ctx, e.client(e.boot.AdminToken), secretsapi.PutInput{TenantID: root, Scope: "fleet", Name: "fleet-bmc", Value: "fleet-value"})
	if err != nil {
		t.Fatal(err)
	}
	if fleet.Ref != "secret://root/fleet-bmc" || fleet.Scope != "fleet" {
		t.Fatalf("fleet put = %+v", fleet)
	}
	if got := e.decidedOn("secrets.put", root); got != "compute-fleet/"+core.FleetID {
		t.Fatalf("a fleet secret was decided on %s", got)
	}
	// A fleet secret resolves for any tenant's node.
	if v, err := resolveIn(e, "acme", fleet.Ref); err != nil || v != "fleet-value" {
		t.Fatalf("the fleet secret for acme = %q, %v", v, err)
	}
	if _, err := secretsapi.Put.Call(ctx, e.client(ops), secretsapi.PutInput{TenantID: root, Scope: "fleet", Name: "ops-fleet", Value: "v"}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("a tenant-only operator's fleet secret: %v, want ACCESS_DENIED", err)
	}
	if _, err := secretsapi.Put.Call(ctx, e.client(ops), secretsapi.PutInput{TenantID: root, Name: "ops-own", Value: "v"}); err != nil {
		t.Fatalf("a tenant-only operator's own secret: %v", err)
	}
	if got := e.decidedOn("secrets.put", root); got != "compute-tenant/"+root {
		t.Fatalf("a root-tenant secret was decided on %s", got)
	}
	// A fleet secret is put in the root tenant.
	if _, err := secretsapi.Put.Call(ctx, e.client(e.boot.AdminToken), secretsapi.PutInput{TenantID: "acme", Scope: "fleet", Name: "x", Value: "v"}); codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("a fleet secret in acme: %v, want INVALID_INPUT", err)
	}
	// acme's admin may not decide on the fleet.
	if _, err := secretsapi.Put.Call(ctx, e.client(e.boot.UserToken), secretsapi.PutInput{TenantID: "acme", Scope: "fleet", Name: "x", Value: "v"}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("acme's fleet secret: %v, want ACCESS_DENIED", err)
	}

	if _, err := secretsapi.Put.Call(ctx, e.client(e.boot.UserToken), secretsapi.PutInput{TenantID: "acme", Name: "exists", Value: "acme-value"}); err != nil {
		t.Fatal(err)
	}
	for _, who := range []struct{ name, token string }{{"globex's admin", e.globex}, {"acme's person without a policy", e.stranger}} {
		for method, extra := range map[string]string{"secrets.delete": "", "secrets.put": `,"value":"guess"`} {
			statusExists, exists := e.call(who.token, method, `{"tenantId":"acme","name":"exists"`+extra+`}`)
			statusMissing, missing := e.call(who.token, method, `{"tenantId":"acme","name":"missing"`+extra+`}`)
			if statusExists != http.StatusForbidden || exists != missing || statusMissing != statusExists {
				t.Fatalf("%s, %s: an existing secret answers %d %s, a missing one %d %s", who.name, method, statusExists, exists, statusMissing, missing)
			}
		}
	}
	// Nothing changed: the value is acme's.
	if v, err := resolveIn(e, "acme", "secret://acme/exists"); err != nil || v != "acme-value" {
		t.Fatalf("acme's secret = %q, %v", v, err)
	}
	// A node of globex cannot resolve acme's secret, and learns nothing.
	_, other := resolveIn(e, "globex", "secret://acme/exists")
	_, missing := resolveIn(e, "globex", "secret://globex/exists")
	if codeOf(other) != core.CodeNotFound || other.Error() != missing.Error() {
		t.Fatalf("globex resolving acme's secret: %v; a missing one: %v", other, missing)
	}
}

func TestSecretsWithoutAKEKAreUnavailable(t *testing.T) {
	e := newEnv(t)
	srv, err := api.New(api.Deps{Store: e.store, IAM: e.outer, Catalog: e.catalog, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	_, err = secretsapi.Put.Call(context.Background(), api.NewClient(hs.URL, e.boot.UserToken), secretsapi.PutInput{TenantID: "acme", Name: "pw", Value: "v"})
	if codeOf(err) != core.CodeUnavailable {
		t.Fatalf("put without a KEK: %v, want UNAVAILABLE", err)
	}
	var n int
	if err := e.store.Pool.QueryRow(context.Background(), `SELECT count(*) FROM secrets`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d secrets stored (%v)", n, err)
	}
}

// A value is never in clear in the database, an answer or a log line:
// after puts (new, replaced, replayed, refused), a resolution and a delete,
// every table's rows as JSON, every answer and every log record (debug
// level) are searched for the value, its hex and its base64.
func TestSecretValuesAreNeverInClear(t *testing.T) {
	e := newEnv(t)
	var logs lockedBuffer
	srv, err := api.New(api.Deps{Store: e.store, IAM: e.outer, Catalog: e.catalog, Secrets: e.vault,
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	raw := make([]byte, 12)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	values := []string{"pw-" + hex.EncodeToString(raw), "second-" + hex.EncodeToString(raw), "refused-" + hex.EncodeToString(raw)}
	var answers []string
	call := func(token, method string, in map[string]any) {
		t.Helper()
		body, _ := json.Marshal(in)
		req, _ := http.NewRequest(http.MethodPost, hs.URL+"/api/compute/"+strings.Replace(method, ".", "/", 1), bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answers = append(answers, fmt.Sprintf("%d %s %s", resp.StatusCode, resp.Header, out))
	}
	put := func(token, name, value, key string) {
		in := map[string]any{"tenantId": "acme", "name": name, "value": value}
		if key != "" {
			in["idempotencyKey"] = key
		}
		call(token, "secrets.put", in)
	}
	put(e.boot.UserToken, "leak-check", values[0], "k")
	put(e.boot.UserToken, "leak-check", values[0], "k")                 // replayed
	put(e.boot.UserToken, "leak-check", values[2], "k")                 // CONFLICT
	put(e.globex, "leak-check", values[2], "")                          // ACCESS_DENIED
	put(e.boot.UserToken, "Leak/Check", values[2], "")                  // INVALID_INPUT
	put(e.boot.UserToken, "other", values[1], "")                       // a second secret
	put(e.boot.UserToken, "leak-check", values[1], "k2")                // replaced
	put(e.boot.UserToken, "leak-check", strings.Repeat("x", 65537), "") // too long
	call(e.boot.UserToken, "secrets.delete", map[string]any{"tenantId": "acme", "name": "other"})
	if v, err := resolveIn(e, "acme", "secret://acme/leak-check"); err != nil || v != values[1] {
		t.Fatalf("resolve = %q, %v", v, err)
	}
	if len(answers) != 9 || !strings.HasPrefix(answers[0], "200 ") || !strings.HasPrefix(answers[2], "409 ") ||
		!strings.HasPrefix(answers[3], "403 ") || !strings.HasPrefix(answers[4], "400 ") || !strings.HasPrefix(answers[6], "200 ") {
		t.Fatalf("answers: %q", answers)
	}

	dump := testenv.DumpTables(t, e.store)
	if !strings.Contains(dump, "public.secrets") || !strings.Contains(dump, "leak-check") {
		t.Fatalf("the dump does not hold the secrets table's rows:\n%s", dump)
	}
	for _, v := range values {
		for _, form := range []string{v, hex.EncodeToString([]byte(v)), base64.StdEncoding.EncodeToString([]byte(v)), base64.RawURLEncoding.EncodeToString([]byte(v))} {
			for what, text := range map[string]string{"the database": dump, "an answer": strings.Join(answers, "\n"), "the log": logs.String()} {
				if strings.Contains(text, form) {
					t.Errorf("%s holds a secret value (%q)", what, form)
				}
			}
		}
	}
	if !strings.Contains(logs.String(), "secrets.put") {
		t.Fatalf("the log has no record of the calls, so its search proves nothing:\n%s", logs.String())
	}
}
