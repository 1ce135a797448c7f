// Package e2e runs the real stack in-process — PostgreSQL from the machine's
// binaries, the embedded Temporal server persisting to it, the worker and
// the API — and talks to it over real HTTP. It is the one test package that
// links the Temporal server; keep others on the SDK's test suite.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/reservations"
	secretsapi "github.com/better-compute/better-compute/api/secrets"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/internal/freeport"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/secrets"
)

// startStack starts the dev stack with its agents (a bcd site and two
// simulated bcd node agents, real processes).
func startStack(t testing.TB, dir string, pgPort int) *devstack.Stack {
	t.Helper()
	bcd, err := bcdBinary()
	if err != nil {
		t.Fatal(err)
	}
	s, err := devstack.Start(context.Background(), devstack.Options{
		Dir:          dir,
		APIAddr:      "127.0.0.1:0",
		AgentAddr:    "127.0.0.1:0",
		BCD:          bcd,
		PostgresPort: pgPort,
		TemporalAddr: "127.0.0.1:0",
		UIAddr:       "127.0.0.1:0",
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatalf("devstack: %v", err)
	}
	t.Cleanup(func() { s.Stop(context.Background()) })
	return s
}

func stackDir(t *testing.T) string {
	if testing.Short() {
		t.Skip("starts PostgreSQL and Temporal")
	}
	dir, err := os.MkdirTemp("", "bc-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The PostgreSQL server may run as the postgres OS user, which must reach in.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

type reply struct {
	status int
	body   map[string]any
	header http.Header
}

func post(t *testing.T, base, method, body string, header map[string]string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/api/compute/"+strings.Replace(method, ".", "/", 1), bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return do(t, req)
}

func get(t *testing.T, url string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) reply {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	r := reply{status: resp.StatusCode, header: resp.Header}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			t.Fatalf("%s: bad JSON %q: %v", req.URL, raw, err)
		}
	} else {
		r.body = map[string]any{"text": string(raw)}
	}
	return r
}

func errorCode(r reply) string {
	e, _ := r.body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func TestDevStackOverHTTP(t *testing.T) {
	dir := stackDir(t)
	pgPort, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	s := startStack(t, dir, pgPort)
	base := s.APIURL()

	t.Run("healthz does a real Temporal round trip", func(t *testing.T) {
		r := get(t, base+"/healthz")
		checks, _ := r.body["checks"].(map[string]any)
		temporal, _ := checks["temporal"].(map[string]any)
		database, _ := checks["database"].(map[string]any)
		if r.status != http.StatusOK || r.body["status"] != "ok" || temporal["ok"] != true || database["ok"] != true {
			t.Fatalf("healthz = %d %v", r.status, r.body)
		}
	})

	t.Run("system.version is public", func(t *testing.T) {
		r := post(t, base, "system.version", `{}`, nil)
		if r.status != http.StatusOK || r.body["version"] == "" || r.body["api"] != "v0.1" {
			t.Fatalf("system.version = %d %v", r.status, r.body)
		}
		if id := r.header.Get("X-Request-Id"); !strings.HasPrefix(id, "req_") {
			t.Fatalf("no generated request id: %q", id)
		}
	})

	t.Run("a well-formed request id is echoed", func(t *testing.T) {
		r := post(t, base, "system.version", ``, map[string]string{"X-Request-Id": "trace-42"})
		if r.status != http.StatusOK || r.header.Get("X-Request-Id") != "trace-42" {
			t.Fatalf("request id = %q (status %d)", r.header.Get("X-Request-Id"), r.status)
		}
	})

	t.Run("system.whoami without a credential", func(t *testing.T) {
		r := post(t, base, "system.whoami", `{}`, nil)
		if r.status != http.StatusOK || r.body["authenticated"] != false {
			t.Fatalf("whoami = %d %v", r.status, r.body)
		}
	})

	t.Run("an unknown credential fails closed", func(t *testing.T) {
		r := post(t, base, "system.whoami", `{}`, map[string]string{"Authorization": "Bearer not-a-token"})
		if r.status != http.StatusUnauthorized || errorCode(r) != "UNAUTHENTICATED" {
			t.Fatalf("whoami with a bogus token = %d %v", r.status, r.body)
		}
	})

	t.Run("errors carry the contract's codes", func(t *testing.T) {
		cases := []struct {
			name, method, body string
			status             int
			code               string
		}{
			{"unknown field", "system.version", `{"nope":1}`, 400, "INVALID_INPUT"},
			{"not an object", "system.version", `[1]`, 400, "INVALID_INPUT"},
			{"bad JSON", "system.version", `{`, 400, "INVALID_INPUT"},
			{"unknown method", "system.nope", `{}`, 404, "NOT_FOUND"},
		}
		for _, c := range cases {
			r := post(t, base, c.method, c.body, nil)
			if r.status != c.status || errorCode(r) != c.code {
				t.Errorf("%s: %d %v, want %d %s", c.name, r.status, r.body, c.status, c.code)
			}
		}
	})

	t.Run("metrics", func(t *testing.T) {
		r := get(t, base+"/metrics")
		text, _ := r.body["text"].(string)
		if r.status != http.StatusOK || !strings.Contains(text, `bc_api_calls_total{code="OK",method="system.version"}`) {
			t.Fatalf("metrics = %d, missing the call counter:\n%.2000s", r.status, text)
		}
	})

	t.Run("Temporal Web UI", func(t *testing.T) {
		r := get(t, s.TemporalUI()+"/")
		text, _ := r.body["text"].(string)
		if r.status != http.StatusOK || !strings.Contains(strings.ToLower(text), "<html") {
			t.Fatalf("UI = %d %.200s", r.status, text)
		}
	})

	t.Run("the demo fleet is offered to the demo tenant", func(t *testing.T) {
		token, err := s.DemoToken()
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		acme := api.NewClient(base, token)
		list, err := pools.List.Call(ctx, acme, pools.ListInput{TenantID: "acme"})
		if err != nil || len(list.Items) != 1 || list.Items[0].ID != s.Demo().PoolID || list.Items[0].GPUModel != "H100" {

		}
		quotas, err := pools.QuotasGet.Call(ctx, acme, pools.QuotasGetInput{TenantID: "acme", PoolID: s.Demo().PoolID})
		if err != nil || len(quotas.Items) != 1 || quotas.Items[0].Quota["gpu"] != 16 {
			t.Fatalf("acme's quota on the demo pool = %+v, %v", quotas.Items, err)
		}
	})

	t.Run("the demo pool holds schedulable simulated H100 nodes", func(t *testing.T) {
		token, err := s.AdminToken()
		if err != nil {
			t.Fatal(err)
		}
		nodes, err := nodes.List.Call(context.Background(), api.NewClient(base, token), nodes.ListInput{TenantID: "root", PoolID: s.Demo().PoolID})
		if err != nil || len(nodes.Items) != 2 {
			t.Fatalf("demo nodes = %+v, %v; want 2", nodes.Items, err)
		}
		// They are the dev stack's simulated bcd agents; on a machine without
		// DMI their GPU UUIDs are their only identifiers, so their keys are
		// distinct but untrusted.
		for _, n := range nodes.Items {
			if !n.Schedulable || n.GPUCount != 8 || n.GPUModel != "H100" || n.Connectivity != "connected" ||
				!strings.HasPrefix(n.Name, "dev-agent-") || n.HardwareKey == "" {
				t.Fatalf("demo node %+v", n)
			}
		}
		if nodes.Items[0].HardwareKey == nodes.Items[1].HardwareKey {
			t.Fatal("the demo nodes share a hardware key")
		}
	})

	t.Run("a reservation starts its workflow, which makes it active", func(t *testing.T) {
		token, err := s.DemoToken()
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		acme := api.NewClient(base, token)
		in := reservations.CreateInput{TenantID: "acme", PoolID: s.Demo().PoolID, Duration: 3600, IdempotencyKey: "e2e-1",
			Devices: placement.Request{Class: placement.ClassGPU, Count: 2}}
		r, err := reservations.Create.Call(ctx, acme, in)
		if err != nil || r.State != "placed" || len(r.Allocations) != 1 {
			t.Fatalf("reservations.create = %+v, %v", r, err)
		}
		if again, err := reservations.Create.Call(ctx, acme, in); err != nil || again.ID != r.ID {
			t.Fatalf("replay = %+v, %v", again, err)
		}
		// The workflow, started once the create answered, marks it active
		// (start is now); wait, bounded.
		testutil.EventuallyNil(t, time.Minute, func() error {
			if r, err = reservations.Get.Call(ctx, acme, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID}); err != nil {
				t.Fatal(err)
			}
			if r.State != "active" {
				return fmt.Errorf("the reservation is %s, want active", r.State)
			}
			return nil
		})
		desc, err := s.Client().DescribeWorkflowExecution(ctx, r.ID, "")
		if err != nil || desc.WorkflowExecutionInfo.GetType().GetName() != "ReservationWorkflow" {
			t.Fatalf("the reservation's workflow: %v, %v", desc, err)
		}
	})

	t.Run(".dev/env", func(t *testing.T) {
		env, err := os.ReadFile(dir + "/env")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"BC_API_URL=\"" + base + "\"", "BC_DATABASE_URL=", "BC_TEMPORAL_ADDRESS=", "BC_TEMPORAL_NAMESPACE=\"better-compute\""} {
			if !bytes.Contains(env, []byte(want)) {
				t.Errorf(".dev/env lacks %s:\n%s", want, env)
			}
		}
	})
}

// A second start on the same directory finds the earlier data: rows in the
// control-plane database and workflows in Temporal's.
func TestDevStackKeepsDataAcrossRestarts(t *testing.T) {
	dir := stackDir(t)
	pgPort, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	first := startStack(t, dir, pgPort)
	run, err := first.Client().ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "kept-across-restarts", TaskQueue: "control-plane"}, "HealthCheck", "kept")
	if err != nil {
		t.Fatal(err)
	}
	var echoed string
	if err := run.Get(ctx, &echoed); err != nil || echoed != "kept" {
		t.Fatalf("workflow = %q, %v", echoed, err)
	}
	// A secret put through the API is sealed with the KEK the first start
	// generated (0600) and still opens after the restart.
	adminToken, err := first.AdminToken()
	if err != nil {
		t.Fatal(err)
	}
	put, err := secretsapi.Put.Call(ctx, api.NewClient(first.APIURL(), adminToken),
		secretsapi.PutInput{TenantID: "root", Scope: "fleet", Name: "kept-bmc", Value: "kept-value"})
	if err != nil {
		t.Fatalf("secrets.put: %v", err)
	}
	if info, err := os.Stat(filepath.Join(dir, devstack.SecretsKEKFile)); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("the dev stack's KEK file: %v, %v", info, err)
	}
	first.Stop(ctx)

	second := startStack(t, dir, pgPort)
	st, err := store.Open(ctx, second.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var value string
	if err := st.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		value, err = second.Secrets().Resolve(ctx, tx, put.Ref, secrets.Use{TenantID: "acme", Purpose: "e2e", IdentityKind: "site", IdentityID: "site_e2e"})
		return err
	}); err != nil || value != "kept-value" {
		t.Fatalf("the secret after a restart = %q, %v", value, err)
	}
	if second.Demo() != first.Demo() {
		t.Fatalf("the second start made another demo fleet: %+v, then %+v", first.Demo(), second.Demo())
	}
	var again string
	if err := second.Client().GetWorkflow(ctx, "kept-across-restarts", "").Get(ctx, &again); err != nil || again != "kept" {
		t.Fatalf("after restart the workflow result is %q, %v", again, err)
	}
	if r := get(t, second.APIURL()+"/healthz"); r.status != http.StatusOK {
		t.Fatalf("healthz after restart = %d %v", r.status, r.body)
	}
}
