package main

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"

	"github.com/google/pprof/profile"
)

// profiler profiles this process (which hosts the embedded API and
// worker) over the scenarios' measured runs only: a CPU profile per run,
// and for memory the heap profile's growth over each run, all merged into
// one file each at the end. Every sample is labelled with its scenario, so
// `go tool pprof -tagfocus scenario=get` picks one out. google/pprof's
// profile package does the parsing and merging: the Go runtime writes
// profiles but cannot pause one or subtract two.
//
// The zero profiler profiles nothing.
type profiler struct {
	cpuOn, memOn bool
	scenario     string
	cpuBuf       bytes.Buffer
	heapBefore   *profile.Profile
	cpu, mem     []*profile.Profile
	err          error // the first failure; reported by write
}

func newProfiler(cpu, mem bool) *profiler { return &profiler{cpuOn: cpu, memOn: mem} }

// begin starts profiling scenario's measured run.
func (p *profiler) begin(scenario string) {
	if p.err != nil || !p.cpuOn && !p.memOn {
		return
	}
	p.scenario = scenario
	if p.memOn {
		if p.heapBefore, p.err = heapProfile(); p.err != nil {
			return
		}
	}
	if p.cpuOn {
		p.cpuBuf.Reset()
		if err := pprof.StartCPUProfile(&p.cpuBuf); err != nil {
			p.err = fmt.Errorf("cpu profile: %w", err)
		}
	}
}

// end stops profiling the run begin started.
func (p *profiler) end() {
	if p.err != nil || p.scenario == "" {
		return
	}
	scenario := p.scenario
	p.scenario = ""
	if p.cpuOn {
		pprof.StopCPUProfile()
		prof, err := profile.Parse(&p.cpuBuf)
		if err != nil {
			p.err = fmt.Errorf("cpu profile of %s: %w", scenario, err)
			return
		}
		p.cpu = append(p.cpu, labelled(prof, scenario))
	}
	if p.memOn {
		after, err := heapProfile()
		if err != nil {
			p.err = err
			return
		}
		// The growth over the run: after minus before, as pprof -base does.
		p.heapBefore.Scale(-1)
		delta, err := profile.Merge([]*profile.Profile{after, p.heapBefore})
		if err != nil {
			p.err = fmt.Errorf("heap profile of %s: %w", scenario, err)
			return
		}
		p.mem = append(p.mem, labelled(delta, scenario))
	}
}

// heapProfile is the heap profile as of a garbage collection run now: the
// runtime counts allocations as of the last completed cycle.
func heapProfile() (*profile.Profile, error) {
	runtime.GC()
	var b bytes.Buffer
	if err := pprof.Lookup("heap").WriteTo(&b, 0); err != nil {
		return nil, fmt.Errorf("heap profile: %w", err)
	}
	return profile.Parse(&b)
}

func labelled(p *profile.Profile, scenario string) *profile.Profile {
	for _, s := range p.Sample {
		if s.Label == nil {
			s.Label = map[string][]string{}
		}
		s.Label["scenario"] = []string{scenario}
	}
	return p
}

// write merges what was profiled into cpuFile and memFile (either may be
// empty: not asked for).
func (p *profiler) write(cpuFile, memFile string) error {
	if p.err != nil {
		return p.err
	}
	for _, out := range []struct {
		file  string
		profs []*profile.Profile
	}{{cpuFile, p.cpu}, {memFile, p.mem}} {
		if out.file == "" {
			continue
		}
		if len(out.profs) == 0 {
			return fmt.Errorf("%s: no scenario run was profiled", out.file)
		}
		merged, err := profile.Merge(out.profs)
		if err != nil {
			return fmt.Errorf("%s: %w", out.file, err)
		}
		f, err := os.Create(out.file)
		if err != nil {
			return err
		}
		err = merged.Write(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", out.file, err)
		}
	}
	return nil
}
