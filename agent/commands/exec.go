package commands

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"
)

// execArgs are an exec command's args (store/nodes.ExecArgs).
type execArgs struct {
	Argv           []string          `json:"argv"`
	TimeoutSeconds int64             `json:"timeoutSeconds"`
	Env            map[string]string `json:"env"`
}

// runExec runs argv directly (no shell) in a process group of its own,
// with the agent's environment and a.Env, capturing stdout and stderr up to
// MaxOutput bytes each. The timeout (DefaultTimeout when 0) or ctx's end
// kills the whole group.
func runExec(ctx context.Context, a execArgs) Result {
	if len(a.Argv) == 0 || a.Argv[0] == "" {
		return Result{State: Failed, Error: "bad args: argv is empty"}
	}
	timeout := DefaultTimeout
	if a.TimeoutSeconds != 0 {
		timeout = time.Duration(a.TimeoutSeconds) * time.Second
		if timeout < time.Second || timeout > MaxTimeout {
			return Result{State: Failed, Error: fmt.Sprintf("bad args: timeoutSeconds %d is not in [1, 3600]", a.TimeoutSeconds)}
		}
	}
	runCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(runCtx, a.Argv[0], a.Argv[1:]...)
	cmd.Env = os.Environ()
	for k, v := range a.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr capped
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	ownProcessGroup(cmd)
	// A grandchild that keeps the pipes open must not hold the result back.
	cmd.WaitDelay = 2 * time.Second
	err := cmd.Run()

	r := Result{Stdout: stdout.String(), Stderr: stderr.String(), Truncated: stdout.truncated() || stderr.truncated()}
	if cmd.ProcessState != nil {
		code := cmd.ProcessState.ExitCode() // -1 when killed by a signal
		r.ExitCode = &code
	}
	var exitErr *exec.ExitError
	switch {
	case runCtx.Err() != nil && ctx.Err() != nil:
		r.State, r.Error = Failed, ErrCancelled
	case errors.Is(runCtx.Err(), context.DeadlineExceeded):
		r.State, r.Error = Failed, fmt.Sprintf("timed out after %s", timeout)
	case err == nil:
		r.State = Succeeded
	case errors.As(err, &exitErr):
		r.State = Failed
	case errors.Is(err, exec.ErrWaitDelay):
		r.State = Failed
		if r.ExitCode != nil && *r.ExitCode == 0 {
			r.State = Succeeded
		}
	default:
		r.State, r.Error = Failed, err.Error()
	}
	return r
}

// capped keeps the first MaxOutput bytes written to it and counts the rest;
// it never fails a write, so the process is not stopped by a full buffer.
type capped struct {
	mu      sync.Mutex
	buf     []byte
	dropped int64
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	room := MaxOutput - len(c.buf)
	if room > len(p) {
		room = len(p)
	}
	c.buf = append(c.buf, p[:room]...)
	c.dropped += int64(len(p) - room)
	return len(p), nil
}

func (c *capped) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return string(c.buf)
}

func (c *capped) truncated() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropped > 0
}
