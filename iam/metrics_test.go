package iam

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// The collector's hit and miss counters move with the cache, and every
// answer's latency is recorded under its operation.
func TestCacheCollectorCountsHitsAndLatency(t *testing.T) {
	p, _, _ := newCacheTestPort(CacheOptions{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(p.Collector())
	req := cacheReadReq(cacheCallerA, "pool_1")
	for range 3 {
		if _, err := p.Authorize(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Require(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	value := func(name, label, want string) (float64, bool) {
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == label && l.GetValue() == want {
						return metricValue(m), true
					}
				}
			}
		}
		return 0, false
	}
	if hits, ok := value("bc_iam_cache_hits_total", "cache", "decisions"); !ok || hits != 2 {
		t.Errorf("decision hits = %v (%v), want 2", hits, ok)
	}
	if misses, ok := value("bc_iam_cache_misses_total", "cache", "decisions"); !ok || misses != 1 {
		t.Errorf("decision misses = %v (%v), want 1", misses, ok)
	}
	if n, ok := value("bc_iam_decision_duration_seconds", "op", "authorize"); !ok || n != 3 {
		t.Errorf("authorize observations = %v (%v), want 3", n, ok)
	}
	if n, ok := value("bc_iam_decision_duration_seconds", "op", "require"); !ok || n != 1 {
		t.Errorf("require observations = %v (%v), want 1", n, ok)
	}
	if n, ok := value("bc_iam_decision_duration_seconds", "op", "authorizeMany"); !ok || n != 0 {
		t.Errorf("authorizeMany observations = %v (%v), want a series at 0", n, ok)
	}
	if problems, err := promtest.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// metricValue is a counter's or gauge's value, or a histogram's count.
func metricValue(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetHistogram() != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}
