// Command bench is the whole-system load tool (DESIGN.md §5): it drives the
// real API over HTTP with N concurrent clients and reports, per scenario,
// throughput and p50/p99, beside a floor: a pgbench script making the same
// number of commits per call on the same PostgreSQL in the same run.
//
//	go run ./tools/bench                          # embedded stack in a temp dir
//	go run ./tools/bench -duration 3s -clients 8 -scenarios create,get
//	go run ./tools/bench -api URL -token T -tenant ID -pool ID [-db URL]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// config is what the flags say.
type config struct {
	clients         int
	duration        time.Duration
	requests        int
	scenarios       []string
	jsonFile        string
	apiURL          string
	token           string
	tenant          string
	pool            string
	dbURL           string
	nodes           int
	contentionCalls int
	listItems       int
	noFloor         bool
	verbose         bool
}

// allScenarios in the order they run: create first, so get and list find
// its reservations.
var allScenarios = []string{"create", "get", "list", "contention"}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	var scenarios string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.clients, "clients", 16, "concurrent clients per scenario")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "how long each scenario runs (ignored with -requests)")
	fs.IntVar(&c.requests, "requests", 0, "calls per scenario instead of a duration")
	fs.StringVar(&scenarios, "scenarios", strings.Join(allScenarios, ","), "comma list of scenarios: "+strings.Join(allScenarios, ", "))
	fs.StringVar(&c.jsonFile, "json", "", "also write the results as JSON to this file")
	fs.StringVar(&c.apiURL, "api", "", "target an existing deployment at this URL instead of an embedded stack")
	fs.StringVar(&c.token, "token", "", "bearer token of the calling tenant user (with -api)")
	fs.StringVar(&c.tenant, "tenant", "", "the caller's tenant (with -api)")
	fs.StringVar(&c.pool, "pool", "", "the pool to reserve in (with -api)")
	fs.StringVar(&c.dbURL, "db", "", "PostgreSQL URL of the deployment's cluster, for the pgbench floor (with -api)")
	fs.IntVar(&c.nodes, "nodes", 64, "simulated 8×H100 nodes added to the demo pool (embedded stack)")
	fs.IntVar(&c.contentionCalls, "contention-calls", 200, "concurrent creates racing for the last 8 GPUs (contention)")
	fs.IntVar(&c.listItems, "list-items", 500, "reservations that exist before the list scenario")
	fs.BoolVar(&c.noFloor, "no-floor", false, "skip the pgbench floor")
	fs.BoolVar(&c.verbose, "v", false, "show the embedded stack's logs")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	for _, s := range strings.Split(scenarios, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !contains(allScenarios, s) {
			return c, fmt.Errorf("unknown scenario %q (known: %s)", s, strings.Join(allScenarios, ", "))
		}
		c.scenarios = append(c.scenarios, s)
	}
	switch {
	case c.clients < 1:
		return c, errors.New("-clients must be at least 1")
	case c.requests < 0:
		return c, errors.New("-requests must not be negative")
	case c.requests == 0 && c.duration < time.Second:
		return c, errors.New("-duration must be at least 1s (pgbench counts whole seconds)")
	case c.apiURL != "" && (c.token == "" || c.tenant == "" || c.pool == ""):
		return c, errors.New("-api needs -token, -tenant and -pool")
	case c.contentionCalls < 9:
		return c, errors.New("-contention-calls must exceed the 8 free GPUs")
	}
	return c, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		stop()
		os.Exit(1)
	}
}

// run sets up the target (an embedded stack unless -api), runs each
// scenario and its floor, and prints the report.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	progress := func(format string, args ...any) { fmt.Fprintf(stderr, "bench: "+format+"\n", args...) }
	var t *target
	if cfg.apiURL != "" {
		t = externalTarget(cfg)
	} else {
		logger := slog.New(slog.NewTextHandler(io.Discard, nil))
		if cfg.verbose {
			logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
		}
		progress("starting the embedded stack (PostgreSQL, Temporal, API, worker)")
		var err error
		var cleanup func()
		t, cleanup, err = startEmbedded(ctx, cfg, logger, progress)
		if err != nil {
			return err
		}
		defer cleanup()
	}

	var fl *floorRunner
	if !cfg.noFloor && t.dbURL != "" {
		var err error
		if fl, err = newFloorRunner(ctx, t.dbURL); err != nil {
			return fmt.Errorf("floor: %w", err)
		}
		defer fl.close(context.WithoutCancel(ctx))
	}

	rep := report{Env: environment(), Config: reportConfig(cfg, t)}
	if fl != nil {
		rep.Env.Postgres = fl.version
	}
	for _, name := range cfg.scenarios {
		if err := ctx.Err(); err != nil {
			return err
		}
		progress("scenario %s", name)
		res, err := runScenario(ctx, t, cfg, name, progress)
		if err != nil {
			return fmt.Errorf("scenario %s: %w", name, err)
		}
		if res.Skipped == "" {
			switch {
			case fl == nil && cfg.noFloor:
				res.FloorSkipped = "-no-floor"
			case fl == nil:
				res.FloorSkipped = "no database URL (-db)"
			default:
				progress("floor for %s (pgbench)", name)
				f, err := fl.run(ctx, floorPlanFor(name, cfg))
				if err != nil {
					res.FloorSkipped = err.Error()
				} else {
					res.setFloor(f)
				}
			}
		}
		rep.Results = append(rep.Results, res)
	}
	fmt.Fprint(stdout, formatTable(rep.Results))
	fmt.Fprint(stdout, formatNotes(rep.Results))
	if cfg.jsonFile != "" {
		if err := writeJSON(cfg.jsonFile, rep); err != nil {
			return err
		}
		progress("wrote %s", cfg.jsonFile)
	}
	for _, r := range rep.Results {
		if r.Violation != "" {
			return fmt.Errorf("scenario %s: %s", r.Scenario, r.Violation)
		}
	}
	return nil
}
