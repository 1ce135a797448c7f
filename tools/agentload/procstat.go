package main

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times (100 on
// every Linux architecture Go supports).
const clockTicks = 100

// procTimes are a process's CPU times from /proc/<pid>/stat, in ticks.
type procTimes struct {
	PPID                         int
	UTime, STime, CUTime, CSTime uint64
}

// parseStat reads /proc/<pid>/stat's content. The command name (field 2)
// may hold spaces and parentheses, so the fields are counted after its
// last ')'.
func parseStat(s string) (procTimes, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procTimes{}, errors.New("stat: no command name")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): ppid is field 4, utime..cstime 14..17.
	if len(f) < 15 {
		return procTimes{}, fmt.Errorf("stat: %d fields", len(f)+2)
	}
	var t procTimes
	var err error
	if t.PPID, err = strconv.Atoi(f[1]); err != nil {
		return procTimes{}, fmt.Errorf("stat: ppid: %w", err)
	}
	for j, p := range []*uint64{&t.UTime, &t.STime, &t.CUTime, &t.CSTime} {
		if *p, err = strconv.ParseUint(f[11+j], 10, 64); err != nil {
			return procTimes{}, fmt.Errorf("stat: field %d: %w", 14+j, err)
		}
	}
	return t, nil
}

// parseVmRSS reads VmRSS from /proc/<pid>/status's content, in bytes.
func parseVmRSS(s string) (uint64, error) {
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "VmRSS:") {
			continue
		}
		f := strings.Fields(strings.TrimPrefix(line, "VmRSS:"))
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("status: bad VmRSS line %q", line)
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		return kb << 10, err
	}
	return 0, errors.New("status: no VmRSS")
}

func readStat(pid int) (procTimes, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procTimes{}, err
	}
	return parseStat(string(b))
}

func readRSS(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseVmRSS(string(b))
}

// treeTicks is the CPU time of a PostgreSQL server: the postmaster's own
// and its reaped children's, plus its live children's (backends, the
// checkpointer, the WAL writer...).
func treeTicks(root int) (uint64, error) {
	t, err := readStat(root)
	if err != nil {
		return 0, err
	}
	total := t.UTime + t.STime + t.CUTime + t.CSTime
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == root {
			continue
		}
		c, err := readStat(pid)
		if err != nil || c.PPID != root {
			continue // gone meanwhile, or not ours
		}
		total += c.UTime + c.STime + c.CUTime + c.CSTime
	}
	return total, nil
}

// bucket is one cumulative histogram bucket.
type bucket struct {
	UpperBound float64 // +Inf for the last
	Count      float64 // observations ≤ UpperBound
}

// histogram is a Prometheus histogram read from the text exposition.
type histogram struct {
	Buckets    []bucket // by UpperBound
	Count, Sum float64
}

// parseHistogram finds the unlabelled histogram name in a text exposition.
func parseHistogram(text, name string) (histogram, error) {
	var h histogram
	found := false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		switch {
		case strings.HasPrefix(line, name+"_bucket{"):
			rest := strings.TrimPrefix(line, name+"_bucket{")
			end := strings.IndexByte(rest, '}')
			if end < 0 {
				return h, fmt.Errorf("bad line %q", line)
			}
			le := ""
			for _, l := range strings.Split(rest[:end], ",") {
				if v, ok := strings.CutPrefix(l, `le="`); ok {
					le = strings.TrimSuffix(v, `"`)
				}
			}
			ub, err := strconv.ParseFloat(le, 64) // "+Inf" parses to +Inf
			if err != nil {
				return h, fmt.Errorf("bad le in %q", line)
			}
			n, err := strconv.ParseFloat(strings.TrimSpace(rest[end+1:]), 64)
			if err != nil {
				return h, fmt.Errorf("bad count in %q", line)
			}
			h.Buckets = append(h.Buckets, bucket{ub, n})
			found = true
		case strings.HasPrefix(line, name+"_count "):
			h.Count, _ = strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, name+"_count ")), 64)
		case strings.HasPrefix(line, name+"_sum "):
			h.Sum, _ = strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, name+"_sum ")), 64)
		}
	}
	if !found {
		return h, fmt.Errorf("no histogram %s", name)
	}
	sort.Slice(h.Buckets, func(i, j int) bool { return h.Buckets[i].UpperBound < h.Buckets[j].UpperBound })
	return h, nil
}

// sub is h minus an earlier scrape of the same histogram: the observations
// between the two.
func (h histogram) sub(earlier histogram) histogram {
	out := histogram{Count: h.Count - earlier.Count, Sum: h.Sum - earlier.Sum}
	for i, b := range h.Buckets {
		if i < len(earlier.Buckets) && earlier.Buckets[i].UpperBound == b.UpperBound {
			b.Count -= earlier.Buckets[i].Count
		}
		out.Buckets = append(out.Buckets, b)
	}
	return out
}

// quantile is q (0..1) of the histogram, interpolated linearly within the
// bucket holding it, as PromQL's histogram_quantile: the first bucket's
// lower bound is 0, and a rank in the +Inf bucket answers the highest
// finite bound. NaN when there are no observations.
func (h histogram) quantile(q float64) float64 {
	if len(h.Buckets) == 0 {
		return math.NaN()
	}
	total := h.Buckets[len(h.Buckets)-1].Count
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	lower, prev := 0.0, 0.0
	for i, b := range h.Buckets {
		if b.Count >= rank && b.Count > prev {
			if math.IsInf(b.UpperBound, 1) {
				if i == 0 {
					return math.NaN()
				}
				return h.Buckets[i-1].UpperBound
			}
			return lower + (b.UpperBound-lower)*(rank-prev)/(b.Count-prev)
		}
		lower, prev = b.UpperBound, b.Count
	}
	return lower
}
