package tunnel

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
)

// Execer runs a command in an instance (agent/runtime's Runtime). Exec
// returns once the command has exited and its stdout and stderr are
// written, even if stdin has not ended; it stops the command when ctx
// ends.
type Execer interface {
	Exec(ctx context.Context, spec protocol.ExecSpec, stdin io.Reader, stdout, stderr io.Writer) (int, error)
}

// serveExec serves an exec tunnel: the command runs behind an in-memory
// pipe that the splice carries like a dialed target, speaking exec frames
// (protocol/execwire.go). The command starts once the gateway has taken
// the stream, and the exit frame is its last write before the pipe
// closes, so the splice delivers it before the tunnel ends.
func (o *Opener) serveExec(ctx context.Context, client *http.Client, t protocol.Tunnel, log *slog.Logger) {
	switch {
	case o.Execer == nil:
		o.report(ctx, client, t.ID, "exec is not served by this agent")
		return
	case t.Exec == nil || len(t.Exec.Command) == 0:
		o.report(ctx, client, t.ID, "an exec tunnel names its command")
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	target, runner := net.Pipe()
	defer target.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	var status protocol.ExecExitStatus
	up := func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status = o.runExec(ctx, t, runner)
		}()
	}
	if err := o.splice(ctx, client, t.ID, target, up); err != nil {
		log.Warn("exec tunnel: ended", "error", err)
	}
	// The splice is over: a command still running has no caller left.
	cancel()
	_ = runner.Close()
	wg.Wait()
	log.Info("exec tunnel: closed", "instance", t.Exec.InstanceID, "exitCode", status.ExitCode,
		"timedOut", status.TimedOut, "truncated", status.Truncated)
}

// runExec runs t's command with conn as its framed stdio and ends with the
// exit frame.
func (o *Opener) runExec(ctx context.Context, t protocol.Tunnel, conn net.Conn) protocol.ExecExitStatus {
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	spec := *t.Exec
	ectx := ctx
	if spec.TimeoutMs > 0 {
		var stop context.CancelFunc
		ectx, stop = context.WithTimeout(ctx, time.Duration(spec.TimeoutMs)*time.Millisecond)
		defer stop()
	}
	enc := protocol.NewExecEncoder(conn)
	limit := t.ExecOutputLimit
	if limit <= 0 {
		limit = protocol.DefaultExecOutputLimit
	}
	out := &outputBudget{left: limit}
	stdinR, stdinW := io.Pipe()
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		readStdin(conn, stdinW)
		// The stream's end before the exit frame: the caller is gone.
		cancel()
	}()
	code, err := o.Execer.Exec(ectx, spec, stdinR,
		out.writer(enc.Channel(protocol.ExecStdout)), out.writer(enc.Channel(protocol.ExecStderr)))
	// Unblocks the reader's write of stdin the command no longer takes.
	_ = stdinR.CloseWithError(io.ErrClosedPipe)
	status := protocol.ExecExitStatus{ExitCode: code, Truncated: out.truncated()}
	if errors.Is(ectx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
		status.TimedOut = true
	}
	if err != nil {
		status.Error = err.Error()
	}
	if err := enc.Exit(status); err != nil {
		status.Error = "the exit frame was not delivered: " + err.Error()
	}
	_ = conn.Close()
	<-readDone
	return status
}

// readStdin feeds the caller's stdin frames to w until the stdin-closed
// frame or the stream's end (which also ends stdin).
func readStdin(conn net.Conn, w *io.PipeWriter) {
	dec := protocol.NewExecDecoder(conn)
	stdinOpen := true
	for {
		ch, p, err := dec.Next()
		if err != nil {
			_ = w.CloseWithError(io.EOF)
			return
		}
		switch ch {
		case protocol.ExecStdin:
			// Stdin the command no longer reads is dropped, not an error:
			// the frames after it still matter.
			if stdinOpen {
				if _, err := w.Write(p); err != nil {
					stdinOpen = false
				}
			}
		case protocol.ExecStdinClosed:
			stdinOpen = false
			_ = w.Close()
		default:
			// Only the agent sends output and exit frames.
			_ = w.CloseWithError(protocol.ErrExecFrame)
			return
		}
	}
}

// outputBudget is the stdout and stderr bytes still forwarded, shared by
// both; past it output is dropped (the command keeps running).
type outputBudget struct {
	mu      sync.Mutex
	left    int64
	dropped bool
}

func (b *outputBudget) truncated() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dropped
}

func (b *outputBudget) writer(w io.Writer) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		b.mu.Lock()
		n := int64(len(p))
		if n > b.left {
			n, b.dropped = b.left, true
		}
		b.left -= n
		b.mu.Unlock()
		if n > 0 {
			if _, err := w.Write(p[:n]); err != nil {
				return 0, err
			}
		}
		// Dropped bytes count as written: the command is not told.
		return len(p), nil
	})
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
