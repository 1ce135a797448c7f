package api

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/capacity"
)

// metrics are the API's Prometheus series, on a registry of the server's own
// (no process-global registry, so tests can run servers side by side).
// docs/metrics.md lists every series.
type metrics struct {
	registry     *prometheus.Registry
	requests     *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	calls        *prometheus.CounterVec
	callLatency  *prometheus.HistogramVec
	callFailures *prometheus.CounterVec
}

// callBuckets span a cached read (well under a millisecond) to an admission
// that waits on a busy database (seconds).
var callBuckets = prometheus.ExponentialBuckets(0.0005, 2, 16)

// newMetrics registers the API's series on reg (a new registry when nil),
// with the fleet's gauges when there is a database.
func newMetrics(reg *prometheus.Registry, st *store.Store) *metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &metrics{
		registry: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_http_requests_total", Help: "HTTP requests by route and status.",
		}, []string{"route", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "bc_http_request_duration_seconds", Help: "HTTP request latency by route.",
			Buckets: callBuckets,
		}, []string{"route"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_api_calls_total", Help: "API method calls by method and result code.",
		}, []string{"method", "code"}),
		callLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "bc_api_call_duration_seconds", Help: "API method call latency by method and result code.",
			Buckets: callBuckets,
		}, []string{"method", "code"}),
		callFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_api_call_errors_total", Help: "API method calls that failed, by method and error code.",
		}, []string{"method", "code"}),
	}
	m.registry.MustRegister(m.requests, m.latency, m.calls, m.callLatency, m.callFailures,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if st != nil {
		m.registry.MustRegister(newFleetCollector(st))
	}
	return m
}

// observeCall records a finished call: its series, and for the access log
// what the envelope learned of it (c is nil when the method is unknown).
func (s *Server) observeCall(ctx context.Context, name string, c *Call, err error, elapsed time.Duration) {
	method, code := s.metricName(name), resultCode(err)
	s.metrics.calls.WithLabelValues(method, code).Inc()
	s.metrics.callLatency.WithLabelValues(method, code).Observe(elapsed.Seconds())
	if err != nil {
		s.metrics.callFailures.WithLabelValues(method, code).Inc()
	}
	rec := recordOf(ctx)
	if rec == nil {
		return
	}
	rec.method, rec.code = method, code
	if c == nil {
		return
	}
	rec.tenant = c.TenantID
	if c.Caller != nil {
		rec.identity = c.Caller.IdentityID
		if rec.tenant == "" {
			rec.tenant = c.Caller.TenantID
		}
	}
}

// fleetCacheTTL is how long a scrape's fleet counts are reused: scrapes of
// several Prometheus servers, or a dashboard's refreshes, cost the database
// at most one round of counts per replica per TTL.
const fleetCacheTTL = 10 * time.Second

// fleetTimeout bounds the counts of one scrape; past it the scrape answers
// the last counts it had.
const fleetTimeout = 2 * time.Second

// fleetCollector exports the platform's state from PostgreSQL at scrape
// time, cached for fleetCacheTTL. Every replica exports the same values:
// aggregate them with max, not sum.
type fleetCollector struct {
	store *store.Store
	now   func() time.Time

	reservations, nodes, commands, reconcilerLag, scrapeErrors *prometheus.Desc

	mu     sync.Mutex
	at     time.Time
	fleet  capacity.Fleet
	failed uint64
}

func newFleetCollector(st *store.Store) *fleetCollector {
	return &fleetCollector{
		store: st, now: time.Now,
		reservations: prometheus.NewDesc("bc_reservations", "Reservations by state (all tenants).", []string{"state"}, nil),
		nodes: prometheus.NewDesc("bc_nodes", "Live nodes by connectivity and schedulability (all tenants).",
			[]string{"connectivity", "schedulable"}, nil),
		commands: prometheus.NewDesc("bc_node_commands", "Node commands by state: queued and delivered are the queue.",
			[]string{"state"}, nil),
		reconcilerLag: prometheus.NewDesc("bc_reconciler_lag_seconds",
			"Age of the oldest live reservation whose workflow start is not recorded (0 when none).", nil, nil),
		scrapeErrors: prometheus.NewDesc("bc_fleet_scrape_errors_total",
			"Fleet counts that failed; the gauges then keep their last values.", nil, nil),
	}
}

func (f *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- f.reservations
	ch <- f.nodes
	ch <- f.commands
	ch <- f.reconcilerLag
	ch <- f.scrapeErrors
}

func (f *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	fleet, failed := f.counts()
	for state, n := range fleet.Reservations {
		ch <- prometheus.MustNewConstMetric(f.reservations, prometheus.GaugeValue, float64(n), state)
	}
	for _, n := range fleet.Nodes {
		ch <- prometheus.MustNewConstMetric(f.nodes, prometheus.GaugeValue, float64(n.Count),
			n.Connectivity, strconv.FormatBool(n.Schedulable))
	}
	for state, n := range fleet.Commands {
		ch <- prometheus.MustNewConstMetric(f.commands, prometheus.GaugeValue, float64(n), state)
	}
	ch <- prometheus.MustNewConstMetric(f.reconcilerLag, prometheus.GaugeValue, fleet.UnstartedAgeSeconds)
	ch <- prometheus.MustNewConstMetric(f.scrapeErrors, prometheus.CounterValue, float64(failed))
}

// counts are the cached counts, read again when older than fleetCacheTTL.
// The lock is held across the read, so concurrent scrapes wait for one
// round of counts instead of each starting one.
func (f *fleetCollector) counts() (capacity.Fleet, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	if !f.at.IsZero() && now.Sub(f.at) < fleetCacheTTL {
		return f.fleet, f.failed
	}
	ctx, cancel := context.WithTimeout(context.Background(), fleetTimeout)
	defer cancel()
	var fleet capacity.Fleet
	err := f.store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		fleet, err = capacity.CountFleet(ctx, tx)
		return err
	})
	f.at = now
	if err != nil {
		f.failed++
		return f.fleet, f.failed
	}
	f.fleet = fleet
	return f.fleet, f.failed
}
