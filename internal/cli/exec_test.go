package cli

import (
	"fmt"
	"testing"

	"github.com/better-compute/better-compute/api/tunnels"
)

func TestExecExitCodes(t *testing.T) {
	for _, tc := range []struct {
		status tunnels.ExitStatus
		want   int
	}{
		{tunnels.ExitStatus{ExitCode: 3}, 3},
		{tunnels.ExitStatus{ExitCode: 255}, 255},
		{tunnels.ExitStatus{ExitCode: -1, TimedOut: true, Error: "context deadline exceeded"}, 124},
		{tunnels.ExitStatus{ExitCode: -1, Error: "no such instance"}, ExitGeneric},
		{tunnels.ExitStatus{Truncated: true}, ExitGeneric},
		{tunnels.ExitStatus{ExitCode: 300}, ExitGeneric},
	} {
		err := fmt.Errorf("wrapped: %w", ExecExit{Status: tc.status})
		if got := ExitCode(err); got != tc.want {
			t.Errorf("%+v: exit %d, want %d", tc.status, got, tc.want)
		}
	}
}
