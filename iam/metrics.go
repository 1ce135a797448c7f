package iam

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The operations whose latency a CachingPort records, as the op label.
const (
	opAuthenticate  = "authenticate"
	opAuthorize     = "authorize"
	opRequire       = "require"
	opAuthorizeMany = "authorizeMany"
)

// newPortLatency is the latency of a CachingPort's answers by operation,
// cache hits included: what a call to the API waits on IAM. Every op's
// series exists from the start, so dashboards see zeros rather than nothing.
func newPortLatency() *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "bc_iam_decision_duration_seconds",
		Help:    "Latency of IAM answers through the caches, by operation (cache hits included).",
		Buckets: prometheus.ExponentialBuckets(0.00005, 2, 18),
	}, []string{"op"})
	for _, op := range []string{opAuthenticate, opAuthorize, opRequire, opAuthorizeMany} {
		h.WithLabelValues(op)
	}
	return h
}

// observe records one answer of op that started at start.
func (p *CachingPort) observe(op string, start time.Time) {
	p.latency.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

// Collector exports the port's series for Prometheus: the answers' latency
// and both caches' counters (read from Stats at scrape time).
func (p *CachingPort) Collector() prometheus.Collector { return &cacheCollector{p: p} }

var (
	cacheHitsDesc = prometheus.NewDesc("bc_iam_cache_hits_total",
		"Answers the IAM cache held, by cache (authentications, decisions).", []string{"cache"}, nil)
	cacheMissesDesc = prometheus.NewDesc("bc_iam_cache_misses_total",
		"Answers the IAM cache did not hold and asked IAM for, by cache.", []string{"cache"}, nil)
	cacheEvictionsDesc = prometheus.NewDesc("bc_iam_cache_evictions_total",
		"Entries pushed out of the IAM cache at its cap, by cache.", []string{"cache"}, nil)
	cacheEntriesDesc = prometheus.NewDesc("bc_iam_cache_entries",
		"Entries the IAM cache holds now, by cache.", []string{"cache"}, nil)
)

type cacheCollector struct{ p *CachingPort }

func (c *cacheCollector) Describe(ch chan<- *prometheus.Desc) {
	c.p.latency.Describe(ch)
	for _, d := range []*prometheus.Desc{cacheHitsDesc, cacheMissesDesc, cacheEvictionsDesc, cacheEntriesDesc} {
		ch <- d
	}
}

func (c *cacheCollector) Collect(ch chan<- prometheus.Metric) {
	c.p.latency.Collect(ch)
	s := c.p.Stats()
	for cache, n := range map[string]CacheCounters{"authentications": s.Authentications, "decisions": s.Decisions} {
		ch <- prometheus.MustNewConstMetric(cacheHitsDesc, prometheus.CounterValue, float64(n.Hits), cache)
		ch <- prometheus.MustNewConstMetric(cacheMissesDesc, prometheus.CounterValue, float64(n.Misses), cache)
		ch <- prometheus.MustNewConstMetric(cacheEvictionsDesc, prometheus.CounterValue, float64(n.Evictions), cache)
		ch <- prometheus.MustNewConstMetric(cacheEntriesDesc, prometheus.GaugeValue, float64(n.Entries), cache)
	}
}
