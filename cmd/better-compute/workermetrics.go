package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/better-compute/better-compute/api/httpx"
	"github.com/better-compute/better-compute/workers"
)

// workerMetrics makes the worker's series and, when addr is set, serves them
// at /metrics there (a worker has no API listener to put them on). stop
// closes the listener.
func workerMetrics(ctx context.Context, addr string, logger *slog.Logger) (m *workers.Metrics, stop func(), err error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if m, err = workers.NewMetrics(reg); err != nil {
		return nil, nil, err
	}
	if addr == "" {
		return m, func() {}, nil
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := httpx.NewServer(mux, httpx.Timeouts{})
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("metrics listener", "error", err)
		}
	}()
	logger.Info("worker metrics", "addr", ln.Addr().String())
	return m, func() { _ = srv.Close() }, nil
}
