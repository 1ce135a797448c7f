package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/tunnels"
)

// ExecExit is a remote command (an exec tunnel's) that did not end well:
// the CLI exits with its code (ExitCode), 124 when it timed out, as
// timeout(1) does.
type ExecExit struct{ Status tunnels.ExitStatus }

func (e ExecExit) Error() string {
	s := e.Status
	switch {
	case s.TimedOut:
		return "the command timed out"
	case s.Error != "":
		return "the command failed: " + s.Error
	case s.Truncated && s.ExitCode == 0:
		return "the command's output passed the limit and was cut"
	}
	return fmt.Sprintf("the command exited with code %d", s.ExitCode)
}

// exitCode is the CLI's exit status for the remote command's end.
func (e ExecExit) exitCode() int {
	switch s := e.Status; {
	case s.TimedOut:
		return 124
	case s.Error != "" || s.ExitCode < 1 || s.ExitCode > 255:
		return ExitGeneric
	default:
		return s.ExitCode
	}
}

// RunExec connects to the exec tunnel opened (an API method's answer, e.g.
// sandboxes.exec) and runs it with stdin, stdout and stderr: nil when the
// command exited 0 with all its output, else an ExecExit (or why the
// tunnel failed). It is `better-compute sandbox exec`'s body once the
// method is open.
func RunExec(ctx context.Context, client *api.Client, opened tunnels.Opened, stdin io.Reader, stdout, stderr io.Writer) error {
	u := opened.URL
	if strings.HasPrefix(u, "/") {
		u = client.BaseURL + u
	}
	st, err := tunnels.Exec(ctx, client.HTTP, u, opened.Token, stdin, stdout, stderr)
	if err != nil {
		return fmt.Errorf("exec tunnel %s: %w", opened.TunnelID, err)
	}
	if st.ExitCode != 0 || st.TimedOut || st.Error != "" || st.Truncated {
		return ExecExit{Status: st}
	}
	return nil
}
