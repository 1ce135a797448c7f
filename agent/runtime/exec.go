package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
)

// ErrExecTimedOut is Exec's error when the command ran past its timeout
// and was killed (the exit code is then -1).
var ErrExecTimedOut = errors.New("exec: timed out")

// Exec runs spec's command inside a running container or gvisor instance
// (runc exec, runsc exec) with its env and cwd, streaming stdin (nil:
// none), stdout and stderr, and answers its exit code. At the timeout, or
// when ctx ends, the process is killed inside the container: exit code -1
// with ErrExecTimedOut (or ctx's error). Execs on one instance may run
// concurrently.
func (r *Runtime) Exec(ctx context.Context, spec protocol.ExecSpec, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if len(spec.Command) == 0 {
		return -1, errors.New("exec: no command")
	}
	kept, err := r.readKept(spec.InstanceID)
	if err == nil && kept.Runtime == KindVM {
		return -1, fmt.Errorf("exec: instance %s is a vm: exec needs a container runtime (container or gvisor)", spec.InstanceID)
	}
	rt, err := r.runningContainer(ctx, spec.InstanceID)
	if err != nil {
		return -1, fmt.Errorf("exec: %w", err)
	}
	pidDir, err := os.MkdirTemp(r.instanceDir(spec.InstanceID), ".exec-*")
	if err != nil {
		return -1, err
	}
	defer os.RemoveAll(pidDir)
	pidFile := filepath.Join(pidDir, "pid")
	args := []string{"exec"}
	// runc's pid file holds the host pid; runsc's internal one the pid in
	// the sandbox, which `runsc kill --pid` takes.
	if rt.kind == KindGVisor {
		args = append(args, "--internal-pid-file", pidFile)
	} else {
		args = append(args, "--pid-file", pidFile)
	}
	if spec.Cwd != "" {
		args = append(args, "--cwd", spec.Cwd)
	}
	keys := make([]string, 0, len(spec.Env))
	for k := range spec.Env {
		if k == "" || strings.Contains(k, "=") {
			return -1, fmt.Errorf("exec: env name %q", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "--env", k+"="+spec.Env[k])
	}
	args = append(append(args, spec.InstanceID), spec.Command...)
	// Not CommandContext: killing runc or runsc exec would leave the
	// process running in the container.
	cmd := rt.command(context.Background(), args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	// A stdin that never ends must not hold Wait once the process exited.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("exec: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var deadline <-chan time.Time
	if spec.TimeoutMs > 0 {
		t := time.NewTimer(time.Duration(spec.TimeoutMs) * time.Millisecond)
		defer t.Stop()
		deadline = t.C
	}
	var cause error
	select {
	case err := <-done:
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			return -1, fmt.Errorf("exec: %w", err)
		}
		return cmd.ProcessState.ExitCode(), nil
	case <-deadline:
		cause = ErrExecTimedOut
	case <-ctx.Done():
		cause = ctx.Err()
	}
	r.killExec(rt, spec.InstanceID, pidFile, cmd)
	<-done
	return -1, cause
}

// killExec kills an exec'd process inside its container (SIGKILL), or,
// when its pid is not known yet, the exec command itself.
func (r *Runtime) killExec(rt ociRuntime, id, pidFile string, cmd *exec.Cmd) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := os.ReadFile(pidFile)
	pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
	switch {
	case err != nil || perr != nil || pid <= 0:
	case rt.kind == KindGVisor:
		if _, err := rt.run(ctx, "kill", "--pid", strconv.Itoa(pid), id, "KILL"); err == nil {
			return
		}
	default:
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			return
		}
	}
	_ = cmd.Process.Kill()
}
