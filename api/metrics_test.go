package api_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/internal/testutil"
)

// lockedBuffer is a log sink the server writes to while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lines are the JSON log lines written so far.
func (l *lockedBuffer) lines() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// observedServer is the env's API again, logging JSON to a buffer and
// exporting on a registry that also holds the IAM caches' series.
type observedServer struct {
	url  string
	logs *lockedBuffer
}

func newObservedServer(t *testing.T, e *env) *observedServer {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(e.cache.Collector())
	logs := &lockedBuffer{}
	srv, err := api.New(api.Deps{Store: e.store, IAM: e.outer, Catalog: e.catalog, Metrics: reg,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &observedServer{url: hs.URL, logs: logs}
}

// post calls method over HTTP with token and an optional request id; it
// answers the status, the X-Request-Id header and the decoded body.
func (o *observedServer) post(t *testing.T, token, requestID, method, body string) (int, string, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, o.url+"/api/compute/"+strings.Replace(method, ".", "/", 1), strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if requestID != "" {
		req.Header.Set("X-Request-Id", requestID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("X-Request-Id"), out
}

// scrape reads /metrics over HTTP, as Prometheus does.
func (o *observedServer) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(o.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return families
}

// seriesValue finds the family's metric with exactly these labels; its value is a
// counter's or gauge's value, or a histogram's count.
func seriesValue(families map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	f, ok := families[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		for _, l := range m.GetLabel() {
			if labels[l.GetName()] != l.GetValue() {
				continue next
			}
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func TestMetricsSeriesByMethodAndCode(t *testing.T) {
	e := newEnv(t)
	o := newObservedServer(t, e)
	if status, _, _ := o.post(t, "", "", "system.version", `{}`); status != 200 {
		t.Fatalf("system.version = %d", status)
	}
	if status, _, _ := o.post(t, "", "", "projects.list", `{"tenantId":"globex"}`); status != 401 {
		t.Fatalf("projects.list without a credential = %d", status)
	}
	if status, _, _ := o.post(t, e.globex, "", "projects.list", `{"tenantId":"acme"}`); status != 403 {
		t.Fatalf("projects.list in another tenant = %d", status)
	}
	families := o.scrape(t)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"bc_api_call_duration_seconds", map[string]string{"method": "system.version", "code": "OK"}, 1},
		{"bc_api_calls_total", map[string]string{"method": "system.version", "code": "OK"}, 1},
		{"bc_api_call_duration_seconds", map[string]string{"method": "projects.list", "code": "UNAUTHENTICATED"}, 1},
		{"bc_api_call_errors_total", map[string]string{"method": "projects.list", "code": "UNAUTHENTICATED"}, 1},
		{"bc_api_call_errors_total", map[string]string{"method": "projects.list", "code": "ACCESS_DENIED"}, 1},
		// The fleet's gauges, from the database: every state is a series.
		{"bc_reservations", map[string]string{"state": "active"}, 0},
		{"bc_nodes", map[string]string{"connectivity": "connected", "schedulable": "true"}, 0},
		{"bc_node_commands", map[string]string{"state": "queued"}, 0},
		{"bc_reconciler_lag_seconds", map[string]string{}, 0},
		{"bc_fleet_scrape_errors_total", map[string]string{}, 0},
	} {
		if got, ok := seriesValue(families, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if _, ok := seriesValue(families, "bc_api_call_errors_total", map[string]string{"method": "system.version", "code": "OK"}); ok {
		t.Error("a successful call counted as an error")
	}
}

func TestErrorBodyCarriesTheRequestID(t *testing.T) {
	e := newEnv(t)
	o := newObservedServer(t, e)
	status, header, body := o.post(t, "", "trace-42", "projects.list", `{"tenantId":"globex"}`)
	if status != 401 || header != "trace-42" || body["requestId"] != "trace-42" {
		t.Fatalf("= %d, header %q, body %v; want 401 with requestId trace-42 in both", status, header, body)
	}
	// A malformed id is replaced by one of ours, in the body and the header.
	_, header, body = o.post(t, "", "bad id with spaces", "projects.list", `{"tenantId":"globex"}`)
	if !strings.HasPrefix(header, "req") || body["requestId"] != header {
		t.Fatalf("header %q, body %v; want a generated id in both", header, body)
	}
	// Errors outside the envelope (an unknown route) carry it too.
	_, header, body = o.post(t, "", "", "nope.nope", `{}`)
	if header == "" || body["requestId"] != header {
		t.Fatalf("unknown method: header %q, body %v", header, body)
	}
}

func TestAccessLogNamesTenantIdentityMethodAndCode(t *testing.T) {
	e := newEnv(t)
	o := newObservedServer(t, e)
	status, _, whoami := o.post(t, e.globex, "", "system.whoami", `{}`)
	if status != 200 {
		t.Fatalf("whoami = %d %v", status, whoami)
	}
	identity, _ := whoami["identityId"].(string)
	if identity == "" {
		t.Fatalf("whoami has no identityId: %v", whoami)
	}
	if status, _, _ := o.post(t, e.globex, "log-denied", "projects.list", `{"tenantId":"acme"}`); status != 403 {
		t.Fatalf("projects.list in another tenant = %d", status)
	}
	if status, _, _ := o.post(t, e.globex, "log-allowed", "projects.list", `{"tenantId":"globex"}`); status != 200 {
		t.Fatalf("projects.list = %d", status)
	}
	// The line is written once the handler returns, which may be after the
	// client has read the answer.
	find := func(requestID string) map[string]any {
		for _, l := range o.logs.lines() {
			if l["msg"] == "request" && l["requestId"] == requestID {
				return l
			}
		}
		return nil
	}
	testutil.Eventually(t, 10*time.Second, "both access log lines", func() bool {
		return find("log-denied") != nil && find("log-allowed") != nil
	})
	for id, want := range map[string]map[string]any{
		"log-denied":  {"apiMethod": "projects.list", "code": "ACCESS_DENIED", "tenantId": "acme", "identityId": identity, "status": float64(403)},
		"log-allowed": {"apiMethod": "projects.list", "code": "OK", "tenantId": "globex", "identityId": identity, "status": float64(200)},
	} {
		line := find(id)
		for k, v := range want {
			if line[k] != v {
				t.Errorf("%s: %s = %v, want %v (line %v)", id, k, line[k], v, line)
			}
		}
		for _, secret := range []string{e.globex, "Bearer"} {
			if raw, _ := json.Marshal(line); strings.Contains(string(raw), secret) {
				t.Errorf("%s: the line carries a credential: %s", id, raw)
			}
		}
	}
}

func TestIAMCacheHitCounterMoves(t *testing.T) {
	e := newEnv(t)
	o := newObservedServer(t, e)
	hits := func() float64 {
		v, _ := seriesValue(o.scrape(t), "bc_iam_cache_hits_total", map[string]string{"cache": "authentications"})
		return v
	}
	before := hits()
	for range 2 {
		if status, _, _ := o.post(t, e.globex, "", "projects.list", `{"tenantId":"globex"}`); status != 200 {
			t.Fatalf("projects.list = %d", status)
		}
	}
	// The second call's authentication (at least) came from the cache.
	if after := hits(); after < before+1 {
		t.Fatalf("authentication cache hits %v → %v, want at least one more", before, after)
	}
	if _, ok := seriesValue(o.scrape(t), "bc_iam_decision_duration_seconds", map[string]string{"op": "authenticate"}); !ok {
		t.Error("no IAM latency series for authenticate")
	}
}
