package tunnel

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
)

// gateway is an HTTP/2 TLS server standing in for the agent listener's
// dial-back endpoint, with its small stream windows: serve gets each
// dial-back's request body and its flushed response, and the response
// ends when serve returns (as the gateway's does when the tunnel ends).
type gateway struct {
	srv      *httptest.Server
	refusals chan string
}

func newGateway(t *testing.T, serve func(body io.Reader, w io.Writer)) *gateway {
	t.Helper()
	g := &gateway{refusals: make(chan string, 1)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+protocol.TunnelPath+"{id}", func(w http.ResponseWriter, r *http.Request) {
		if reason := r.Header.Get(ErrorHeader); reason != "" {
			g.refusals <- reason
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.EnableFullDuplex(); err != nil && r.ProtoMajor < 2 {
			t.Errorf("dial-back over HTTP/%d", r.ProtoMajor)
			return
		}
		w.WriteHeader(http.StatusOK)
		if err := rc.Flush(); err != nil {
			return
		}
		fw := &flushWriter{w: w, rc: rc}
		defer fw.close()
		serve(r.Body, fw)
	})
	g.srv = httptest.NewUnstartedServer(mux)
	g.srv.EnableHTTP2 = true
	g.srv.Config.HTTP2 = &http.HTTP2Config{MaxReceiveBufferPerConnection: 64 << 10, MaxReceiveBufferPerStream: 64 << 10}
	g.srv.StartTLS()
	t.Cleanup(g.srv.Close)
	return g
}

// flushWriter flushes each write; after close (the handler's end, as the
// gateway's tunnelStream) writes fail.
type flushWriter struct {
	mu     sync.Mutex
	closed bool
	w      io.Writer
	rc     *http.ResponseController
}

func (f *flushWriter) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
}

func (f *flushWriter) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, io.ErrClosedPipe
	}
	n, err := f.w.Write(p)
	if err != nil {
		return n, err
	}
	return n, f.rc.Flush()
}

func (g *gateway) serve(t *testing.T, o *Opener, tun protocol.Tunnel) {
	t.Helper()
	o.Endpoint = g.srv.URL
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tun.ID = core.NewID("tun")
	o.Serve(ctx, g.srv.Client(), tun)
}

// TestSpliceDeliversATargetsLastBytes: a target that writes 1 MiB and
// closes at once must reach the gateway whole (the splice once cancelled
// the stream when the target ended, dropping the bytes not yet sent).
func TestSpliceDeliversATargetsLastBytes(t *testing.T) {
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write(payload)
			_ = c.Close()
		}
	}()
	got := make(chan []byte, 1)
	g := newGateway(t, func(body io.Reader, _ io.Writer) {
		b, _ := io.ReadAll(body)
		got <- b
	})
	for range 5 {
		g.serve(t, &Opener{}, protocol.Tunnel{Target: protocol.TunnelTCP, Address: ln.Addr().String()})
		if b := <-got; !bytes.Equal(b, payload) {
			t.Fatalf("the gateway got %d of the target's %d bytes", len(b), len(payload))
		}
	}
}

// shExecer runs the command as a local process: Exec returns at its exit
// whether or not stdin ended.
type shExecer struct{}

func (shExecer) Exec(ctx context.Context, spec protocol.ExecSpec, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	cmd := exec.CommandContext(ctx, spec.Command[0], spec.Command[1:]...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = stdout, stderr, spec.Cwd
	for k, v := range spec.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return -1, err
	}
	if err := cmd.Start(); err != nil {
		return -1, err
	}
	go func() {
		_, _ = io.Copy(in, stdin)
		_ = in.Close()
	}()
	err = cmd.Wait()
	if ctx.Err() != nil {
		return -1, ctx.Err()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	return cmd.ProcessState.ExitCode(), err
}

// execResult is what the caller's side of an exec tunnel read.
type execResult struct {
	stdout, stderr []byte
	exit           *protocol.ExecExitStatus
	afterExit      int // frames after the exit frame
	err            error
}

// execCaller plays the caller: it sends stdin (then, if closeStdin, the
// stdin-closed frame) and reads the frames until the stream ends.
func execCaller(stdin []byte, closeStdin bool, res chan<- execResult) func(body io.Reader, w io.Writer) {
	return func(body io.Reader, w io.Writer) {
		enc := protocol.NewExecEncoder(w)
		go func() {
			if len(stdin) > 0 {
				_ = enc.Write(protocol.ExecStdin, stdin)
			}
			if closeStdin {
				_ = enc.Write(protocol.ExecStdinClosed, nil)
			}
		}()
		var r execResult
		dec := protocol.NewExecDecoder(body)
		for {
			ch, p, err := dec.Next()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					r.err = err
				}
				res <- r
				return
			}
			if r.exit != nil {
				r.afterExit++
				continue
			}
			switch ch {
			case protocol.ExecStdout:
				r.stdout = append(r.stdout, p...)
			case protocol.ExecStderr:
				r.stderr = append(r.stderr, p...)
			case protocol.ExecExit:
				s, err := protocol.DecodeExit(p)
				if err != nil {
					r.err = err
				}
				r.exit = &s
			}
		}
	}
}

func TestExecTunnel(t *testing.T) {
	big := strings.Repeat("x", 3<<20)
	for _, tc := range []struct {
		name       string
		command    string
		stdin      string
		closeStdin bool
		timeoutMs  int64
		limit      int64
		stdout     string
		stderr     string
		exit       protocol.ExecExitStatus
	}{
		{name: "stdin to stdout", command: "cat", stdin: "hello\nworld\n", closeStdin: true, stdout: "hello\nworld\n"},
		{name: "exit code and stderr", command: "echo out; echo oops >&2; exit 3", stdout: "out\n", stderr: "oops\n",
			exit: protocol.ExecExitStatus{ExitCode: 3}},
		{name: "exit without reading an open stdin", command: "exit 7", stdin: "ignored", exit: protocol.ExecExitStatus{ExitCode: 7}},
		{name: "env and cwd", command: `printf "%s %s" "$GREETING" "$(pwd)"`, stdout: "hi /tmp"},
		{name: "output past the limit is dropped", command: "printf 0123456789; printf abcdefghij",
			limit: 15, stdout: "0123456789abcde", exit: protocol.ExecExitStatus{Truncated: true}},
		{name: "3 MiB of stdout, all of it", command: "head -c 3145728 /dev/zero | tr '\\0' x", stdout: big},
		{name: "timeout", command: "exec sleep 60", timeoutMs: 100,
			exit: protocol.ExecExitStatus{ExitCode: -1, TimedOut: true, Error: context.DeadlineExceeded.Error()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := make(chan execResult, 1)
			g := newGateway(t, execCaller([]byte(tc.stdin), tc.closeStdin, res))
			g.serve(t, &Opener{Execer: shExecer{}}, protocol.Tunnel{Target: protocol.TunnelExec, ExecOutputLimit: tc.limit,
				Exec: &protocol.ExecSpec{InstanceID: "inst_x", Command: []string{"sh", "-c", tc.command}, Cwd: "/tmp",
					Env: map[string]string{"GREETING": "hi"}, TimeoutMs: tc.timeoutMs}})
			r := <-res
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.exit == nil {
				t.Fatal("no exit frame")
			}
			if *r.exit != tc.exit || r.afterExit != 0 {
				t.Fatalf("exit %+v (%d frames after it), want %+v", *r.exit, r.afterExit, tc.exit)
			}
			if string(r.stdout) != tc.stdout || string(r.stderr) != tc.stderr {
				t.Fatalf("stdout %d bytes %.40q, stderr %q; want %d bytes %.40q, %q",
					len(r.stdout), r.stdout, r.stderr, len(tc.stdout), tc.stdout, tc.stderr)
			}
		})
	}
}

func TestExecTunnelRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opener *Opener
		spec   *protocol.ExecSpec
		want   string
	}{
		{name: "no execer", opener: &Opener{}, spec: &protocol.ExecSpec{Command: []string{"true"}}, want: "not served"},
		{name: "no command", opener: &Opener{Execer: shExecer{}}, spec: &protocol.ExecSpec{}, want: "names its command"},
		{name: "no spec", opener: &Opener{Execer: shExecer{}}, want: "names its command"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGateway(t, func(io.Reader, io.Writer) { t.Error("a refused exec tunnel dialed back with a stream") })
			g.serve(t, tc.opener, protocol.Tunnel{Target: protocol.TunnelExec, Exec: tc.spec})
			if got := <-g.refusals; !strings.Contains(got, tc.want) {
				t.Fatalf("refusal %q, want it to say %q", got, tc.want)
			}
		})
	}
}
