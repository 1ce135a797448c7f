package commands

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/internal/testutil"
)

func newExecutor(t *testing.T) *Executor {
	t.Helper()
	return &Executor{StateDir: filepath.Join(t.TempDir(), "state"), CDIDir: filepath.Join(t.TempDir(), "cdi"), Simulate: true}
}

func execCmd(seq int64, argv ...string) Command {
	raw, _ := json.Marshal(map[string]any{"argv": argv})
	return Command{Seq: seq, ID: "cmd_x", Kind: KindExec, Args: raw}
}

func TestAtMostOnce(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "runs")
	run := func(seq int64) Command {
		return execCmd(seq, "sh", "-c", `echo x >> "$1"`, "sh", marker)
	}
	runs := func() int {
		raw, _ := os.ReadFile(marker)
		return strings.Count(string(raw), "x")
	}
	state := filepath.Join(dir, "state")
	first := &Executor{StateDir: state}
	if last, err := first.LastExecuted(); err != nil || last != 0 {
		t.Fatalf("fresh LastExecuted = %d, %v", last, err)
	}
	if r := first.Run(context.Background(), run(3)); r.State != Succeeded || r.Seq != 3 {
		t.Fatalf("first run = %+v", r)
	}
	// A second Executor on the same state directory (a restarted agent)
	// skips seq 3 and below, and runs later ones once.
	second := &Executor{StateDir: state}
	if last, err := second.LastExecuted(); err != nil || last != 3 {
		t.Fatalf("LastExecuted = %d, %v", last, err)
	}
	for _, tc := range []struct {
		seq   int64
		state string
		err   string
	}{
		{3, Skipped, ErrAlreadyExecuted},
		{2, Skipped, ErrAlreadyExecuted},
		{4, Succeeded, ""},
		{4, Skipped, ErrAlreadyExecuted},
	} {
		if r := second.Run(context.Background(), run(tc.seq)); r.State != tc.state || r.Error != tc.err || r.Seq != tc.seq {
			t.Fatalf("seq %d = %+v, want %s %q", tc.seq, r, tc.state, tc.err)
		}
	}
	if n := runs(); n != 2 {
		t.Fatalf("ran %d times, want 2", n)
	}
	if r := first.Run(context.Background(), run(4)); r.State != Skipped {
		t.Fatalf("the first executor re-ran seq 4: %+v", r)
	}
	if entries, _ := os.ReadDir(state); len(entries) != 1 {
		t.Fatalf("state directory holds %d entries, want the one file", len(entries))
	}
}

func TestExec(t *testing.T) {
	big := strings.Repeat("y", MaxOutput+100)
	for _, tc := range []struct {
		name      string
		args      string
		state     string
		exit      int // -2: no exit code
		stdout    string
		stderr    string
		err       string
		truncated bool
		maxTime   time.Duration
	}{
		{name: "success", args: `{"argv":["sh","-c","echo out; echo err >&2"]}`, state: Succeeded, stdout: "out\n", stderr: "err\n"},
		{name: "no shell", args: `{"argv":["echo","$HOME","a;b"]}`, state: Succeeded, stdout: "$HOME a;b\n"},
		{name: "env", args: `{"argv":["sh","-c","printf %s \"$BC_TEST\""],"env":{"BC_TEST":"v1"}}`, state: Succeeded, stdout: "v1"},
		{name: "non-zero exit", args: `{"argv":["sh","-c","echo bad >&2; exit 3"]}`, state: Failed, exit: 3, stderr: "bad\n"},
		{name: "truncated", args: `{"argv":["sh","-c","head -c 65636 /dev/zero | tr '\\0' y"]}`, state: Succeeded,
			stdout: big[:MaxOutput], truncated: true},
		{name: "timeout", args: `{"argv":["sh","-c","sleep 30 & sleep 30"],"timeoutSeconds":1}`, state: Failed, exit: -1,
			err: "timed out after 1s", maxTime: 10 * time.Second},
		{name: "not found", args: `{"argv":["/nonexistent/bc-test"]}`, state: Failed, exit: -2, err: "no such file"},
		{name: "bad args", args: `{"argv":["true"],"shell":true}`, state: Failed, exit: -2, err: "bad args"},
		{name: "empty argv", args: `{"argv":[]}`, state: Failed, exit: -2, err: "argv is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newExecutor(t)
			start := time.Now()
			r := e.Run(context.Background(), Command{Seq: 1, Kind: KindExec, Args: json.RawMessage(tc.args)})
			if r.State != tc.state || r.Stdout != tc.stdout || r.Stderr != tc.stderr || r.Truncated != tc.truncated ||
				!strings.Contains(r.Error, tc.err) || (tc.err == "" && r.Error != "") {
				t.Fatalf("result = %+v (stdout %d bytes)", r, len(r.Stdout))
			}
			switch {
			case tc.exit == -2 && r.ExitCode != nil:
				t.Fatalf("exit code %d, want none", *r.ExitCode)
			case tc.exit != -2 && (r.ExitCode == nil || *r.ExitCode != tc.exit):
				t.Fatalf("exit code %v, want %d", r.ExitCode, tc.exit)
			}
			if tc.maxTime > 0 && time.Since(start) > tc.maxTime {
				t.Fatalf("took %s", time.Since(start))
			}
		})
	}
}

func TestExecCancelKillsGroup(t *testing.T) {
	e := newExecutor(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The shell starts a child and writes its pid, so the test knows the
	// group is up and can check that the child died with it.
	childFile := filepath.Join(t.TempDir(), "child")
	cmd := execCmd(1, "sh", "-c", `sleep 60 & echo $! > "$1.tmp" && mv "$1.tmp" "$1"; wait`, "sh", childFile)
	done := make(chan Result)
	go func() { done <- e.Run(ctx, cmd) }()
	var child int
	testutil.Eventually(t, 10*time.Second, "the command to start its child", func() bool {
		b, err := os.ReadFile(childFile)
		if err != nil {
			return false
		}
		child, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	cancel()
	select {
	case r := <-done:
		if r.State != Failed || r.Error != ErrCancelled {
			t.Fatalf("cancelled = %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancellation did not stop the command")
	}
	testutil.Eventually(t, 10*time.Second, "the command's child to die with its group", func() bool {
		return !running(child)
	})
}

// running says whether pid is a live process: one that exists and is not a
// zombie waiting for a parent (in a container nothing may ever reap it).
func running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

func TestGates(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	for _, tc := range []struct {
		name  string
		cmd   Command
		gen   int64
		state string
		err   string
	}{
		{"expired", Command{NotAfter: now.UnixMilli()}, 0, Skipped, ErrExpired},
		{"expired long ago", Command{NotAfter: now.Add(-time.Hour).UnixMilli()}, 0, Skipped, ErrExpired},
		{"in window", Command{NotBefore: now.Add(-time.Hour).UnixMilli(), NotAfter: now.Add(time.Hour).UnixMilli()}, 0, Succeeded, ""},
		{"generation ahead", Command{MinGeneration: 5}, 4, Skipped, ErrGeneration},
		{"generation reached", Command{MinGeneration: 5}, 5, Succeeded, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newExecutor(t)
			e.Now = func() time.Time { return now }
			e.ObservedGeneration = func() int64 { return tc.gen }
			c := tc.cmd
			c.Seq, c.Kind = 7, KindReboot
			r := e.Run(context.Background(), c)
			if r.State != tc.state || r.Error != tc.err {
				t.Fatalf("result = %+v, want %s %q", r, tc.state, tc.err)
			}
			// A skipped command is not recorded: it may come again.
			last, _ := e.LastExecuted()
			if want := map[bool]int64{true: 7, false: 0}[tc.state == Succeeded]; last != want {
				t.Fatalf("last executed = %d, want %d", last, want)
			}
		})
	}
}

func TestNotBeforeWaits(t *testing.T) {
	e := newExecutor(t)
	start := time.Now()
	r := e.Run(context.Background(), Command{Seq: 1, Kind: KindReboot, NotBefore: start.Add(300 * time.Millisecond).UnixMilli()})
	if r.State != Succeeded || time.Since(start) < 250*time.Millisecond {
		t.Fatalf("result %+v after %s", r, time.Since(start))
	}
	// ctx ends first: skipped, not recorded.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	r = e.Run(ctx, Command{Seq: 2, Kind: KindReboot, NotBefore: time.Now().Add(time.Hour).UnixMilli()})
	if last, _ := e.LastExecuted(); r.State != Skipped || r.Error != ErrCancelled || last != 1 {
		t.Fatalf("cancelled wait = %+v, last %d", r, last)
	}
}

func TestCDI(t *testing.T) {
	e := newExecutor(t)
	const rsv = "rsv_01hx0000000000000000000000"
	path := CDISpecPath(e.CDIDir, rsv)
	for _, tc := range []struct {
		name    string
		args    string
		kind    string
		devices []string
	}{
		{"default kind", `{"reservationId":"` + rsv + `","devices":[3,"5"]}`, DefaultCDIKind, []string{"/dev/nvidia3", "/dev/nvidia5"}},
		{"a kind, rewritten", `{"reservationId":"` + rsv + `","devices":[0],"kind":"example.com/gpu"}`, "example.com/gpu", []string{"/dev/nvidia0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seq, _ := e.LastExecuted()
			if r := e.Run(context.Background(), Command{Seq: seq + 1, Kind: KindCDIExpose, Args: json.RawMessage(tc.args)}); r.State != Succeeded {
				t.Fatalf("expose = %+v", r)
			}
			info, err := os.Stat(path)
			if err != nil || info.Mode().Perm() != 0o644 {
				t.Fatalf("spec file: %v, %v", info, err)
			}
			raw, _ := os.ReadFile(path)
			var spec CDISpec
			dec := json.NewDecoder(strings.NewReader(string(raw)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&spec); err != nil {
				t.Fatalf("spec %s: %v", raw, err)
			}
			if spec.Version != "0.6.0" || spec.Kind != tc.kind || len(spec.Devices) != len(tc.devices) {
				t.Fatalf("spec = %+v", spec)
			}
			for i, d := range spec.Devices {
				if want := rsv + "-" + string(rune('0'+i)); d.Name != want || len(d.ContainerEdits.DeviceNodes) != 1 ||
					d.ContainerEdits.DeviceNodes[0].Path != tc.devices[i] {
					t.Fatalf("device %d = %+v, want %s at %s", i, d, want, tc.devices[i])
				}
			}
			common := spec.ContainerEdits.DeviceNodes
			if len(common) != 2 || common[0].Path != "/dev/nvidiactl" || common[1].Path != "/dev/nvidia-uvm" {
				t.Fatalf("common edits = %+v", common)
			}
			// The generic shape: every key the CDI format names, nothing else.
			var generic map[string]any
			if json.Unmarshal(raw, &generic) != nil || len(generic) != 4 || generic["cdiVersion"] != "0.6.0" {
				t.Fatalf("spec = %s", raw)
			}
			if entries, _ := os.ReadDir(e.CDIDir); len(entries) != 1 {
				t.Fatalf("the CDI directory holds %d entries", len(entries))
			}
		})
	}
	withdraw := func(seq int64) Result {
		return e.Run(context.Background(), Command{Seq: seq, Kind: KindCDIWithdraw, Args: json.RawMessage(`{"reservationId":"` + rsv + `"}`)})
	}
	if r := withdraw(10); r.State != Succeeded {
		t.Fatalf("withdraw = %+v", r)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("spec still there: %v", err)
	}
	if r := withdraw(11); r.State != Succeeded {
		t.Fatalf("withdraw of none = %+v", r)
	}
	for i, args := range []string{
		`{"reservationId":"../etc/passwd","devices":[0]}`,
		`{"reservationId":"` + rsv + `","devices":[]}`,
		`{"reservationId":"` + rsv + `","devices":["GPU-abc"]}`,
		`{"reservationId":"` + rsv + `","devices":[0],"kind":"gpu"}`,
	} {
		if r := e.Run(context.Background(), Command{Seq: int64(20 + i), Kind: KindCDIExpose, Args: json.RawMessage(args)}); r.State != Failed {
			t.Fatalf("expose %s = %+v", args, r)
		}
	}
}

func TestOtherKinds(t *testing.T) {
	e := newExecutor(t)
	refreshed := 0
	if r := e.Run(context.Background(), Command{Seq: 1, Kind: KindInventoryRefresh}); r.State != Failed {
		t.Fatalf("refresh without a refresher = %+v", r)
	}
	e.RefreshInventory = func(context.Context) error { refreshed++; return nil }
	if r := e.Run(context.Background(), Command{Seq: 2, Kind: KindInventoryRefresh, Args: json.RawMessage(`{}`)}); r.State != Succeeded || refreshed != 1 {
		t.Fatalf("refresh = %+v, %d", r, refreshed)
	}
	e.RefreshInventory = func(context.Context) error { return errors.New("nvml gone") }
	if r := e.Run(context.Background(), Command{Seq: 3, Kind: KindInventoryRefresh}); r.State != Failed || r.Error != "nvml gone" {
		t.Fatalf("failing refresh = %+v", r)
	}
	if r := e.Run(context.Background(), Command{Seq: 4, Kind: KindReboot}); r.State != Succeeded {
		t.Fatalf("simulated reboot = %+v", r)
	}
	if r := e.Run(context.Background(), Command{Seq: 5, Kind: "format"}); r.State != Failed {
		t.Fatalf("unknown kind = %+v", r)
	}
	if r := e.Run(context.Background(), Command{Seq: 0, Kind: KindReboot}); r.State != Failed {
		t.Fatalf("seq 0 = %+v", r)
	}
}
