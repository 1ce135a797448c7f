package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/core"
)

func registry(t *testing.T) *core.Registry {
	t.Helper()
	reg, err := api.BuildRegistry(api.Domains)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// fakeAPI answers each method with what answer says, recording the bodies.
type fakeAPI struct {
	mu     sync.Mutex
	calls  []string
	bodies []map[string]any
	tokens []string
	answer func(method string, body map[string]any) (int, string)
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	_ = decodeJSON(raw, &body)
	method := strings.Replace(strings.TrimPrefix(r.URL.Path, "/api/compute/"), "/", ".", 1)
	f.mu.Lock()
	f.calls = append(f.calls, method)
	f.bodies = append(f.bodies, body)
	f.tokens = append(f.tokens, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	f.mu.Unlock()
	status, out := f.answer(method, body)
	w.WriteHeader(status)
	io.WriteString(w, out)
}

// env is a test's configuration: a config file with one context naming a
// token file, and environment variables.
type env struct {
	t      *testing.T
	dir    string
	config string
	vars   map[string]string
	api    *fakeAPI
	url    string
}

func newEnv(t *testing.T, answer func(string, map[string]any) (int, string)) *env {
	t.Helper()
	e := &env{t: t, dir: t.TempDir(), vars: map[string]string{}, api: &fakeAPI{answer: answer}}
	srv := httptest.NewServer(e.api)
	t.Cleanup(srv.Close)
	e.url = srv.URL
	e.config = filepath.Join(e.dir, "cfg", "config.yaml")
	token := filepath.Join(e.dir, "token")
	if err := os.WriteFile(token, []byte("tok-acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &Config{CurrentContext: "dev"}
	c.Put(Context{Name: "dev", API: srv.URL, TokenFile: token, Tenant: "acme"})
	if err := c.Save(e.config); err != nil {
		t.Fatal(err)
	}
	return e
}

// run runs the CLI with args as a fresh process would.
func (e *env) run(args ...string) (string, error) {
	e.t.Helper()
	var out bytes.Buffer
	root := &cobra.Command{Use: "better-compute", SilenceUsage: true, SilenceErrors: true}
	if err := Attach(root, Options{
		Registry: registry(e.t), Stdout: &out, Stderr: io.Discard, ConfigPath: e.config,
		Getenv: func(k string) string { return e.vars[k] }, PollInterval: time.Millisecond,
	}); err != nil {
		e.t.Fatal(err)
	}
	root.SetArgs(args)
	root.SetOut(io.Discard)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func reservation(state string) string {
	return `{"id":"rsv_01","tenantId":"acme","poolId":"pool_01","state":"` + state +
		`","devices":{"class":"gpu","count":2},"start":1764601200000,"end":1764604800000,"createdAt":1764601200123}`
}

func TestDurations(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"1h": time.Hour, "90m": 90 * time.Minute, "3600s": time.Hour, "3600": time.Hour,
		"2d": 48 * time.Hour, "1d12h": 36 * time.Hour, "1h30m": 90 * time.Minute,
	} {
		got, err := ParseDuration(in)
		if err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "h", "1x", "d", "1.5d", "soon"} {
		if _, err := ParseDuration(bad); err == nil {
			t.Errorf("ParseDuration(%q) succeeded", bad)
		}
	}
	if _, err := parseSeconds("1500ms"); err == nil {
		t.Error("parseSeconds(1500ms) succeeded; the API counts whole seconds")
	}
}

func TestTimes(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"now": now, "+1h": now.Add(time.Hour), "now+2d": now.Add(48 * time.Hour), "-30m": now.Add(-30 * time.Minute),
		"2026-12-01T15:00:00Z": now.Add(3 * time.Hour), "2026-12-01T15:00:00+01:00": now.Add(2 * time.Hour),
		"1764601200000": time.UnixMilli(1764601200000),
	} {
		got, err := ParseTime(in, now)
		if err != nil || got != want.UnixMilli() {
			t.Errorf("ParseTime(%q) = %v, %v; want %v", in, got, err, want.UnixMilli())
		}
	}
	for _, bad := range []string{"tomorrow", "+", "2026-12-01", "now+x"} {
		if _, err := ParseTime(bad, now); err == nil {
			t.Errorf("ParseTime(%q) succeeded", bad)
		}
	}
	if got := FormatMillis(1764601200000); got != "2025-12-01T15:00:00Z" {
		t.Errorf("FormatMillis = %s", got)
	}
}

// Every method of the registry has its command, and every top-level input
// field its flag of the field's kind.
func TestEveryMethodHasItsCommandAndFlags(t *testing.T) {
	reg := registry(t)
	root := &cobra.Command{Use: "better-compute"}
	if err := Attach(root, Options{Registry: reg}); err != nil {
		t.Fatal(err)
	}
	clash := &cobra.Command{Use: "better-compute"}
	clash.AddCommand(&cobra.Command{Use: "projects"})
	if err := Attach(clash, Options{Registry: reg}); err == nil {
		t.Error("a group named like a command of root was attached")
	}
	for _, m := range reg.Methods() {
		cmd, _, err := root.Find([]string{m.Group, m.Name})
		if err != nil || cmd.Name() != m.Name || cmd.Parent().Name() != m.Group {
			t.Errorf("%s: no command (%v)", m.FullName(), err)
			continue
		}
		if m.Schema == nil {
			continue
		}
		for _, f := range m.Schema.Fields() {
			fl := cmd.Flags().Lookup(kebab(f.Name))
			if fl == nil {
				t.Errorf("%s: no flag for field %s", m.FullName(), f.Name)
				continue
			}
			wantBool := f.Type == core.FieldBoolean
			if (fl.Value.Type() == "bool") != wantBool {
				t.Errorf("%s --%s: flag type %s for a %s field", m.FullName(), fl.Name, fl.Value.Type(), f.Type)
			}
		}
	}
	create, _, _ := root.Find([]string{"reservations", "create"})
	for name, want := range map[string]kind{"duration": kindSeconds, "start": kindTime, "devices": kindJSON, "spot": kindBool, "binding": kindString, "leaseSeconds": kindSeconds} {
		f, ok := reg.Get("reservations.create")
		if !ok {
			t.Fatal("no reservations.create")
		}
		field, _ := f.Schema.Field(name)
		if got := kindOf(field); got != want {
			t.Errorf("reservations.create %s: kind %d, want %d", name, got, want)
		}
	}
	for _, flag := range []string{"pool", "gpus", "for", "wait", "json", "output", "context"} {
		if create.Flags().Lookup(flag) == nil {
			t.Errorf("reservations create has no --%s", flag)
		}
	}
	if list, _, _ := root.Find([]string{"nodes", "list"}); list.Flags().Lookup("wait") != nil {
		t.Error("nodes list takes --wait; only methods with a waiter do")
	}
	// camelCase names are accepted too, and groups answer to kebab-case.
	if cmd, _, err := root.Find([]string{"join-tokens", "create"}); err != nil || cmd.Name() != "create" {
		t.Errorf("join-tokens create: %v", err)
	}
	if err := create.Flags().Parse([]string{"--poolId", "pool_x"}); err != nil || create.Flags().Lookup("pool-id").Value.String() != "pool_x" {
		t.Errorf("--poolId: %v", err)
	}
}

// The example: aliases, units, the tenant from the context, a fresh
// idempotency key, --json merged under the flags.
func TestReservationsCreateBody(t *testing.T) {
	e := newEnv(t, func(string, map[string]any) (int, string) { return 200, reservation("pending") })
	out, err := e.run("reservations", "create", "--pool", "pool_01", "--gpus", "2", "--for", "1h",
		"--start", "2025-12-01T15:00:00Z", "--json", `{"spot":true,"duration":60,"binding":"node"}`, "--binding", "hold", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	body := e.api.bodies[0]
	got, _ := json.Marshal(body)
	key, _ := body["idempotencyKey"].(string)
	if !strings.HasPrefix(key, "cli-") {
		t.Errorf("idempotencyKey %q, want a fresh cli- key", key)
	}
	delete(body, "idempotencyKey")
	got, _ = json.Marshal(body)
	want := `{"binding":"hold","devices":{"class":"gpu","count":2},"duration":3600,"poolId":"pool_01","spot":true,"start":1764601200000,"tenantId":"acme"}`
	if string(got) != want {
		t.Errorf("body %s\nwant %s", got, want)
	}
	if e.api.calls[0] != "reservations.create" || e.api.tokens[0] != "tok-acme" {
		t.Errorf("called %s with token %q", e.api.calls[0], e.api.tokens[0])
	}
	if !strings.Contains(out, `"createdAt": 1764601200123`) {
		t.Errorf("-o json is not the raw answer: %s", out)
	}
	// A given key is kept; the positional argument names the id.
	if _, err := e.run("reservations", "get", "rsv_01", "--tenant-id", "other"); err != nil {
		t.Fatal(err)
	}
	if b := e.api.bodies[1]; b["reservationId"] != "rsv_01" || b["tenantId"] != "other" || len(b) != 2 {
		t.Errorf("get body %v", b)
	}
}

func TestFlagErrorsAreUsage(t *testing.T) {
	e := newEnv(t, func(string, map[string]any) (int, string) { return 200, "{}" })
	for _, args := range [][]string{
		{"reservations", "create", "--for", "soon"},
		{"reservations", "create", "--gpus", "two"},
		{"reservations", "create", "--start", "tomorrow"},
		{"reservations", "list", "--state", "happy"},
		{"reservations", "create", "--devices", "{"},
		{"reservations", "list", "--json", "[1]"},
		{"reservations", "list", "-o", "xml"},
		{"reservations", "list", "--nope"},
		{"reservations", "nope"},
		{"context", "use", "missing"},
	} {
		_, err := e.run(args...)
		if code := ExitCode(err); code != ExitUsage {
			t.Errorf("%v: exit %d (%v), want %d", args, code, err, ExitUsage)
		}
	}
	if len(e.api.calls) != 0 {
		t.Errorf("a usage error called the API: %v", e.api.calls)
	}
}

func TestExitCodesByErrorClass(t *testing.T) {
	for code, want := range map[core.Code]int{
		core.CodeInvalidInput: 2, core.CodeUnauthn: 3, core.CodeAccessDenied: 3, core.CodeNotFound: 4,
		core.CodeConflict: 5, core.CodeInvalidState: 5, core.CodeUnavailable: 6, core.CodeQuotaExceeded: 7,
		core.CodeUnsupported: 8, core.CodeInternal: 1,
	} {
		e := newEnv(t, func(string, map[string]any) (int, string) {
			return 400, `{"error":{"code":"` + string(code) + `","message":"no","details":{"field":"poolId"}}}`
		})
		_, err := e.run("pools", "list")
		if got := ExitCode(err); got != want {
			t.Errorf("%s: exit %d, want %d", code, got, want)
		}
		var b bytes.Buffer
		Report(&b, err)
		if !strings.Contains(b.String(), string(code)) || !strings.Contains(b.String(), `"field":"poolId"`) {
			t.Errorf("%s: report %q", code, b.String())
		}
	}
	if ExitCode(nil) != 0 || ExitCode(errors.New("x")) != 1 {
		t.Error("nil or a plain error")
	}
	e := newEnv(t, nil)
	e.vars[EnvAPIURL] = "http://127.0.0.1:1"
	if _, err := e.run("pools", "list"); ExitCode(err) != ExitUnavailable {
		t.Errorf("an unreachable API: exit %d (%v)", ExitCode(err), err)
	}
}

// --wait follows the reservation to a settled state and answers it.
func TestWaitFollowsTheReservation(t *testing.T) {
	states := []string{"placed", "binding", "binding", "active"}
	var gets int
	e := newEnv(t, func(method string, body map[string]any) (int, string) {
		if method == "reservations.create" {
			return 200, reservation("pending")
		}
		if body["reservationId"] != "rsv_01" || body["tenantId"] != "acme" {
			return 400, `{"error":{"code":"INVALID_INPUT","message":"bad get"}}`
		}
		s := states[min(gets, len(states)-1)]
		gets++
		return 200, reservation(s)
	})
	out, err := e.run("reservations", "create", "--pool", "pool_01", "--gpus", "2", "--for", "1h", "--wait", "-o", "id")
	if err != nil {
		t.Fatal(err)
	}
	if out != "rsv_01\n" || gets != 4 {
		t.Errorf("out %q after %d gets; want rsv_01 after 4", out, gets)
	}
	out, err = e.run("reservations", "create", "--pool", "pool_01", "--gpus", "2", "--for", "1h", "--wait", "-o", "yaml")
	if err != nil || !strings.Contains(out, "state: active") {
		t.Errorf("yaml: %v\n%s", err, out)
	}
	if settled := reservationSettled(map[string]any{"state": "placed", "start": json.Number(fmt.Sprint(time.Now().Add(time.Hour).UnixMilli()))}, time.Now()); !settled {
		t.Error("a reservation placed for a later start is settled")
	}
}

func TestTables(t *testing.T) {
	var b bytes.Buffer
	list := `{"items":[` + reservation("active") + `,` + reservation("placed") + `],"nextCursor":"c2"}`
	if err := render(&b, "table", []byte(list)); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "STATE") || !strings.Contains(lines[0], "POOL_ID") {
		t.Fatalf("table:\n%s", b.String())
	}
	if strings.Contains(lines[0], "TENANT_ID") || strings.Contains(lines[0], "DEVICES") {
		t.Errorf("narrow table shows tenantId or an object: %s", lines[0])
	}
	if !strings.Contains(lines[1], "2025-12-01T15:00:00Z") || !strings.Contains(lines[1], "active") {
		t.Errorf("row: %s", lines[1])
	}
	if lines[3] != "(more: --cursor c2)" {
		t.Errorf("no next page hint: %q", lines[3])
	}
	b.Reset()
	if err := render(&b, "table", []byte(reservation("active"))); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "CREATED_AT  2025-12-01T15:00:00.123Z") || !strings.Contains(b.String(), `{"class":"gpu","count":2}`) {
		t.Errorf("object table:\n%s", b.String())
	}
	b.Reset()
	if err := render(&b, "id", []byte(list)); err != nil || b.String() != "rsv_01\nrsv_01\n" {
		t.Errorf("-o id: %q, %v", b.String(), err)
	}
}

func TestLoginAndContexts(t *testing.T) {
	e := newEnv(t, func(method string, _ map[string]any) (int, string) {
		return 200, `{"authenticated":true,"tenantId":"root","identityId":"idn_admin"}`
	})
	adminToken := filepath.Join(e.dir, "admin-token")
	if err := os.WriteFile(adminToken, []byte("tok-admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.run("login", "--api", e.url, "--token-file", adminToken, "--context", "admin"); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "tok-admin") || !strings.Contains(string(raw), adminToken) {
		t.Errorf("config holds the token or not its file:\n%s", raw)
	}
	if fi, _ := os.Stat(e.config); fi.Mode().Perm() != 0o600 {
		t.Errorf("config mode %v", fi.Mode().Perm())
	}
	c, _ := LoadConfig(e.config)
	if c.CurrentContext != "admin" {
		t.Errorf("current %q after login", c.CurrentContext)
	}
	if x, _ := c.Get("admin"); x.Tenant != "root" {
		t.Errorf("admin context %+v: the tenant is the token's", x)
	}
	out, err := e.run("context", "list")
	if err != nil || !strings.Contains(out, "admin") || !strings.HasPrefix(strings.Split(out, "\n")[2], "*") {
		t.Errorf("context list: %v\n%s", err, out)
	}
	if _, err := e.run("context", "use", "dev"); err != nil {
		t.Fatal(err)
	}
	// The current context; BC_TOKEN and BC_TENANT override it; --context wins over both.
	call := func(args ...string) (string, any) {
		t.Helper()
		n := len(e.api.calls)
		if _, err := e.run(args...); err != nil {
			t.Fatal(err)
		}
		return e.api.tokens[n], e.api.bodies[n]["tenantId"]
	}
	if tok, ten := call("projects", "list"); tok != "tok-acme" || ten != "acme" {
		t.Errorf("current context: %s %v", tok, ten)
	}
	e.vars[EnvToken], e.vars[EnvTenant] = "tok-env", "envt"
	if tok, ten := call("projects", "list"); tok != "tok-env" || ten != "envt" {
		t.Errorf("BC_TOKEN, BC_TENANT: %s %v", tok, ten)
	}
	if tok, ten := call("projects", "list", "--context", "admin"); tok != "tok-admin" || ten != "root" {
		t.Errorf("--context: %s %v", tok, ten)
	}
	e.vars[EnvAPIURL] = "http://127.0.0.1:1"
	if tok, _ := call("projects", "list", "--context", "dev"); tok != "tok-acme" {
		t.Errorf("--context with BC_API_URL set: %s", tok)
	}
	if _, err := e.run("projects", "list"); ExitCode(err) != ExitUnavailable {
		t.Errorf("BC_API_URL did not override the context: %v", err)
	}
}

// --all follows nextCursor to the last page and answers every item.
func TestAllPagesFollowsTheCursor(t *testing.T) {
	pages := map[string]string{
		"":   `{"items":[{"id":"a"},{"id":"b"}],"nextCursor":"c1"}`,
		"c1": `{"items":[{"id":"c"}],"nextCursor":"c2"}`,
		"c2": `{"items":[]}`,
	}
	e := newEnv(t, func(_ string, body map[string]any) (int, string) {
		cursor, _ := body["cursor"].(string)
		return 200, pages[cursor]
	})
	client := &api.Client{BaseURL: e.url, HTTP: http.DefaultClient}
	raw, err := allPages(context.Background(), client, "nodes.list", map[string]any{"tenantId": "acme"}, json.RawMessage(pages[""]))
	if err != nil {
		t.Fatal(err)
	}
	if string(raw) != `{"items":[{"id":"a"},{"id":"b"},{"id":"c"}]}` || len(e.api.calls) != 2 {
		t.Errorf("all pages: %s after %d calls", raw, len(e.api.calls))
	}
	if e.api.bodies[1]["tenantId"] != "acme" || e.api.bodies[1]["cursor"] != "c2" {
		t.Errorf("the last call's body: %v", e.api.bodies[1])
	}
}

func TestDrainWaitsForDrained(t *testing.T) {
	w := waiters["nodes.drain"]
	for state, settled := range map[string]bool{"draining": false, "drained": true, "": true} {
		if got := w.Settled(map[string]any{"drainState": state}, time.Now()); got != settled {
			t.Errorf("drainState %q settled %v, want %v", state, got, settled)
		}
	}
}

// secrets put --value-file reads the value from a file, byte for byte, so
// it is never an argument of the process.
func TestSecretsPutReadsTheValueFromAFile(t *testing.T) {
	e := newEnv(t, func(string, map[string]any) (int, string) {
		return 200, `{"ref":"secret://acme/bmc","tenantId":"acme","name":"bmc","scope":"tenant","version":1}`
	})
	file := filepath.Join(e.dir, "pw")
	if err := os.WriteFile(file, []byte("p@ss word\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.run("secrets", "put", "--name", "bmc", "--value-file", file); err != nil {
		t.Fatal(err)
	}
	if b := e.api.bodies[0]; b["value"] != "p@ss word\n" || b["name"] != "bmc" || b["tenantId"] != "acme" {
		t.Errorf("body %v", b)
	}
	if _, err := e.run("secrets", "put", "--name", "bmc", "--value-file", filepath.Join(e.dir, "missing")); err == nil {
		t.Error("a missing file was accepted")
	}
}

// The exported document, alone, is the file fleet plan -f reads.
func TestFleetExportDocumentIsThePlannedFile(t *testing.T) {
	const document = `{"apiVersion":"better-compute/fleet/v1","sites":[{"name":"fra-1","kind":"shared","region":"eu-central","iamRegion":"eu-central-1"}],"pools":[]}`
	e := newEnv(t, func(method string, _ map[string]any) (int, string) {
		if method == "fleet.export" {
			return 200, `{"document":` + document + `,"digest":"sha256:00"}`
		}
		return 200, `{"planId":"fplan_01","digest":"sha256:00","changes":[]}`
	})
	out, err := e.run("fleet", "export", "--document", "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "digest") || !strings.Contains(out, "apiVersion: better-compute/fleet/v1") {
		t.Fatalf("export --document = %q", out)
	}
	file := filepath.Join(e.dir, "fleet.yaml")
	if err := os.WriteFile(file, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.run("fleet", "plan", "-f", file); err != nil {
		t.Fatal(err)
	}
	if b := e.api.bodies[1]; b["document"] != out {
		t.Errorf("plan body %v", b)
	}
}

// A streamed answer (usage export) goes to standard output as it is,
// whatever -o says.
func TestUsageExportWritesTheLines(t *testing.T) {
	const lines = "{\"intervalId\":1}\n{\"intervalId\":2}\n"
	e := newEnv(t, func(string, map[string]any) (int, string) { return 200, lines })
	out, err := e.run("usage", "export", "--from", "2025-06-01T00:00:00Z", "--to", "2025-07-01T00:00:00Z", "-o", "table")
	if err != nil {
		t.Fatal(err)
	}
	if out != lines {
		t.Fatalf("stdout = %q", out)
	}
	if b := e.api.bodies[0]; fmt.Sprint(b["from"]) != "1748736000000" || b["tenantId"] != "acme" {
		t.Errorf("body %v", b)
	}
}
