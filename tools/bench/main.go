// Command bench is the whole-system load tool (DESIGN.md §5): it drives the
// real API over HTTP with N concurrent clients and reports, per scenario,
// throughput and p50/p99, beside a floor: a pgbench script making the same
// number of commits per call on the same PostgreSQL in the same run.
//
//	go run ./tools/bench                          # embedded stack in a temp dir
//	go run ./tools/bench -duration 3s -clients 8 -scenarios create,get
//	go run ./tools/bench -api URL -token T -tenant ID -pool ID [-db URL]
//	go run ./tools/bench -json new.json -compare old.json -cpuprofile cpu.pprof
//	go run ./tools/bench -scenarios agents -agents 10000 -agents-duration 2m
//
// Each row carries the goal the performance work set for it (goals.go) and
// whether this run met it; a missed goal is reported, not a failure. The
// run fails only on a broken invariant (a wrong placed count, a wrong
// capacity answer).
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
	"slices"
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
	capacityNodes   int
	capacityClients int
	activateNodes   int
	agents          int
	agentsDuration  time.Duration
	activatePoll    time.Duration
	compareFile     string
	cpuProfile      string
	memProfile      string
}

// allScenarios in the order the default runs them: create first, so get and list find
// its reservations; gin right after get, so both are measured under the
// same conditions; capacity after the scenarios its 2,000 nodes could
// disturb; agents last, as it starts a stack of its own.
var allScenarios = []string{"create", "get", "gin", "list", "contention", "activate", "capacity", "agents"}

// defaultScenarios leave out agents: 10,000 sessions take minutes to ramp
// and hold.
var defaultScenarios = []string{"create", "get", "gin", "list", "contention", "activate", "capacity"}

const scenarioHelp = `comma list of scenarios, run in the order given (the default: all but agents, in this order):
  create      reservations.create, windows a day ahead (admission + workflow start)
  get         reservations.get of the run's reservations
  gin         a bare gin JSON handler of get's shape in this process (get's "ratio gin tps" is over it)
  list        reservations.list, scope all, a page of -list-items
  contention  -contention-calls creates at once for the last 8 GPUs of a pool (embedded stack only)
  activate    creates starting now, polled with reservations.get until active (create -> active latency)
  capacity    capacity.summary over -capacity-nodes bulk-inserted 8-GPU nodes (embedded stack only)
  agents      go run ./tools/agentload -agents N: a stack of its own; slow (ramp at 250/s, then
              -agents-duration), so not in the default list
`

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	var scenarios string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.clients, "clients", 16, "concurrent clients per scenario")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "how long each scenario runs (ignored with -requests)")
	fs.IntVar(&c.requests, "requests", 0, "calls per scenario instead of a duration")
	fs.StringVar(&scenarios, "scenarios", strings.Join(defaultScenarios, ","), scenarioHelp)
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
	fs.IntVar(&c.capacityNodes, "capacity-nodes", 2000, "8-GPU nodes bulk-inserted into a pool of their own (capacity)")
	// One client by default: the goal is what one call costs, and on a
	// small machine 16 concurrent summaries measure their queue instead.
	fs.IntVar(&c.capacityClients, "capacity-clients", 1, "concurrent clients of the capacity scenario")
	fs.IntVar(&c.agents, "agents", 10000, "simulated agents (agents)")
	fs.DurationVar(&c.agentsDuration, "agents-duration", time.Minute, "how long agentload holds the sessions once all are started (agents)")
	fs.IntVar(&c.activateNodes, "activate-nodes", 64, "8-GPU nodes of activate's pool: it ends early once all are booked (embedded stack)")
	fs.DurationVar(&c.activatePoll, "activate-poll", 10*time.Millisecond, "interval between reservations.get polls (activate)")
	fs.StringVar(&c.compareFile, "compare", "", "a -json file of an earlier run: print each scenario beside it, with the change in %")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of this process (the embedded API and worker) over the scenarios' measured runs, setup left out; samples carry a scenario label (-tagfocus scenario=get)")
	fs.StringVar(&c.memProfile, "memprofile", "", "write the allocations this process made during the scenarios' measured runs (a heap profile delta: -sample_index=alloc_space)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	for _, s := range strings.Split(scenarios, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !slices.Contains(allScenarios, s) {
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
	case c.capacityClients < 1:
		return c, errors.New("-capacity-clients must be at least 1")
	case c.capacityNodes < 1:
		return c, errors.New("-capacity-nodes must be at least 1")
	case c.activateNodes < 1:
		return c, errors.New("-activate-nodes must be at least 1")
	case c.agents < 1:
		return c, errors.New("-agents must be at least 1")
	case c.agentsDuration < time.Second:
		return c, errors.New("-agents-duration must be at least 1s")
	case c.activatePoll <= 0:
		return c, errors.New("-activate-poll must be positive")
	}
	return c, nil
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
	var old *report
	if cfg.compareFile != "" {
		r, err := readReport(cfg.compareFile)
		if err != nil {
			return err
		}
		old = &r
	}
	var t *target
	switch {
	case !slices.ContainsFunc(cfg.scenarios, func(s string) bool { return s != "agents" }):
		t = &target{} // agentload starts a stack of its own
	case cfg.apiURL != "":
		t = externalTarget(cfg)
	default:
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

	prof := &profiler{}
	if cfg.cpuProfile != "" || cfg.memProfile != "" {
		prof = newProfiler(cfg.cpuProfile != "", cfg.memProfile != "")
	}
	rep := report{Version: reportVersion, Env: environment(), Config: reportConfig(cfg, t)}
	if fl != nil {
		rep.Env.Postgres = fl.version
	}
	for _, name := range cfg.scenarios {
		if err := ctx.Err(); err != nil {
			return err
		}
		progress("scenario %s", name)
		res, err := runScenario(ctx, t, cfg, name, prof, progress)
		if err != nil {
			return fmt.Errorf("scenario %s: %w", name, err)
		}
		if t != nil && t.owedStarts != nil {
			// Workflow starts run after the creates answered: let them
			// finish before the floor and the next scenario, so neither
			// measures this one's tail.
			took, err := settle(ctx, t.owedStarts)
			if err != nil {
				return fmt.Errorf("scenario %s: %w", name, err)
			}
			if took > 0 {
				res.Note = strings.TrimPrefix(res.Note+fmt.Sprintf("; its workflow starts finished %.1f s after its last call", took.Seconds()), "; ")
			}
		}
		if res.Skipped == "" {
			_, hasFloor := floorScripts[name]
			switch {
			case !hasFloor:
				res.FloorSkipped = noFloorReason(name)
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
	relate(rep.Results)
	evaluateGoals(rep.Results)
	fmt.Fprint(stdout, formatTable(rep.Results))
	fmt.Fprint(stdout, formatNotes(rep.Results))
	if old != nil {
		fmt.Fprintf(stdout, "\ncompared with %s (%s, commit %s):\n", cfg.compareFile, old.Env.Started, orDefault(old.Env.GitCommit, "unknown"))
		fmt.Fprint(stdout, formatCompare(old.Results, rep.Results))
	}
	if cfg.jsonFile != "" {
		if err := writeJSON(cfg.jsonFile, rep); err != nil {
			return err
		}
		progress("wrote %s", cfg.jsonFile)
	}
	if err := prof.write(cfg.cpuProfile, cfg.memProfile); err != nil {
		return err
	}
	for _, r := range rep.Results {
		if r.Violation != "" {
			return fmt.Errorf("scenario %s: %s", r.Scenario, r.Violation)
		}
	}
	return nil
}
