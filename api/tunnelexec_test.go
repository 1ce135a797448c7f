package api_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/api/tunnels"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/cli"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
)

// sandboxExecInput is the test's stand-in for sandboxes.exec's input: the
// test serves the method's row with a handler that opens the exec tunnel
// on the test's node, so the tunnel is tested without a sandbox's
// workload (e2e/sandboxes_test.go runs the real method).
type sandboxExecInput struct {
	TenantID  string   `json:"tenantId" jsonschema:"required" id:"tenant"`
	SandboxID string   `json:"sandboxId" jsonschema:"required" id:"sbx"`
	Command   []string `json:"command" jsonschema:"required"`
	Limit     int64    `json:"outputLimitBytes,omitempty"`
}

const sandboxExec rpc.Ref[sandboxExecInput, tunnels.Opened] = "sandboxes.exec"

func sandboxExecDomain(nodeID func() string) rpc.Domain {
	return func(d rpc.Deps) []rpc.Descriptor {
		return []rpc.Descriptor{&rpc.Method[sandboxExecInput, tunnels.Opened]{Name: sandboxExec,
			Action: "compute:sandboxes:exec", DecidedOn: "compute-sandbox", Phase: "v0.5", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in sandboxExecInput) (tunnels.Opened, error) {
				return tunnels.OpenExec(ctx, d, c, tx, nodeID(), protocol.ExecSpec{InstanceID: in.SandboxID, Command: in.Command},
					in.Limit, 0)
			}}}
	}
}

// localExecer runs an exec tunnel's command as a local process (the node's
// runtime stands behind the same interface).
type localExecer struct{}

func (localExecer) Exec(ctx context.Context, spec protocol.ExecSpec, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	cmd := exec.CommandContext(ctx, spec.Command[0], spec.Command[1:]...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
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
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	return cmd.ProcessState.ExitCode(), err
}

// An exec tunnel, end to end: the method opens it in its transaction,
// the CLI's RunExec connects, the agent runs the command with the
// caller's stdin, and stdout, stderr and the exit code come back, the
// exit frame last; the row records the spec.
func TestExecTunnelRunsACommandThroughTheNodesSession(t *testing.T) {
	te := newTunnelEnv(t)
	client := te.client(te.boot.UserToken)
	ctx := context.Background()
	sbx := core.NewID("sbx")
	// No sandbox row: an authorization row
	// stands in for the sandbox, so the decision on compute-sandbox can be
	// made.
	if err := te.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		return store.PutAuthzResource(ctx, tx, store.AuthzResource{Type: te.catalog.FullName("sandbox"),
			ID: sbx, TenantID: "acme", ParentType: te.catalog.FullName("pool"), ParentID: te.pool.ID})
	}); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyNil(t, 20*time.Second, func() error {
		_, err := sandboxExec.Call(ctx, client, sandboxExecInput{TenantID: "acme", SandboxID: sbx, Command: []string{"true"}})
		return err
	})
	for _, tc := range []struct {
		name           string
		command        string
		stdin          string
		limit          int64
		stdout, stderr string
		exitCode       int // the CLI's
	}{
		{name: "stdin through cat", command: "cat; echo done >&2", stdin: strings.Repeat("line\n", 50000),
			stdout: strings.Repeat("line\n", 50000), stderr: "done\n"},
		{name: "an exit code", command: "echo nope >&2; exit 5", stderr: "nope\n", exitCode: 5},
		{name: "output past the limit", command: "printf 0123456789", limit: 4, stdout: "0123", exitCode: cli.ExitGeneric},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opened, err := sandboxExec.Call(ctx, client, sandboxExecInput{TenantID: "acme", SandboxID: sbx,
				Command: []string{"sh", "-c", tc.command}, Limit: tc.limit})
			if err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			err = cli.RunExec(ctx, client, opened, strings.NewReader(tc.stdin), &stdout, &stderr)
			if code := cli.ExitCode(err); code != tc.exitCode {
				t.Fatalf("exit code %d (%v), want %d", code, err, tc.exitCode)
			}
			if stdout.String() != tc.stdout || stderr.String() != tc.stderr {
				t.Fatalf("stdout %d bytes, stderr %q; want %d bytes, %q", stdout.Len(), stderr.String(), len(tc.stdout), tc.stderr)
			}
			var target, spec, instance string
			if err := te.store.Pool.QueryRow(ctx, `SELECT target, exec->>'command', instance_id FROM tunnels WHERE id = $1`,
				opened.TunnelID).Scan(&target, &spec, &instance); err != nil {
				t.Fatal(err)
			}
			if target != "exec" || !strings.Contains(spec, tc.command[:4]) || instance != sbx {
				t.Fatalf("row: target %q, command %s, instance %q", target, spec, instance)
			}
		})
	}
	// The token is single-use, as any tunnel's.
	opened, err := sandboxExec.Call(ctx, client, sandboxExecInput{TenantID: "acme", SandboxID: sbx, Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.RunExec(ctx, client, opened, nil, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	var ce *core.Error
	if err := cli.RunExec(ctx, client, opened, nil, io.Discard, io.Discard); !errors.As(err, &ce) || ce.Code != core.CodeInvalidState {
		t.Fatalf("a second connect: %v, want INVALID_STATE", err)
	}
}
