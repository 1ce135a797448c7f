package api_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cpuMeter reports what a benchmark's calls cost in CPU time rather than
// wall time, which a shared machine makes meaningless: this process's
// (client and server together) and the database cluster's (the postmaster
// and every backend, live or exited), per call.
type cpuMeter struct {
	b          *testing.B
	postmaster int
	proc, db   time.Duration
}

func newCPUMeter(b *testing.B, e *env) *cpuMeter {
	b.Helper()
	var dir string
	if err := e.store.Pool.QueryRow(context.Background(), `SELECT current_setting('data_directory')`).Scan(&dir); err != nil {
		b.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		b.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(raw), "\n", 2)[0]))
	if err != nil {
		b.Fatal(err)
	}
	return &cpuMeter{b: b, postmaster: pid}
}

// start records the counters; stop reports the difference per call.
func (m *cpuMeter) start() { m.proc, m.db = processCPU(), m.clusterCPU() }

func (m *cpuMeter) stop() {
	proc, db := processCPU()-m.proc, m.clusterCPU()-m.db
	n := float64(m.b.N)
	m.b.ReportMetric(float64(proc.Microseconds())/n, "proc-cpu-µs/op")
	m.b.ReportMetric(float64(db.Microseconds())/n, "db-cpu-µs/op")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clusterCPU sums utime and stime of the postmaster and its live children,
// and the children it has reaped (cutime, cstime).
func (m *cpuMeter) clusterCPU() time.Duration {
	const tick = 10 * time.Millisecond // USER_HZ
	entries, _ := os.ReadDir("/proc")
	var ticks int64
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command's closing parenthesis: state ppid ...
		f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
		if len(f) < 15 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if pid != m.postmaster && ppid != m.postmaster {
			continue
		}
		last := 13 // utime, stime
		if pid == m.postmaster {
			last = 15 // and cutime, cstime
		}
		for _, v := range f[11:last] {
			t, _ := strconv.ParseInt(v, 10, 64)
			ticks += t
		}
	}
	return time.Duration(ticks) * tick
}
