package main

import (
	"io"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
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
		{Scenario: "list", Skipped: "not served (UNSUPPORTED)"},
		{Scenario: "contention", Clients: 200, Calls: 200, OK: 200, CallsPerSec: 50, P50Ms: 1000, P99Ms: 2000,
			Placed: &placed, Refused: &refused, Note: "placed 8, refused 192 (noCapacity)", FloorSkipped: "no database URL (-db)"},
	}
	got := formatTable(results)
	want := `scenario   | clients |   calls |  ok | errors | calls/s |  p50 ms |  p99 ms | floor tps | floor p50 ms | ratio p50 | ratio tps
-----------|---------|---------|-----|--------|---------|---------|---------|-----------|--------------|-----------|----------
create     |       8 |     300 | 299 |      1 |   100.0 |   70.12 |  250.00 |    1000.0 |         7.00 |    10.02x |      0.10
list       |       - | skipped |   - |      - |       - |       - |       - |         - |            - |         - |         -
contention |     200 |     200 | 200 |      0 |    50.0 | 1000.00 | 2000.00 |         - |            - |         - |         -
`
	if got != want {
		t.Errorf("formatTable =\n%s\nwant\n%s", got, want)
	}
	notes := formatNotes(results)
	for _, s := range []string{"create: errors: UNAVAILABLE×1; floor: x, 8 clients, 3000 calls",
		"list: skipped: not served (UNSUPPORTED)",
		"contention: placed 8, refused 192 (noCapacity); floor skipped: no database URL (-db)"} {
		if !strings.Contains(notes, s) {
			t.Errorf("notes lack %q:\n%s", s, notes)
		}
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
	for _, args := range [][]string{
		{"-scenarios", "nope"},
		{"-clients", "0"},
		{"-api", "http://x"},
		{"-duration", "10ms"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}
