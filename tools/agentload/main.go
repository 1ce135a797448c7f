// Command agentload is the agent load test: it holds N simulated `bcd node`
// sessions (the real agent/session client, one client certificate and
// HTTP/2 connection each) against one `better-compute serve` process, and
// measures that process's CPU, memory and heartbeat latency.
//
// It starts everything itself, in a temporary directory: a PostgreSQL
// cluster, an embedded Temporal (in-memory SQLite, in this process), a node
// CA, a site, a pool and N nodes with their identities; then it builds
// ./cmd/better-compute and runs `serve` as a child process, the API process
// measured. Run it from the repository root:
//
//	go run ./tools/agentload -agents 5000 -duration 5m -json agentload.json
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

type config struct {
	agents   int
	duration time.Duration
	ramp     int
	jsonOut  string
	bin      string
	keep     bool
	logLevel string
	pool     int
	memLimit string
}

func main() {
	var cfg config
	flag.IntVar(&cfg.agents, "agents", 5000, "simulated nodes, one session each")
	flag.DurationVar(&cfg.duration, "duration", 5*time.Minute, "how long the sessions are held once all are started")
	flag.IntVar(&cfg.ramp, "ramp", 250, "sessions started per second")
	flag.StringVar(&cfg.jsonOut, "json", "", "write the result as JSON to this file")
	flag.StringVar(&cfg.bin, "bin", "", "a prebuilt better-compute binary (default: go build ./cmd/better-compute)")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the temporary directory (logs, database)")
	flag.StringVar(&cfg.logLevel, "api-log-level", "info", "the API process's --log-level")
	flag.IntVar(&cfg.pool, "api-pool-max-conns", 0, "pool_max_conns in the API's database URL (0: pgx's default)")
	flag.StringVar(&cfg.memLimit, "api-gomemlimit", "", "GOMEMLIMIT of the API process (e.g. 900MiB; empty: the environment's)")
	flag.Parse()
	if cfg.agents <= 0 || cfg.ramp <= 0 || cfg.duration <= 0 {
		fmt.Fprintln(os.Stderr, "agentload: -agents, -ramp and -duration must be positive")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	res, err := run(ctx, cfg, logger)
	if res != nil {
		printReport(os.Stdout, res)
		if cfg.jsonOut != "" {
			b, _ := json.MarshalIndent(res, "", "  ")
			if werr := os.WriteFile(cfg.jsonOut, append(b, '\n'), 0o644); werr != nil {
				fmt.Fprintln(os.Stderr, "agentload:", werr)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentload:", err)
		os.Exit(1)
	}
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}
