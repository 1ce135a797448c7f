package main

import (
	"math"
	"testing"
)

func TestParseStat(t *testing.T) {
	// A command name with a space and a ')' in it.
	s := "1234 (better (x) compute) S 77 1234 1234 0 -1 4194560 5000 0 0 0 1500 250 30 4 20 0 12 0 100 2000000 3000 18446744073709551615\n"
	got, err := parseStat(s)
	if err != nil {
		t.Fatal(err)
	}
	want := procTimes{PPID: 77, UTime: 1500, STime: 250, CUTime: 30, CSTime: 4}
	if got != want {
		t.Fatalf("parseStat = %+v, want %+v", got, want)
	}
	if _, err := parseStat("1234 (short) S 1 2"); err == nil {
		t.Fatal("a short line parsed")
	}
}

func TestParseVmRSS(t *testing.T) {
	got, err := parseVmRSS("Name:\tbetter-compute\nVmPeak:\t  999 kB\nVmRSS:\t   20480 kB\nRssAnon:\t 1 kB\n")
	if err != nil || got != 20480<<10 {
		t.Fatalf("parseVmRSS = %d, %v", got, err)
	}
	if _, err := parseVmRSS("Name:\tx\n"); err == nil {
		t.Fatal("no VmRSS parsed")
	}
}

const exposition = `# HELP bc_agent_heartbeat_seconds Handling time.
# TYPE bc_agent_heartbeat_seconds histogram
bc_agent_heartbeat_seconds_bucket{le="0.001"} 0
bc_agent_heartbeat_seconds_bucket{le="0.002"} 50
bc_agent_heartbeat_seconds_bucket{le="0.004"} 90
bc_agent_heartbeat_seconds_bucket{le="0.008"} 100
bc_agent_heartbeat_seconds_bucket{le="+Inf"} 100
bc_agent_heartbeat_seconds_sum 0.3
bc_agent_heartbeat_seconds_count 100
bc_agent_sessions 42
`

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestHistogramQuantile(t *testing.T) {
	h, err := parseHistogram(exposition, heartbeatMetric)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Buckets) != 5 || h.Count != 100 || !near(h.Sum, 0.3) || !math.IsInf(h.Buckets[4].UpperBound, 1) {
		t.Fatalf("parsed %+v", h)
	}
	for _, c := range []struct{ q, want float64 }{
		{0.5, 0.002},   // the 50th of 100 is the top of (0.001, 0.002]
		{0.25, 0.0015}, // halfway into (0.001, 0.002]
		{0.7, 0.003},   // 20 of 40 into (0.002, 0.004]
		{0.99, 0.0076}, // 9 of 10 into (0.004, 0.008]
	} {
		if got := h.quantile(c.q); !near(got, c.want) {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	// Ranks in the +Inf bucket answer the highest finite bound.
	h.Buckets[4].Count = 200
	if got := h.quantile(0.99); got != 0.008 {
		t.Errorf("quantile in +Inf = %v", got)
	}
	if got := (histogram{}).quantile(0.5); !math.IsNaN(got) {
		t.Errorf("empty quantile = %v", got)
	}
	if _, err := parseHistogram("x 1\n", heartbeatMetric); err == nil {
		t.Error("a missing histogram parsed")
	}
	if got := gaugeValue(exposition, "bc_agent_sessions"); got != 42 {
		t.Errorf("gauge = %v", got)
	}
}

func TestHistogramSub(t *testing.T) {
	later, _ := parseHistogram(exposition, heartbeatMetric)
	earlier := histogram{Count: 50, Sum: 0.1, Buckets: []bucket{{0.001, 0}, {0.002, 50}, {0.004, 50}, {0.008, 50}, {math.Inf(1), 50}}}
	d := later.sub(earlier)
	if d.Count != 50 || !near(d.Sum, 0.2) || d.Buckets[1].Count != 0 || d.Buckets[2].Count != 40 || d.Buckets[4].Count != 50 {
		t.Fatalf("sub = %+v", d)
	}
	// All 50 in (0.002, 0.008]: the median is the 25th, 25 of 40 into (0.002, 0.004].
	if got := d.quantile(0.5); !near(got, 0.00325) {
		t.Errorf("median of the difference = %v", got)
	}
}
