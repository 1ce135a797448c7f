package main

import (
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/better-compute/better-compute/api/capacity"
)

func TestPercentile(t *testing.T) {
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(i + 1)
	}
	for _, tc := range []struct {
		name   string
		values []float64
		p      float64
		want   float64
	}{
		{"none", nil, 50, 0},
		{"one", []float64{7}, 99, 7},
		{"p50 of ten", ten, 50, 5},
		{"p99 of ten", ten, 99, 10},
		{"p0 is the least", ten, 0, 1},
		{"p100 is the most", ten, 100, 10},
		{"p50 of a hundred", hundred, 50, 50},
		{"p99 of a hundred", hundred, 99, 99},
		{"p99.9 of a hundred", hundred, 99.9, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := percentile(tc.values, tc.p); got != tc.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", tc.values, tc.p, got, tc.want)
			}
		})
	}
}

func TestFillCountsAndLatencies(t *testing.T) {
	run := loadRun{ok: 3, errors: map[string]int{"UNAVAILABLE": 1}, elapsed: 2 * time.Second,
		latencies: []time.Duration{4 * time.Millisecond, time.Millisecond, 3 * time.Millisecond, 2 * time.Millisecond}}
	var r result
	r.fill(run)
	if r.Calls != 4 || r.OK != 3 || r.Errors != 1 || r.CallsPerSec != 2 || r.P50Ms != 2 || r.P99Ms != 4 || r.MeanMs != 2.5 {
		t.Errorf("fill = %+v", r)
	}
	r.setFloor(floorResult{TPS: 8, P50Ms: 0.5})
	if r.RatioP50 != 4 || r.RatioThroughput != 0.25 {
		t.Errorf("ratios = %v, %v; want 4, 0.25", r.RatioP50, r.RatioThroughput)
	}
}

const pgbench15 = `pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: /tmp/create.sql
scaling factor: 1
query mode: prepared
number of clients: 8
number of threads: 8
maximum number of tries: 1
duration: 3 s
number of transactions actually processed: 1234
number of failed transactions: 2 (0.162%)
latency average = 19.456 ms
initial connection time = 12.345 ms
tps = 411.178901 (without initial connection time)
`

const pgbench13 = `starting vacuum...end.
transaction type: get.sql
scaling factor: 1
query mode: prepared
number of clients: 4
number of threads: 4
number of transactions per client: 50
number of transactions actually processed: 200/200
latency average = 1.500 ms
tps = 2600.5 (including connections establishing)
tps = 2666.666667 (excluding connections establishing)
`

func TestParseSummary(t *testing.T) {
	for _, tc := range []struct {
		name    string
		out     string
		want    pgbenchSummary
		wantErr string
	}{
		{"PostgreSQL 15", pgbench15, pgbenchSummary{transactions: 1234, failed: 2, latencyAvgMs: 19.456, tps: 411.178901}, ""},
		{"PostgreSQL 13, -t", pgbench13, pgbenchSummary{transactions: 200, latencyAvgMs: 1.5, tps: 2666.666667}, ""},
		{"no count", "pgbench: error: connection to server failed\n", pgbenchSummary{}, "no transaction count"},
		{"no tps", "number of transactions actually processed: 5\n", pgbenchSummary{transactions: 5}, "no tps"},
		{"nothing processed", "number of transactions actually processed: 0\ntps = 0.000000 (without initial connection time)\n",
			pgbenchSummary{}, "no transactions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseSummary(tc.out)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseSummary = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestParseLog(t *testing.T) {
	for _, tc := range []struct {
		name    string
		log     string
		want    []float64
		wantErr bool
	}{
		{"lines", "0 0 1500 0 1767225600 123456\n1 0 250 0 1767225600 123999\n", []float64{1.5, 0.25}, false},
		{"schedule lag column", "3 7 2000 0 1767225600 5 12\n", []float64{2}, false},
		{"failed and skipped are left out", "0 1 failed 0 1767225600 1\n0 2 skipped 0 1767225600 2\n0 3 1000 0 1767225600 3\n", []float64{1}, false},
		{"blank lines", "\n0 0 1000 0 1 2\n\n", []float64{1}, false},
		{"empty", "", nil, false},
		{"short line", "0 0 1000\n", nil, true},
		{"bad latency", "0 0 x1 0 1 2\n", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseLog(strings.NewReader(tc.log))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if !tc.wantErr && !slices.Equal(got, tc.want) {
				t.Fatalf("parseLog = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFormatTable(t *testing.T) {
	placed, refused := 8, 192
	results := []result{
		{Scenario: "create", Clients: 8, Calls: 300, OK: 299, Errors: 1, CallsPerSec: 100, P50Ms: 70.123, P99Ms: 250,
			ErrorCodes: map[string]int{"UNAVAILABLE": 1},
			Floor:      &floorResult{Shape: "x", Clients: 8, Transactions: 3000, TPS: 1000, P50Ms: 7}, RatioP50: 10.0176, RatioThroughput: 0.1},
		{Scenario: "get", Clients: 8, Calls: 900, OK: 900, CallsPerSec: 300, P50Ms: 2, P99Ms: 5, FloorSkipped: "-no-floor"},
		{Scenario: "gin", Clients: 8, Calls: 1800, OK: 1800, CallsPerSec: 600, P50Ms: 1, P99Ms: 2, FloorSkipped: noFloorReason("gin")},
		{Scenario: "list", Skipped: "not served (UNSUPPORTED)"},
		{Scenario: "contention", Clients: 200, Calls: 200, OK: 200, CallsPerSec: 50, P50Ms: 1000, P99Ms: 2000,
			Placed: &placed, Refused: &refused, Note: "placed 8, refused 192 (noCapacity)", FloorSkipped: "no database URL (-db)"},
	}
	relate(results)
	evaluateGoals(results)
	got := formatTable(results)
	want := `scenario   | clients |   calls |   ok | errors | calls/s |  p50 ms |  p99 ms | floor tps | floor p50 ms | ratio p50 | ratio tps | ratio gin tps |   goal
-----------|---------|---------|------|--------|---------|---------|---------|-----------|--------------|-----------|-----------|---------------|-------
create     |       8 |     300 |  299 |      1 |   100.0 |   70.12 |  250.00 |    1000.0 |         7.00 |    10.02x |      0.10 |             - | MISSED
get        |       8 |     900 |  900 |      0 |   300.0 |    2.00 |    5.00 |         - |            - |         - |         - |          0.50 |    met
gin        |       8 |    1800 | 1800 |      0 |   600.0 |    1.00 |    2.00 |         - |            - |         - |         - |             - |      -
list       |       - | skipped |    - |      - |       - |       - |       - |         - |            - |         - |         - |             - |      ?
contention |     200 |     200 |  200 |      0 |    50.0 | 1000.00 | 2000.00 |         - |            - |         - |         - |             - | MISSED
`
	if got != want {
		t.Errorf("formatTable =\n%s\nwant\n%s", got, want)
	}
	notes := formatNotes(results)
	for _, s := range []string{"errors: UNAVAILABLE×1; floor: x, 8 clients, 3000 calls",
		"create: goal ≥ 0.60 of the floor's tps, p99 ≤ 50 ms: missed (ratio tps 0.10, p99 250.00 ms, 1 failed calls)",
		"get: goal ≥ 0.40 of the bare gin handler's calls/s: met (ratio gin tps 0.50); floor skipped: -no-floor",
		"gin: floor skipped: none: gin is itself get's yardstick",
		"list: skipped: not served (UNSUPPORTED); goal p50 ≤ 15 ms: not evaluated: skipped",
		"contention: placed 8, refused 192 (noCapacity); goal exactly 8 placed, p99 ≤ 200 ms: missed (8 placed, p99 2000.00 ms); floor skipped: no database URL (-db)"} {
		if !strings.Contains(notes, s) {
			t.Errorf("notes lack %q:\n%s", s, notes)
		}
	}
}

func TestEvaluateGoals(t *testing.T) {
	placed := func(n int) *int { return &n }
	floor := &floorResult{TPS: 100}
	for _, tc := range []struct {
		name string
		r    result
		want string // met, missed, or unevaluated
		note string // in GoalNote
	}{
		{"create met", result{Scenario: "create", Floor: floor, RatioThroughput: 0.6, P99Ms: 50}, "met", "ratio tps 0.60, p99 50.00 ms"},
		{"create too slow", result{Scenario: "create", Floor: floor, RatioThroughput: 0.59, P99Ms: 10}, "missed", "ratio tps 0.59"},
		{"create p99 too long", result{Scenario: "create", Floor: floor, RatioThroughput: 0.9, P99Ms: 50.5}, "missed", "p99 50.50 ms"},
		{"create without a floor", result{Scenario: "create", P99Ms: 10, FloorSkipped: "-no-floor"}, "unevaluated", "no floor: -no-floor"},
		{"create with failed calls", result{Scenario: "create", Floor: floor, RatioThroughput: 0.9, P99Ms: 5, Errors: 2}, "missed", "2 failed calls"},
		{"get met", result{Scenario: "get", RatioGin: 0.4}, "met", "ratio gin tps 0.40"},
		{"get missed", result{Scenario: "get", RatioGin: 0.3}, "missed", "ratio gin tps 0.30"},
		{"get without gin", result{Scenario: "get"}, "unevaluated", "no gin scenario"},
		{"list met", result{Scenario: "list", P50Ms: 15}, "met", "p50 15.00 ms"},
		{"list missed", result{Scenario: "list", P50Ms: 15.01}, "missed", "p50 15.01 ms"},
		{"contention met", result{Scenario: "contention", Placed: placed(8), P99Ms: 200}, "met", "8 placed"},
		{"contention overbooked", result{Scenario: "contention", Placed: placed(9), P99Ms: 10}, "missed", "9 placed"},
		{"contention slow", result{Scenario: "contention", Placed: placed(8), P99Ms: 201}, "missed", "p99 201.00 ms"},
		{"capacity met", result{Scenario: "capacity", P50Ms: 9.9}, "met", "p50 9.90 ms"},
		{"capacity missed", result{Scenario: "capacity", P50Ms: 38.6}, "missed", "p50 38.60 ms"},
		{"capacity skipped", result{Scenario: "capacity", Skipped: "needs the embedded stack"}, "unevaluated", "skipped"},
		{"agents met", result{Scenario: "agents", Agents: &agentsResult{Agents: 10000, ConnectedAtEnd: 10000, APICPUAvg: 99, APIRSSMaxMiB: 1000}}, "met", "10000 of 10000 connected"},
		{"agents too few", result{Scenario: "agents", Agents: &agentsResult{Agents: 5000, ConnectedAtEnd: 5000, APICPUAvg: 20, APIRSSMaxMiB: 794}}, "missed", "5000 of 5000"},
		{"agents a core", result{Scenario: "agents", Agents: &agentsResult{Agents: 10000, ConnectedAtEnd: 10000, APICPUAvg: 100, APIRSSMaxMiB: 500}}, "missed", "100.0% of a core"},
		{"agents a GiB", result{Scenario: "agents", Agents: &agentsResult{Agents: 10000, ConnectedAtEnd: 10000, APICPUAvg: 10, APIRSSMaxMiB: 1024}}, "missed", "1024 MiB"},
		{"agents lost some", result{Scenario: "agents", Agents: &agentsResult{Agents: 10000, ConnectedAtEnd: 9999, APICPUAvg: 10, APIRSSMaxMiB: 500}}, "missed", "9999 of 10000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := []result{tc.r}
			evaluateGoals(rs)
			r := rs[0]
			got := "unevaluated"
			if r.GoalMet != nil {
				got = map[bool]string{true: "met", false: "missed"}[*r.GoalMet]
			}
			if got != tc.want || !strings.Contains(r.GoalNote, tc.note) || r.Goal == "" {
				t.Errorf("goal %q: %s (%q), want %s (%q)", r.Goal, got, r.GoalNote, tc.want, tc.note)
			}
		})
	}
	for _, name := range []string{"gin", "activate"} {
		rs := []result{{Scenario: name, P50Ms: 1}}
		evaluateGoals(rs)
		if rs[0].Goal != "" || rs[0].GoalMet != nil || goalCell(rs[0]) != "-" {
			t.Errorf("%s has a goal: %+v", name, rs[0])
		}
	}
}

func TestRelate(t *testing.T) {
	rs := []result{{Scenario: "get", CallsPerSec: 100}, {Scenario: "gin", CallsPerSec: 400}}
	relate(rs)
	if rs[0].RatioGin != 0.25 || rs[1].RatioGin != 0 {
		t.Errorf("ratios = %v, %v; want 0.25, 0", rs[0].RatioGin, rs[1].RatioGin)
	}
	rs = []result{{Scenario: "get", CallsPerSec: 100}, {Scenario: "gin", Skipped: "no"}}
	if relate(rs); rs[0].RatioGin != 0 {
		t.Errorf("ratio to a skipped gin = %v", rs[0].RatioGin)
	}
}

func TestFormatCompare(t *testing.T) {
	old := []result{
		{Scenario: "create", CallsPerSec: 50, P50Ms: 200, P99Ms: 400},
		{Scenario: "get", CallsPerSec: 4000, P50Ms: 4, P99Ms: 10},
		{Scenario: "list", Skipped: "not served"},
		{Scenario: "contention", CallsPerSec: 200, P50Ms: 500, P99Ms: 900},
	}
	cur := []result{
		{Scenario: "create", CallsPerSec: 75, P50Ms: 100, P99Ms: 400},
		{Scenario: "get", CallsPerSec: 3000, P50Ms: 5, P99Ms: 12.5},
		{Scenario: "list", CallsPerSec: 100, P50Ms: 10, P99Ms: 20},
		{Scenario: "capacity", Skipped: "needs the embedded stack"},
	}
	want := `scenario   | calls/s |    old | change | p50 ms |    old | change | p99 ms |    old | change
-----------|---------|--------|--------|--------|--------|--------|--------|--------|-------
create     |    75.0 |   50.0 | +50.0% | 100.00 | 200.00 | -50.0% | 400.00 | 400.00 |  +0.0%
get        |  3000.0 | 4000.0 | -25.0% |   5.00 |   4.00 | +25.0% |  12.50 |  10.00 | +25.0%
list       |   100.0 |      - |        |  10.00 |      - |        |  20.00 |      - |
capacity   | skipped |        |        |        |        |        |        |        |
contention |       - |  200.0 |        |      - | 500.00 |        |      - | 900.00 |
`
	if got := formatCompare(old, cur); got != want {
		t.Errorf("formatCompare =\n%s\nwant\n%s", got, want)
	}
}

func TestReportRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "new.json")
	rep := report{Version: reportVersion, Results: []result{{Scenario: "get", CallsPerSec: 10, P50Ms: 1, P99Ms: 2}}}
	if err := writeJSON(path, rep); err != nil {
		t.Fatal(err)
	}
	got, err := readReport(path)
	if err != nil || got.Version != reportVersion || len(got.Results) != 1 || got.Results[0].P99Ms != 2 {
		t.Fatalf("readReport = %+v, %v", got, err)
	}
	// A file of before the version field reads as version 1's fields.
	unversioned := filepath.Join(dir, "old.json")
	if err := os.WriteFile(unversioned, []byte(`{"results":[{"scenario":"create","callsPerSec":69.8,"p50Ms":216,"p99Ms":352}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := readReport(unversioned); err != nil || got.Results[0].CallsPerSec != 69.8 {
		t.Errorf("unversioned = %+v, %v", got, err)
	}
	newer := filepath.Join(dir, "newer.json")
	if err := os.WriteFile(newer, []byte(`{"version": 99, "results": []}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readReport(newer); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Errorf("a newer version: %v", err)
	}
}

func TestFloorPlanFor(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  config
		scen string
		want floorPlan
	}{
		{"duration rounds up", config{clients: 8, duration: 2500 * time.Millisecond}, "get",
			floorPlan{Clients: 8, Seconds: 3}},
		{"requests split per client", config{clients: 8, requests: 100}, "create",
			floorPlan{Clients: 8, PerClient: 13}},
		{"contention is capped", config{clients: 8, duration: time.Second, contentionCalls: 200}, "contention",
			floorPlan{Clients: 100, PerClient: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := floorPlanFor(tc.scen, tc.cfg)
			if got.Clients != tc.want.Clients || got.Seconds != tc.want.Seconds || got.PerClient != tc.want.PerClient {
				t.Errorf("plan = %+v, want %+v", got, tc.want)
			}
			if got.Script == "" || got.Shape == "" {
				t.Errorf("%s has no script or shape", tc.scen)
			}
		})
	}
}

func TestConnArgs(t *testing.T) {
	u, _ := url.Parse("postgres://postgres@127.0.0.1:55432/bench_floor?sslmode=disable")
	got := strings.Join(connArgs(u), " ")
	if want := "-h 127.0.0.1 -p 55432 -U postgres bench_floor"; got != want {
		t.Errorf("connArgs = %q, want %q", got, want)
	}
}

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"-clients", "4", "-scenarios", "get, list"}, io.Discard)
	if err != nil || cfg.clients != 4 || !slices.Equal(cfg.scenarios, []string{"get", "list"}) || cfg.nodes != 64 {
		t.Errorf("parseFlags = %+v, %v", cfg, err)
	}
	cfg, err = parseFlags(nil, io.Discard)
	if err != nil || !slices.Equal(cfg.scenarios, defaultScenarios) || slices.Contains(cfg.scenarios, "agents") ||
		cfg.agents != 10000 || cfg.agentsDuration != time.Minute || cfg.capacityNodes != 2000 || cfg.activateNodes != 64 ||
		cfg.activatePoll != 10*time.Millisecond {
		t.Errorf("defaults = %+v, %v", cfg, err)
	}
	cfg, err = parseFlags([]string{"-scenarios", "agents,gin,capacity,activate", "-agents", "500", "-agents-duration", "30s",
		"-compare", "old.json", "-cpuprofile", "cpu.pprof", "-memprofile", "mem.pprof", "-activate-poll", "5ms"}, io.Discard)
	if err != nil || !slices.Equal(cfg.scenarios, []string{"agents", "gin", "capacity", "activate"}) || cfg.agents != 500 ||
		cfg.agentsDuration != 30*time.Second || cfg.compareFile != "old.json" || cfg.cpuProfile != "cpu.pprof" ||
		cfg.memProfile != "mem.pprof" || cfg.activatePoll != 5*time.Millisecond {
		t.Errorf("parseFlags = %+v, %v", cfg, err)
	}
	if got := strings.Join(agentloadArgs(cfg, "/tmp/a.json"), " "); got != "run ./tools/agentload -agents 500 -duration 30s -json /tmp/a.json" {
		t.Errorf("agentload args = %q", got)
	}
	for _, args := range [][]string{
		{"-scenarios", "nope"},
		{"-clients", "0"},
		{"-api", "http://x"},
		{"-duration", "10ms"},
		{"-agents", "0"},
		{"-agents-duration", "10ms"},
		{"-capacity-nodes", "0"},
		{"-activate-nodes", "0"},
		{"-activate-poll", "0s"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

func TestProfiler(t *testing.T) {
	dir := t.TempDir()
	cpu, mem := filepath.Join(dir, "cpu.pprof"), filepath.Join(dir, "mem.pprof")
	p := newProfiler(true, true)
	var keep [][]byte
	for _, scenario := range []string{"get", "list"} {
		p.begin(scenario)
		for i := range 2000 {
			keep = append(keep, make([]byte, 1024+i))
		}
		p.end()
	}
	if len(keep) == 0 {
		t.Fatal("nothing allocated")
	}
	if err := p.write(cpu, mem); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{cpu, mem} {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		prof, err := profile.Parse(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, s := range prof.Sample {
			if l := s.Label["scenario"]; len(l) != 1 || l[0] != "get" && l[0] != "list" {
				t.Fatalf("%s: a sample labelled %v", file, s.Label)
			}
		}
		if file == mem && len(prof.Sample) == 0 {
			t.Errorf("%s: no allocation samples", file)
		}
	}
	// Not asked for: nothing is written, nothing fails.
	var none profiler
	none.begin("get")
	none.end()
	if err := none.write("", ""); err != nil {
		t.Error(err)
	}
	if err := newProfiler(true, false).write(filepath.Join(dir, "x"), ""); err == nil {
		t.Error("a CPU profile of no run was written")
	}
}

func TestCheckCapacity(t *testing.T) {
	sum := func(allocatable, allocated, reserved int64) capacity.CapacitySummary {
		return capacity.CapacitySummary{Pools: []capacity.PoolCapacity{
			{PoolID: "pool_other", Resources: []capacity.Resource{{Resource: "gpu", Allocatable: 8}}},
			{PoolID: "pool_bulk", Resources: []capacity.Resource{{Resource: "node", Allocatable: 10},
				{Resource: "gpu", Allocatable: allocatable, Allocated: allocated, Reserved: reserved}}},
		}}
	}
	if v := checkCapacity(sum(80, 20, 20), "pool_bulk", 10); v != "" {
		t.Errorf("exact counts: %s", v)
	}
	for _, s := range []capacity.CapacitySummary{sum(80, 20, 19), sum(72, 20, 20), {}} {
		if v := checkCapacity(s, "pool_bulk", 10); v == "" {
			t.Errorf("%+v passed", s)
		}
	}
}

func TestFillAgents(t *testing.T) {
	var r result
	fillAgents(&r, agentsResult{Agents: 10000, ConnectedAtEnd: 9990, HoldSeconds: 60, HoldHeartbeats: 60000,
		HeartbeatsPerSec: 1000, HeartbeatP50ms: 1.5, HeartbeatP99ms: 9, APICPUAvg: 42.5, APICPUMax: 60, APIRSSMaxMiB: 700, SessionErrors: 3})
	if r.Calls != 60000 || r.OK != 60000 || r.CallsPerSec != 1000 || r.P50Ms != 1.5 || r.P99Ms != 9 || r.Agents == nil {
		t.Errorf("fillAgents = %+v", r)
	}
	for _, s := range []string{"10000 agents, 9990 connected", "42.5% of a core (max 60.0%)", "RSS max 700 MiB", "3 session errors"} {
		if !strings.Contains(r.Note, s) {
			t.Errorf("note %q lacks %q", r.Note, s)
		}
	}
}
