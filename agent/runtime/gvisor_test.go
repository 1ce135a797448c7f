package runtime_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/runtime"
	"github.com/better-compute/better-compute/agent/runtime/testimage"
	"github.com/better-compute/better-compute/internal/testutil"
)

// requireRunsc skips without gVisor's runsc (Debian package runsc, from
// bookworm-backports) besides what requireRunc needs.
func requireRunsc(t *testing.T) {
	t.Helper()
	requireRunc(t)
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Skip("no runsc (Debian package runsc, bookworm-backports)")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("no unshare (Debian package util-linux): %v", err)
	}
}

// snapshots serves and takes sandbox snapshots on the agent listener
// (protocol.SandboxSnapshotPath), as the API does for the node.
type snapshots struct {
	mu   sync.Mutex
	tars map[string][]byte
	puts map[string]string // snapshot id → X-Content-SHA256 of its PUT
}

func serveSnapshots(srv *imageServer) *snapshots {
	s := &snapshots{tars: map[string][]byte{}, puts: map[string]string{}}
	srv.handle(protocol.SandboxSnapshotPath, func(w http.ResponseWriter, r *http.Request) {
		if !srv.fromNode(w, r) {
			return
		}
		id := strings.TrimPrefix(r.URL.Path, protocol.SandboxSnapshotPath)
		switch r.Method {
		case http.MethodGet:
			s.mu.Lock()
			b, ok := s.tars[id]
			s.mu.Unlock()
			if !ok {
				http.NotFound(w, r)
				return
			}
			_, _ = w.Write(b)
		case http.MethodPut:
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			sum := sha256.Sum256(b)
			if hex.EncodeToString(sum[:]) != r.Header.Get("X-Content-SHA256") {
				http.Error(w, "sha256 mismatch", http.StatusBadRequest)
				return
			}
			s.mu.Lock()
			s.tars[id], s.puts[id] = b, r.Header.Get("X-Content-SHA256")
			s.mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		default:
			http.Error(w, "method", http.StatusMethodNotAllowed)
		}
	})
	return s
}

func gvisorInstance(id string, image []byte, command ...string) nodespec.Instance {
	in := containerInstance(id, 1, protocol.InstanceRunning, 1, 128, image)
	in.Runtime = runtime.KindGVisor
	in.Command = command
	return in
}

// execOut runs command in id and answers its stdout, failing on a non-zero
// exit.
func execOut(t *testing.T, rt *runtime.Runtime, id string, command ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	code, err := rt.Exec(context.Background(), protocol.ExecSpec{InstanceID: id, Command: command}, nil, &out, &errb)
	if err != nil || code != 0 {
		t.Fatalf("exec %v in %s: code %d, %v: %s", command, id, code, err, errb.String())
	}
	return out.String()
}

// counter is a process whose state is in memory (i) and in /tmp, a tmpfs
// of the sandbox's memory.
var counter = []string{"/bin/sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done"}

func readCount(t *testing.T, rt *runtime.Runtime, id string) int {
	t.Helper()
	// The counter rewrites the file (echo truncates first): a read may
	// find it empty for a moment.
	var n int
	testutil.EventuallyNil(t, 10*time.Second, func() error {
		var err error
		n, err = strconv.Atoi(strings.TrimSpace(execOut(t, rt, id, "cat", "/tmp/count")))
		return err
	})
	return n
}

// TestGVisor: a gvisor instance serves the test image's page; Exec
// streams, exits, times out and runs concurrently; a memory snapshot
// restored into new instances keeps its processes counting (with fresh
// entropy each); a disk snapshot keeps the rootfs.
func TestGVisor(t *testing.T) {
	requireRunsc(t)
	srv := newImageServer(t)
	snaps := serveSnapshots(srv)
	image := buildTestImage(t)
	web, count := randID(t, "inst_"), randID(t, "inst_")
	srv.serve(web, image, []byte("gvisor user data\n"))
	srv.serve(count, image, nil)
	h := newHarness(t, srv)
	webIn := gvisorInstance(web, image)
	webIn.UserData = true
	spec := nodespec.Spec{Instances: []nodespec.Instance{webIn, gvisorInstance(count, image, counter...)}}
	begin := time.Now()
	h.rt.OnSpec(1, spec)
	st := h.wait(web, 1, protocol.InstanceRunning, 30*time.Second)
	h.wait(count, 1, protocol.InstanceRunning, 30*time.Second)
	t.Logf("two gvisor instances: create → running %s", time.Since(begin).Round(time.Millisecond))
	if st.VCPU != 1 || st.MemoryMiB != 128 || st.Address == "" {
		t.Fatalf("running status %+v", st)
	}
	waitPage(t, st.Address, testimage.Marker+strings.ReplaceAll(web, "_", "-")+"\nuser-data: gvisor user data\n")
	if got := readInt(t, cgroupFile("memory", web, "memory.limit_in_bytes")); got != 128<<20 {
		t.Errorf("memory.limit_in_bytes %d", got)
	}

	t.Run("exec", func(t *testing.T) {
		cases := []struct {
			name           string
			spec           protocol.ExecSpec
			stdin          string
			code           int
			stdout, stderr string
		}{
			{"exit code and both streams", protocol.ExecSpec{Command: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, "", 3, "out\n", "err\n"},
			{"stdin", protocol.ExecSpec{Command: []string{"cat"}}, "from stdin\n", 0, "from stdin\n", ""},
			{"env and cwd", protocol.ExecSpec{Command: []string{"sh", "-c", "echo $GREETING; pwd"}, Env: map[string]string{"GREETING": "hi there"}, Cwd: "/etc"}, "", 0, "hi there\n/etc\n", ""},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				c.spec.InstanceID = web
				var out, errb bytes.Buffer
				var stdin io.Reader
				if c.stdin != "" {
					stdin = strings.NewReader(c.stdin)
				}
				code, err := h.rt.Exec(context.Background(), c.spec, stdin, &out, &errb)
				if err != nil || code != c.code || out.String() != c.stdout || errb.String() != c.stderr {
					t.Errorf("code %d, err %v, stdout %q, stderr %q; want %d, %q, %q", code, err, out.String(), errb.String(), c.code, c.stdout, c.stderr)
				}
			})
		}
		t.Run("streamed", func(t *testing.T) {
			// The first line comes out before the command reads its stdin:
			// nothing waits for the end.
			inR, inW := io.Pipe()
			outR, outW := io.Pipe()
			done := make(chan error, 1)
			go func() {
				code, err := h.rt.Exec(context.Background(), protocol.ExecSpec{InstanceID: web,
					Command: []string{"sh", "-c", "echo first; read x; echo got $x"}}, inR, outW, io.Discard)
				if err == nil && code != 0 {
					err = fmt.Errorf("exit code %d", code)
				}
				outW.CloseWithError(io.EOF)
				done <- err
			}()
			lines := bufio.NewReader(outR)
			if l, err := lines.ReadString('\n'); err != nil || l != "first\n" {
				t.Fatalf("first line %q, %v", l, err)
			}
			if _, err := io.WriteString(inW, "second\n"); err != nil {
				t.Fatal(err)
			}
			if l, err := lines.ReadString('\n'); err != nil || l != "got second\n" {
				t.Fatalf("second line %q, %v", l, err)
			}
			inW.Close()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
		t.Run("timeout", func(t *testing.T) {
			code, err := h.rt.Exec(context.Background(), protocol.ExecSpec{InstanceID: web, Command: []string{"sleep", "300"}, TimeoutMs: 300}, nil, io.Discard, io.Discard)
			if code != -1 || !errors.Is(err, runtime.ErrExecTimedOut) {
				t.Fatalf("code %d, err %v", code, err)
			}
			// Killed inside the sandbox, not only the runsc exec.
			testutil.Eventually(t, 10*time.Second, "the timed-out sleep gone", func() bool {
				return !strings.Contains(execOut(t, h.rt, web, "ps"), "sleep 300")
			})
		})
		t.Run("concurrent", func(t *testing.T) {
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var out bytes.Buffer
					code, err := h.rt.Exec(context.Background(), protocol.ExecSpec{InstanceID: web, Command: []string{"sh", "-c", "echo " + strconv.Itoa(i)}}, nil, &out, io.Discard)
					if err != nil || code != 0 || out.String() != strconv.Itoa(i)+"\n" {
						errs <- fmt.Errorf("exec %d: code %d, %v, %q", i, code, err, out.String())
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
		t.Run("not running here", func(t *testing.T) {
			_, err := h.rt.Exec(context.Background(), protocol.ExecSpec{InstanceID: "inst_elsewhere", Command: []string{"true"}}, nil, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), "not on this node") {
				t.Fatalf("err %v", err)
			}
		})
		t.Run("latency", func(t *testing.T) {
			var runs []time.Duration
			for range 20 {
				begin := time.Now()
				execOut(t, h.rt, web, "/bin/busybox", "true")
				runs = append(runs, time.Since(begin))
			}
			t.Logf("runsc exec of true, %d runs: p50 %s (min %s, max %s)", len(runs), p50(runs).Round(time.Millisecond), minDur(runs).Round(time.Millisecond), maxDur(runs).Round(time.Millisecond))
		})
	})

	t.Run("memory snapshot", func(t *testing.T) {
		testutil.Eventually(t, 10*time.Second, "the counter at 5", func() bool { return readCount(t, h.rt, count) >= 5 })
		// Only memory holds this: /tmp is the sandbox's tmpfs.
		execOut(t, h.rt, count, "sh", "-c", "echo in-memory > /tmp/marker")
		before := readCount(t, h.rt, count)
		begin := time.Now()
		path, sum, size, err := h.rt.Checkpoint(context.Background(), count, "snap_mem", true)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("memory checkpoint (runsc checkpoint --leave-running and the tar): %s, %d bytes", time.Since(begin).Round(time.Millisecond), size)
		// --leave-running: the instance goes on.
		testutil.Eventually(t, 10*time.Second, "the checkpointed counter going on", func() bool { return readCount(t, h.rt, count) > before })
		tarBytes, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if digest(tarBytes) != sum || int64(len(tarBytes)) != size {
			t.Fatalf("Checkpoint answered %s, %d bytes; the file is %s, %d", sum, size, digest(tarBytes), len(tarBytes))
		}
		if err := h.rt.UploadSnapshot(context.Background(), srv.client(t), srv.URL, "snap_mem", path); err != nil {
			t.Fatal(err)
		}
		snaps.mu.Lock()
		if snaps.puts["snap_mem"] != sum {
			t.Errorf("the PUT's X-Content-SHA256 %q, want %s", snaps.puts["snap_mem"], sum)
		}
		snaps.mu.Unlock()

		// Two instances from the one snapshot, each with its own address.
		restored := []string{randID(t, "inst_"), randID(t, "inst_")}
		for _, id := range restored {
			in := gvisorInstance(id, image, counter...)
			in.Restore = &nodespec.InstanceRestore{SnapshotID: "snap_mem", SHA256: sum, SizeBytes: size, Memory: true}
			spec.Instances = append(spec.Instances, in)
		}
		begin = time.Now()
		h.rt.OnSpec(2, spec)
		var random []string
		for _, id := range restored {
			h.wait(id, 1, protocol.InstanceRunning, 30*time.Second)
			if id == restored[0] {
				t.Logf("create from a memory snapshot → running (fetch, untar, runsc restore): %s", time.Since(begin).Round(time.Millisecond))
			}
			if got := execOut(t, h.rt, id, "cat", "/tmp/marker"); got != "in-memory\n" {
				t.Errorf("%s: /tmp/marker %q", id, got)
			}
			first := readCount(t, h.rt, id)
			if first < before {
				t.Errorf("%s: count %d after the restore, %d before the checkpoint: it started again", id, first, before)
			}
			testutil.Eventually(t, 10*time.Second, "the restored counter going on", func() bool { return readCount(t, h.rt, id) > first })
			random = append(random, execOut(t, h.rt, id, "sh", "-c", "head -c 32 /dev/urandom | busybox od -An -tx1"))
		}
		if random[0] == random[1] {
			t.Errorf("two restores of one snapshot read the same /dev/urandom bytes %q", random[0])
		}
		if a, b := statusAddr(h, restored[0]), statusAddr(h, restored[1]); a == b || a == "" {
			t.Errorf("restored addresses %q and %q", a, b)
		}
	})

	t.Run("disk snapshot", func(t *testing.T) {
		execOut(t, h.rt, web, "sh", "-c", "echo kept on disk > /disk-marker")
		path, sum, size, err := h.rt.Checkpoint(context.Background(), web, "snap_disk", false)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		snaps.mu.Lock()
		snaps.tars["snap_disk"] = b
		snaps.mu.Unlock()
		id := randID(t, "inst_")
		srv.serve(id, image, nil)
		in := gvisorInstance(id, image)
		in.Restore = &nodespec.InstanceRestore{SnapshotID: "snap_disk", SHA256: sum, SizeBytes: size}
		spec.Instances = append(spec.Instances, in)
		h.rt.OnSpec(3, spec)
		st := h.wait(id, 1, protocol.InstanceRunning, 30*time.Second)
		if got := execOut(t, h.rt, id, "cat", "/disk-marker"); got != "kept on disk\n" {
			t.Errorf("/disk-marker %q", got)
		}
		// Booted afresh: its own host name, and no user data (the
		// snapshot leaves the seed's user-data out).
		waitPage(t, st.Address, testimage.Marker+strings.ReplaceAll(id, "_", "-")+"\nuser-data: \n")
	})

	t.Run("resize", func(t *testing.T) {
		// runsc has no update: the instance starts again with the limits.
		in := gvisorInstance(count, image, counter...)
		in.Generation, in.VCPU, in.MemoryMiB = 2, 2, 256
		spec.Instances[1] = in
		h.rt.OnSpec(5, spec)
		st := h.wait(count, 2, protocol.InstanceRunning, 30*time.Second)
		if st.VCPU != 2 || st.MemoryMiB != 256 {
			t.Fatalf("resized status %+v", st)
		}
		if got := readInt(t, cgroupFile("memory", count, "memory.limit_in_bytes")); got != 256<<20 {
			t.Errorf("memory.limit_in_bytes %d after the resize", got)
		}
	})

	t.Run("runc", func(t *testing.T) {
		id := randID(t, "inst_")
		srv.serve(id, image, nil)
		spec.Instances = append(spec.Instances, containerInstance(id, 1, protocol.InstanceRunning, 1, 64, image))
		h.rt.OnSpec(6, spec)
		h.wait(id, 1, protocol.InstanceRunning, 30*time.Second)
		if got := execOut(t, h.rt, id, "sh", "-c", "echo via runc"); got != "via runc\n" {
			t.Errorf("runc exec: %q", got)
		}
		code, err := h.rt.Exec(context.Background(), protocol.ExecSpec{InstanceID: id, Command: []string{"sleep", "300"}, TimeoutMs: 200}, nil, io.Discard, io.Discard)
		if code != -1 || !errors.Is(err, runtime.ErrExecTimedOut) {
			t.Errorf("runc exec timeout: code %d, err %v", code, err)
		}
		if _, _, _, err := h.rt.Checkpoint(context.Background(), id, "snap_runc", true); err == nil || !strings.Contains(err.Error(), "needs the gvisor runtime") {
			t.Errorf("a runc memory checkpoint: %v", err)
		}
	})
}

func statusAddr(h *harness, id string) string {
	st, _ := h.rt.Status(id)
	return st.Address
}

func minDur(ds []time.Duration) time.Duration {
	m := ds[0]
	for _, d := range ds {
		m = min(m, d)
	}
	return m
}

func maxDur(ds []time.Duration) time.Duration {
	m := ds[0]
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}
