// Package grafana holds the Grafana dashboard of the project's Prometheus
// series; its test keeps the dashboard and docs/metrics.md true to what the
// processes export.
package grafana_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/better-compute/better-compute/internal/controlplane"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/workers"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// describing records the names of the series registered through it, for
// those (labelled counters) that have no sample until something happens.
type describing struct {
	prometheus.Registerer
	names []string
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *describing) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			d.names = append(d.names, m[1])
		}
	}
	return d.Registerer.Register(c)
}

// exported are the series names one API process (with a worker on the same
// registry, as the dev stack runs it) exports after a few calls.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	worker := &describing{Registerer: reg}
	if _, err := workers.NewMetrics(worker); err != nil {
		t.Fatal(err)
	}
	cp, err := controlplane.New(context.Background(), controlplane.Config{
		Store: testenv.Store(t), Metrics: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	hs := httptest.NewServer(cp.API)
	t.Cleanup(hs.Close)
	for _, call := range []struct{ path, body string }{
		{"/api/compute/system/version", `{}`},
		{"/api/compute/projects/list", `{"tenantId":"acme"}`}, // no credential: an error
		{"/api/compute/system/whoami", `{}`},
	} {
		resp, err := http.Post(hs.URL+call.path, "application/json", strings.NewReader(call.body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	resp, err := http.Get(hs.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for name := range families {
		names[name] = true
	}
	for _, name := range worker.names {
		names[name] = true
	}
	return names
}

type panel struct {
	Title   string  `json:"title"`
	Type    string  `json:"type"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

var seriesName = regexp.MustCompile(`\bbc_[a-z0-9_]+`)

// Every expression of the dashboard names only series the process exports
// (a histogram's by its _bucket, _sum or _count), and every series of ours
// is listed in docs/metrics.md. The dashboard shows each thing operators
// were promised a series for.
func TestDashboardNamesOnlyExportedSeries(t *testing.T) {
	raw, err := os.ReadFile("better-compute.json")
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		Title  string  `json:"title"`
		UID    string  `json:"uid"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dashboard); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	if dashboard.Title == "" || dashboard.UID == "" || len(dashboard.Panels) == 0 {
		t.Fatalf("dashboard without a title, uid or panels")
	}
	names := exported(t)
	known := func(s string) bool {
		if names[s] {
			return true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(s, suffix); ok && names[base] {
				return true
			}
		}
		return false
	}
	used := map[string]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, target := range p.Targets {
				series := seriesName.FindAllString(target.Expr, -1)
				if len(series) == 0 {
					t.Errorf("panel %q: %q names no series of ours", p.Title, target.Expr)
				}
				for _, s := range series {
					used[s] = true
					for _, suffix := range []string{"_bucket", "_sum", "_count"} {
						if base, ok := strings.CutSuffix(s, suffix); ok {
							used[base] = true
						}
					}
					if !known(s) {
						t.Errorf("panel %q: %s is not exported", p.Title, s)
					}
				}
			}
		}
	}
	walk(dashboard.Panels)

	docs, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var ours []string
	for name := range names {
		if strings.HasPrefix(name, "bc_") {
			ours = append(ours, name)
		}
	}
	slices.Sort(ours)
	for _, name := range ours {
		if !strings.Contains(string(docs), "`"+name+"`") {
			t.Errorf("docs/metrics.md does not list %s", name)
		}
	}
	for _, want := range []string{"bc_api_call_duration_seconds", "bc_api_call_errors_total", "bc_reservations",
		"bc_nodes", "bc_node_commands", "bc_reconciler_lag_seconds", "bc_agent_sessions", "bc_workflow_failures_total",
		"bc_activity_failures_total", "bc_iam_decision_duration_seconds", "bc_iam_cache_hits_total"} {
		if !names[want] || !used[want] {
			t.Errorf("%s: exported %v, on the dashboard %v", want, names[want], used[want])
		}
	}
}
