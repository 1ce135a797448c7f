package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// result is one scenario's numbers, as the table and the JSON show them.
type result struct {
	Scenario   string         `json:"scenario"`
	Clients    int            `json:"clients"`
	Calls      int            `json:"calls"`
	OK         int            `json:"ok"`
	Errors     int            `json:"errors"`
	ErrorCodes map[string]int `json:"errorCodes,omitempty"`
	// FirstErrors is one message of each error code, to say what failed.
	FirstErrors map[string]string `json:"firstErrors,omitempty"`
	Seconds     float64           `json:"seconds"`
	CallsPerSec float64           `json:"callsPerSec"`
	MeanMs      float64           `json:"meanMs"`
	P50Ms       float64           `json:"p50Ms"`
	P99Ms       float64           `json:"p99Ms"`
	// Placed and Refused: the contention scenario's outcomes.
	Placed    *int   `json:"placed,omitempty"`
	Refused   *int   `json:"refused,omitempty"`
	Violation string `json:"violation,omitempty"` // an invariant the run broke
	Note      string `json:"note,omitempty"`
	Skipped   string `json:"skipped,omitempty"`

	Floor        *floorResult `json:"floor,omitempty"`
	FloorSkipped string       `json:"floorSkipped,omitempty"`
	// RatioP50 is the API's p50 over the floor's; RatioThroughput the API's
	// calls/s over the floor's tps (the share of the floor reached).
	RatioP50        float64 `json:"ratioP50,omitempty"`
	RatioThroughput float64 `json:"ratioThroughput,omitempty"`
	// RatioGin (get only) is get's calls/s over the gin scenario's: the
	// share of a bare gin JSON handler's throughput reached.
	RatioGin float64 `json:"ratioGinThroughput,omitempty"`

	// CreateCall (activate) is the create call's own latency; the row's
	// latencies are create -> active.
	CreateCall *latencies `json:"createCall,omitempty"`
	// Agents is what agentload measured (agents).
	Agents *agentsResult `json:"agents,omitempty"`

	// Goal is the target set for the scenario; GoalMet whether this run
	// met it (absent: not evaluated, GoalNote says why); GoalNote the
	// figures the verdict rests on.
	Goal     string `json:"goal,omitempty"`
	GoalMet  *bool  `json:"goalMet,omitempty"`
	GoalNote string `json:"goalNote,omitempty"`
}

// latencies summarizes a set of durations.
type latencies struct {
	Count  int     `json:"count"`
	MeanMs float64 `json:"meanMs"`
	P50Ms  float64 `json:"p50Ms"`
	P99Ms  float64 `json:"p99Ms"`
}

func summarize(ds []time.Duration) latencies {
	ms := make([]float64, len(ds))
	for i, d := range ds {
		ms[i] = float64(d) / float64(time.Millisecond)
	}
	slices.Sort(ms)
	return latencies{Count: len(ms), MeanMs: mean(ms), P50Ms: percentile(ms, 50), P99Ms: percentile(ms, 99)}
}

// fill sets the call counts and latency figures of a run.
func (r *result) fill(run loadRun) {
	r.Calls = len(run.latencies)
	r.OK = run.ok
	r.Errors = r.Calls - r.OK
	if len(run.errors) > 0 {
		r.ErrorCodes, r.FirstErrors = run.errors, run.firstErr
	}
	r.Seconds = run.elapsed.Seconds()
	if r.Seconds > 0 {
		r.CallsPerSec = float64(r.Calls) / r.Seconds
	}
	l := summarize(run.latencies)
	r.MeanMs, r.P50Ms, r.P99Ms = l.MeanMs, l.P50Ms, l.P99Ms
}

func (r *result) setFloor(f floorResult) {
	r.Floor = &f
	if f.P50Ms > 0 {
		r.RatioP50 = r.P50Ms / f.P50Ms
	}
	if f.TPS > 0 {
		r.RatioThroughput = r.CallsPerSec / f.TPS
	}
}

// percentile is the nearest-rank p-th percentile of sorted values (0 for
// none): the smallest value with at least p% of the values at or below it.
func percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	return sorted[min(max(rank, 1), n)-1]
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}

var tableHeader = []string{"scenario", "clients", "calls", "ok", "errors", "calls/s", "p50 ms", "p99 ms",
	"floor tps", "floor p50 ms", "ratio p50", "ratio tps", "ratio gin tps", "goal"}

// formatTable lays the results out in aligned columns separated by "|".
func formatTable(results []result) string {
	rows := [][]string{tableHeader}
	for _, r := range results {
		if r.Skipped != "" {
			rows = append(rows, []string{r.Scenario, "-", "skipped", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", goalCell(r)})
			continue
		}
		row := []string{r.Scenario, fmt.Sprint(r.Clients), fmt.Sprint(r.Calls), fmt.Sprint(r.OK), fmt.Sprint(r.Errors),
			fmt.Sprintf("%.1f", r.CallsPerSec), fmt.Sprintf("%.2f", r.P50Ms), fmt.Sprintf("%.2f", r.P99Ms)}
		if f := r.Floor; f != nil {
			row = append(row, fmt.Sprintf("%.1f", f.TPS), fmt.Sprintf("%.2f", f.P50Ms),
				fmt.Sprintf("%.2fx", r.RatioP50), fmt.Sprintf("%.2f", r.RatioThroughput))
		} else {
			row = append(row, "-", "-", "-", "-")
		}
		if r.RatioGin > 0 {
			row = append(row, fmt.Sprintf("%.2f", r.RatioGin))
		} else {
			row = append(row, "-")
		}
		rows = append(rows, append(row, goalCell(r)))
	}
	return alignRows(rows)
}

// formatNotes says per scenario what the table cannot: skips, outcomes,
// error codes and what the floor did.
func formatNotes(results []result) string {
	var b strings.Builder
	for _, r := range results {
		var notes []string
		if r.Skipped != "" {
			notes = append(notes, "skipped: "+r.Skipped)
		}
		if r.Note != "" {
			notes = append(notes, r.Note)
		}
		if r.Violation != "" {
			notes = append(notes, "VIOLATION: "+r.Violation)
		}
		if r.Goal != "" {
			notes = append(notes, fmt.Sprintf("goal %s: %s", r.Goal, goalVerdict(r)))
		}
		if len(r.ErrorCodes) > 0 {
			codes := make([]string, 0, len(r.ErrorCodes))
			for code, n := range r.ErrorCodes {
				c := fmt.Sprintf("%s×%d", code, n)
				if msg := r.FirstErrors[code]; msg != "" {
					c += fmt.Sprintf(" (%q)", msg)
				}
				codes = append(codes, c)
			}
			slices.Sort(codes)
			notes = append(notes, "errors: "+strings.Join(codes, ", "))
		}
		if f := r.Floor; f != nil {
			fn := fmt.Sprintf("floor: %s, %d clients, %d calls", f.Shape, f.Clients, f.Transactions)
			if f.Failed > 0 {
				fn += fmt.Sprintf(", %d failed", f.Failed)
			}
			notes = append(notes, fn)
		} else if r.FloorSkipped != "" {
			notes = append(notes, "floor skipped: "+r.FloorSkipped)
		}
		if len(notes) > 0 {
			fmt.Fprintf(&b, "%s: %s\n", r.Scenario, strings.Join(notes, "; "))
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return "\n" + b.String()
}

// reportVersion numbers the JSON document's schema. Fields are only ever
// added within a version; a renamed or removed field, or one whose meaning
// changes, takes the next version. Files without a version (written
// before it existed) have version 1's fields.
const reportVersion = 1

// report is the JSON document.
type report struct {
	Version int          `json:"version"`
	Env     env          `json:"environment"`
	Config  configReport `json:"config"`
	Results []result     `json:"results"`
}

type env struct {
	Started    string `json:"started"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GoVersion  string `json:"goVersion"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	GitCommit  string `json:"gitCommit,omitempty"`
	Postgres   string `json:"postgres,omitempty"`
}

type configReport struct {
	Target          string  `json:"target"` // "embedded" or the API URL
	Tenant          string  `json:"tenant"`
	Pool            string  `json:"pool"`
	Clients         int     `json:"clients"`
	DurationSeconds float64 `json:"durationSeconds,omitempty"`
	Requests        int     `json:"requests,omitempty"`
	Nodes           int     `json:"nodes,omitempty"`
	ContentionCalls int     `json:"contentionCalls"`
}

func reportConfig(cfg config, t *target) configReport {
	c := configReport{Target: cfg.apiURL, Tenant: t.tenant, Pool: t.pool, Clients: cfg.clients,
		Requests: cfg.requests, ContentionCalls: cfg.contentionCalls}
	if t.embedded {
		c.Target, c.Nodes = "embedded", cfg.nodes
	}
	if cfg.requests == 0 {
		c.DurationSeconds = cfg.duration.Seconds()
	}
	return c
}

func environment() env {
	return env{
		Started: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH, GitCommit: gitCommit(),
	}
}

// gitCommit is the build's VCS revision, else what git says of the working
// directory (`go run` stamps none), else empty.
func gitCommit() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// readReport reads a -json file of an earlier run.
func readReport(path string) (report, error) {
	var rep report
	b, err := os.ReadFile(path)
	if err != nil {
		return rep, err
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		return rep, fmt.Errorf("%s: %w", path, err)
	}
	if rep.Version > reportVersion {
		return rep, fmt.Errorf("%s: report version %d is newer than this tool's (%d)", path, rep.Version, reportVersion)
	}
	return rep, nil
}

func writeJSON(path string, rep report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
