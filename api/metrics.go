package api

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the API's Prometheus series, on a registry of the server's own
// (no process-global registry, so tests can run servers side by side).
type metrics struct {
	registry *prometheus.Registry
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	calls    *prometheus.CounterVec
	// heartbeat is the handling time of the agent sessions' heartbeat
	// frames (the lease renewal's transaction, errors included).
	heartbeat prometheus.Histogram
}

// heartbeatBuckets run from 0.5 ms to 2 s, each about 1.41× the last.
var heartbeatBuckets = prometheus.ExponentialBucketsRange(0.0005, 2, 25)

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_http_requests_total", Help: "HTTP requests by route and status.",
		}, []string{"route", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "bc_http_request_duration_seconds", Help: "HTTP request latency by route.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"route"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_api_calls_total", Help: "API method calls by method and result code.",
		}, []string{"method", "code"}),
		heartbeat: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "bc_agent_heartbeat_seconds", Help: "Handling time of agent session heartbeat frames.",
			Buckets: heartbeatBuckets,
		}),
	}
	m.registry.MustRegister(m.requests, m.latency, m.calls, m.heartbeat,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// observeHeartbeat records a heartbeat frame handled since start.
func (s *Server) observeHeartbeat(start time.Time) {
	s.metrics.heartbeat.Observe(time.Since(start).Seconds())
}

// registerSessionGauge registers bc_agent_sessions, the live agent
// sessions of this process.
func (s *Server) registerSessionGauge() {
	s.metrics.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "bc_agent_sessions", Help: "Live agent sessions of this process.",
	}, func() float64 {
		s.agents.mu.Lock()
		defer s.agents.mu.Unlock()
		return float64(s.agents.live)
	}))
}
