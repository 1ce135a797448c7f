package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/better-compute/better-compute/agent/session"
)

const heartbeatMetric = "bc_agent_heartbeat_seconds"

// sample is one 10-second window of the run.
type sample struct {
	At           float64 `json:"atSeconds"` // since the first session started
	Phase        string  `json:"phase"`     // ramp or hold
	Started      int     `json:"started"`   // sessions Run was called for
	Welcomed     int64   `json:"welcomed"`  // welcomes the clients saw, reconnects included
	APISessions  float64 `json:"apiSessions"`
	DBConnected  int     `json:"dbConnected"`
	Heartbeats   float64 `json:"heartbeats"` // handled by the API, cumulative
	APICPU       float64 `json:"apiCpuPercent"`
	APIRSSMiB    float64 `json:"apiRssMiB"`
	APIHeapMiB   float64 `json:"apiHeapInuseMiB"`
	APIStackMiB  float64 `json:"apiStackInuseMiB"` // goroutine stacks, outside the heap
	PGCPU        float64 `json:"postgresCpuPercent"`
	ClientCPU    float64 `json:"clientCpuPercent"`
	ClientRSSMiB float64 `json:"clientRssMiB"`
}

// result is the run's report.
type result struct {
	Agents             int      `json:"agents"`
	Ramp               int      `json:"rampPerSecond"`
	RampSeconds        float64  `json:"rampSeconds"`
	HoldSeconds        float64  `json:"holdSeconds"`
	Cores              int      `json:"cores"`
	APIPoolMaxConns    int      `json:"apiPoolMaxConns,omitempty"`
	ConnectedAtEnd     int      `json:"connectedAtEnd"` // nodes connected in the database
	APISessionsAtEnd   float64  `json:"apiSessionsAtEnd"`
	Welcomes           int64    `json:"welcomes"`
	SessionErrors      int64    `json:"sessionErrors"` // warnings and errors the clients logged
	FirstErrors        []string `json:"firstErrors,omitempty"`
	Heartbeats         float64  `json:"heartbeatsHandled"`     // whole run
	HoldHeartbeats     float64  `json:"holdHeartbeatsHandled"` // during the hold
	HeartbeatsPerSec   float64  `json:"holdHeartbeatsPerSecond"`
	HeartbeatP50ms     float64  `json:"heartbeatP50ms"` // during the hold
	HeartbeatP99ms     float64  `json:"heartbeatP99ms"`
	HeartbeatMeanms    float64  `json:"heartbeatMeanMs"`
	RunP99ms           float64  `json:"runHeartbeatP99ms"` // whole run, ramp included
	APICPUAvg          float64  `json:"apiCpuAvgPercent"`  // hold, % of one core
	APICPUMax          float64  `json:"apiCpuMaxPercent"`  // any 10 s window of the hold
	APICPURampAvg      float64  `json:"apiCpuRampAvgPercent"`
	APIRSSStartMiB     float64  `json:"apiRssStartMiB"` // before the first session
	APIRSSMaxMiB       float64  `json:"apiRssMaxMiB"`
	APIRSSEndMiB       float64  `json:"apiRssEndMiB"`
	APIHeapEndMiB      float64  `json:"apiHeapInuseEndMiB"`
	APIStackEndMiB     float64  `json:"apiStackInuseEndMiB"`
	APIGoMemLimit      string   `json:"apiGoMemLimit,omitempty"` // GOMEMLIMIT the API ran with
	PGCPUAvg           float64  `json:"postgresCpuAvgPercent"`   // hold
	PGCPUMax           float64  `json:"postgresCpuMaxPercent"`
	ClientCPUAvg       float64  `json:"clientCpuAvgPercent"` // hold
	ClientRSSMaxMiB    float64  `json:"clientRssMaxMiB"`
	ClientHeapMiB      float64  `json:"clientHeapInuseMiB"`
	ClientGoroutines   int      `json:"clientGoroutines"`
	APIGoroutines      float64  `json:"apiGoroutines"`
	Samples            []sample `json:"samples"`
	APIExitedEarly     string   `json:"apiExitedEarly,omitempty"`
	SessionsRefused    int64    `json:"sessionsRefused"`
	rampEnd, holdEnd   time.Time
	apiPID, pgPID      int
	lastAPI, lastPG    uint64
	lastSelf           uint64
	lastAt             time.Time
	holdHist, rampHist histogram
}

// counter is the clients' slog handler: it counts welcomes and problems
// and keeps the first few problems, printing nothing.
type counter struct {
	welcomed, problems, refused atomic.Int64
	mu                          sync.Mutex
	first                       []string
}

func (c *counter) Enabled(_ context.Context, l slog.Level) bool { return true }
func (c *counter) WithAttrs([]slog.Attr) slog.Handler           { return c }
func (c *counter) WithGroup(string) slog.Handler                { return c }
func (c *counter) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "session started" {
		c.welcomed.Add(1)
		return nil
	}
	if r.Level < slog.LevelWarn {
		return nil
	}
	c.problems.Add(1)
	if strings.HasPrefix(r.Message, "session refused") {
		c.refused.Add(1)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.first) < 5 {
		msg := r.Message
		r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
		c.first = append(c.first, msg)
	}
	return nil
}

func raiseNoFile(need uint64) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	if lim.Cur < need {
		progress("warning: RLIMIT_NOFILE is %d, below the %d file descriptors the sessions need (each process)", lim.Cur, need)
	}
}

func run(ctx context.Context, cfg config, logger *slog.Logger) (*result, error) {
	// One connection per session here and in the API process (a child
	// inherits the limit), plus the database's and some slack.
	raiseNoFile(uint64(cfg.agents) + 1024)
	s, err := startStack(ctx, cfg, logger)
	defer s.stop(cfg.keep)
	if err != nil {
		return nil, err
	}
	if err := s.startAPI(ctx, cfg); err != nil {
		return nil, err
	}
	res := &result{Agents: cfg.agents, Ramp: cfg.ramp, Cores: runtime.NumCPU(), APIPoolMaxConns: cfg.pool,
		APIGoMemLimit: cfg.memLimit, apiPID: s.api.Process.Pid}
	if res.pgPID, err = s.pgPID(); err != nil {
		return nil, fmt.Errorf("postmaster pid: %w", err)
	}
	rss, _ := readRSS(res.apiPID)
	res.APIRSSStartMiB = mib(rss)
	res.lastAPI = ticksOf(res.apiPID)
	res.lastPG, _ = treeTicks(res.pgPID)
	res.lastSelf = ticksOf(os.Getpid())
	res.lastAt = time.Now()

	cnt := &counter{}
	clientLog := slog.New(cnt)
	sessCtx, stopSessions := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopSessions(); wg.Wait() }()
	var started atomic.Int64
	start := time.Now()
	go func() {
		// Ramp: a tenth of the rate every 100 ms.
		per := max(cfg.ramp/10, 1)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for i := 0; i < len(s.nodes); {
			for j := 0; j < per && i < len(s.nodes); j, i = j+1, i+1 {
				id := s.nodes[i]
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = session.Run(sessCtx, session.Options{Identity: id, AgentVersion: "agentload/0", Logger: clientLog})
				}()
				started.Add(1)
			}
			select {
			case <-sessCtx.Done():
				return
			case <-t.C:
			}
		}
	}()
	progress("starting %d sessions at %d/s, then holding them for %s", cfg.agents, cfg.ramp, cfg.duration)

	var rampDone bool
	var holdStart time.Time
	var atHold histogram
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	fmt.Fprintln(os.Stderr, "    t  phase started welcomed apiSess dbConn    hb/s  apiCPU%  apiRSS apiHeap  pgCPU%  cliCPU%  cliRSS")
	var lastHB float64
	for {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case err := <-s.apiExit:
			res.APIExitedEarly = fmt.Sprint(err)
			return res, fmt.Errorf("the API process exited during the run: %v (log in %s)", err, s.dir)
		case <-tick.C:
		}
		phase := "ramp"
		if rampDone {
			phase = "hold"
		}
		sm, hist, goroutines := res.sample(ctx, s, phase, started.Load(), cnt.welcomed.Load(), start)
		fmt.Fprintf(os.Stderr, "%5.0fs %5s %7d %8d %7.0f %6d %7.1f %8.1f %7.0f %7.0f %7.1f %8.1f %7.0f\n", sm.At, sm.Phase,
			sm.Started, sm.Welcomed, sm.APISessions, sm.DBConnected, (sm.Heartbeats-lastHB)/10, sm.APICPU, sm.APIRSSMiB,
			sm.APIHeapMiB, sm.PGCPU, sm.ClientCPU, sm.ClientRSSMiB)
		lastHB = sm.Heartbeats
		res.APIGoroutines = goroutines
		if !rampDone && int(started.Load()) == cfg.agents {
			// The hold starts once every session is started and the
			// last are through their hello (one window later).
			rampDone = true
			holdStart = time.Now()
			atHold = hist
			res.RampSeconds = time.Since(start).Seconds()
			res.rampHist = hist
			continue
		}
		if rampDone && time.Since(holdStart) >= cfg.duration-time.Second {
			res.HoldSeconds = time.Since(holdStart).Seconds()
			res.holdHist = hist.sub(atHold)
			res.HeartbeatsPerSec = res.holdHist.Count / res.HoldSeconds
			break
		}
	}

	// The end: what holds now, before the sessions stop.
	res.ConnectedAtEnd = dbConnected(ctx, s)
	res.Welcomes, res.SessionErrors, res.SessionsRefused = cnt.welcomed.Load(), cnt.problems.Load(), cnt.refused.Load()
	cnt.mu.Lock()
	res.FirstErrors = append([]string(nil), cnt.first...)
	cnt.mu.Unlock()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.ClientHeapMiB = mib(ms.HeapInuse)
	res.ClientGoroutines = runtime.NumGoroutine()
	res.summarize()
	return res, nil
}

func ticksOf(pid int) uint64 {
	t, err := readStat(pid)
	if err != nil {
		return 0
	}
	return t.UTime + t.STime
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// sample measures the window since the last.
func (r *result) sample(ctx context.Context, s *stack, phase string, started, welcomed int64, start time.Time) (sample, histogram, float64) {
	now := time.Now()
	secs := now.Sub(r.lastAt).Seconds()
	api, self := ticksOf(r.apiPID), ticksOf(os.Getpid())
	pg, _ := treeTicks(r.pgPID)
	pct := func(cur, last uint64) float64 { return float64(cur-last) / clockTicks / secs * 100 }
	sm := sample{At: now.Sub(start).Seconds(), Phase: phase, Started: int(started), Welcomed: welcomed,
		APICPU: pct(api, r.lastAPI), PGCPU: pct(pg, r.lastPG), ClientCPU: pct(self, r.lastSelf)}
	r.lastAPI, r.lastPG, r.lastSelf, r.lastAt = api, pg, self, now
	rss, _ := readRSS(r.apiPID)
	sm.APIRSSMiB = mib(rss)
	crss, _ := readRSS(os.Getpid())
	sm.ClientRSSMiB = mib(crss)
	text := scrape(ctx, s.apiURL+"/metrics")
	hist, _ := parseHistogram(text, heartbeatMetric)
	sm.Heartbeats = hist.Count
	sm.APISessions = gaugeValue(text, "bc_agent_sessions")
	goroutines := gaugeValue(text, "go_goroutines")
	sm.APIHeapMiB = gaugeValue(text, "go_memstats_heap_inuse_bytes") / (1 << 20)
	sm.APIStackMiB = gaugeValue(text, "go_memstats_stack_inuse_bytes") / (1 << 20)
	sm.DBConnected = dbConnected(ctx, s)
	r.Samples = append(r.Samples, sm)
	r.Heartbeats = hist.Count
	r.APISessionsAtEnd = sm.APISessions
	return sm, hist, goroutines
}

func scrape(ctx context.Context, url string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// gaugeValue is an unlabelled series' value in a text exposition, NaN when
// absent.
func gaugeValue(text, name string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return math.NaN()
}

func dbConnected(ctx context.Context, s *stack) int {
	var n int
	_ = s.st.Pool.QueryRow(ctx, `SELECT count(*) FROM nodes WHERE pool_id = $1 AND connectivity = 'connected'`, s.poolID).Scan(&n)
	return n
}

func (r *result) summarize() {
	var n int
	var apiSum, pgSum, cliSum, rampSum float64
	var rampN int
	for _, s := range r.Samples {
		r.APIRSSMaxMiB = max(r.APIRSSMaxMiB, s.APIRSSMiB)
		r.ClientRSSMaxMiB = max(r.ClientRSSMaxMiB, s.ClientRSSMiB)
		r.APIRSSEndMiB, r.APIHeapEndMiB, r.APIStackEndMiB = s.APIRSSMiB, s.APIHeapMiB, s.APIStackMiB
		if s.Phase != "hold" {
			rampSum += s.APICPU
			rampN++
			continue
		}
		n++
		apiSum += s.APICPU
		pgSum += s.PGCPU
		cliSum += s.ClientCPU
		r.APICPUMax = max(r.APICPUMax, s.APICPU)
		r.PGCPUMax = max(r.PGCPUMax, s.PGCPU)
	}
	if n > 0 {
		r.APICPUAvg, r.PGCPUAvg, r.ClientCPUAvg = apiSum/float64(n), pgSum/float64(n), cliSum/float64(n)
	}
	if rampN > 0 {
		r.APICPURampAvg = rampSum / float64(rampN)
	}
	r.HoldHeartbeats = r.holdHist.Count
	r.HeartbeatP50ms = r.holdHist.quantile(0.50) * 1000
	r.HeartbeatP99ms = r.holdHist.quantile(0.99) * 1000
	if r.holdHist.Count > 0 {
		r.HeartbeatMeanms = r.holdHist.Sum / r.holdHist.Count * 1000
	}
	if len(r.Samples) > 0 {
		// The whole run's histogram is the hold's plus the ramp's.
		whole := r.holdHist
		for i := range whole.Buckets {
			if i < len(r.rampHist.Buckets) {
				whole.Buckets[i].Count += r.rampHist.Buckets[i].Count
			}
		}
		r.RunP99ms = whole.quantile(0.99) * 1000
	}
	for _, f := range []*float64{&r.HeartbeatP50ms, &r.HeartbeatP99ms, &r.RunP99ms, &r.APISessionsAtEnd, &r.APIGoroutines} {
		if math.IsNaN(*f) {
			*f = -1 // JSON has no NaN
		}
	}
}

func printReport(w io.Writer, r *result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("agents", "%d (ramp %d/s, %.0f s)", r.Agents, r.Ramp, r.RampSeconds)
	row("hold", "%.0f s", r.HoldSeconds)
	row("cores", "%d (API, PostgreSQL, Temporal and the clients share them)", r.Cores)
	if r.APIPoolMaxConns > 0 {
		row("API pool_max_conns", "%d", r.APIPoolMaxConns)
	}
	row("connected at end (DB)", "%d", r.ConnectedAtEnd)
	row("live sessions at end (API)", "%.0f", r.APISessionsAtEnd)
	row("welcomes / client problems", "%d / %d (refused %d)", r.Welcomes, r.SessionErrors, r.SessionsRefused)
	row("heartbeats handled", "%.0f in the hold (%.1f/s), %.0f in all", r.HoldHeartbeats, r.HeartbeatsPerSec, r.Heartbeats)
	row("heartbeat p50 / p99 / mean", "%.2f / %.2f / %.2f ms (hold); p99 %.2f ms whole run", r.HeartbeatP50ms, r.HeartbeatP99ms, r.HeartbeatMeanms, r.RunP99ms)
	row("API CPU avg / max", "%.1f%% / %.1f%% of one core (hold, 10 s windows); ramp avg %.1f%%", r.APICPUAvg, r.APICPUMax, r.APICPURampAvg)
	row("API RSS start / max / end", "%.0f / %.0f / %.0f MiB (heap in use at end %.0f MiB, stacks %.0f MiB)", r.APIRSSStartMiB, r.APIRSSMaxMiB, r.APIRSSEndMiB, r.APIHeapEndMiB, r.APIStackEndMiB)
	if r.APIGoMemLimit != "" {
		row("API GOMEMLIMIT", "%s", r.APIGoMemLimit)
	}
	row("API goroutines", "%.0f", r.APIGoroutines)
	row("PostgreSQL CPU avg / max", "%.1f%% / %.1f%% (hold, all its processes)", r.PGCPUAvg, r.PGCPUMax)
	row("client CPU avg", "%.1f%% (hold; includes embedded Temporal)", r.ClientCPUAvg)
	row("client RSS max / heap / goroutines", "%.0f MiB / %.0f MiB / %d", r.ClientRSSMaxMiB, r.ClientHeapMiB, r.ClientGoroutines)
	for _, e := range r.FirstErrors {
		row("client problem", "%s", e)
	}
	if r.APIExitedEarly != "" {
		row("API exited early", "%s", r.APIExitedEarly)
	}
	_ = tw.Flush()
}
