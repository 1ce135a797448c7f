package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"golang.org/x/term"

	"github.com/better-compute/better-compute/core"
)

// Exit codes by error class, so scripts can tell a refusal from an outage.
const (
	ExitOK          = 0
	ExitGeneric     = 1 // anything else, INTERNAL_ERROR included
	ExitUsage       = 2 // a bad command line, or INVALID_INPUT
	ExitDenied      = 3 // UNAUTHENTICATED, ACCESS_DENIED
	ExitNotFound    = 4 // NOT_FOUND
	ExitConflict    = 5 // CONFLICT, INVALID_STATE
	ExitUnavailable = 6 // UNAVAILABLE, or the API could not be reached
	ExitQuota       = 7 // QUOTA_EXCEEDED
	ExitUnsupported = 8 // UNSUPPORTED (a planned method, among others)
)

var exitByCode = map[core.Code]int{
	core.CodeInvalidInput:  ExitUsage,
	core.CodeUnauthn:       ExitDenied,
	core.CodeAccessDenied:  ExitDenied,
	core.CodeNotFound:      ExitNotFound,
	core.CodeConflict:      ExitConflict,
	core.CodeInvalidState:  ExitConflict,
	core.CodeUnavailable:   ExitUnavailable,
	core.CodeQuotaExceeded: ExitQuota,
	core.CodeUnsupported:   ExitUnsupported,
}

// usageError is a command line the CLI cannot run.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func usageErrorf(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// ExitCode is the process's exit status for err.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var x ExecExit
	if errors.As(err, &x) {
		return x.exitCode()
	}
	var u usageError
	if errors.As(err, &u) || isCobraUsage(err) {
		return ExitUsage
	}
	var e *core.Error
	if errors.As(err, &e) {
		if c, ok := exitByCode[e.Code]; ok {
			return c
		}
		return ExitGeneric
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return ExitUnavailable
	}
	return ExitGeneric
}

// isCobraUsage: cobra reports an unknown command or a wrong argument
// count in plain errors.
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand", "accepts ", "requires at least", "invalid argument"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// Report writes err to w (an API error with its details, which name the
// field at fault) and answers the exit code.
func Report(w io.Writer, err error) int {
	fmt.Fprintln(w, "better-compute:", err)
	var e *core.Error
	if errors.As(err, &e) && len(e.Details) > 0 {
		if b, jerr := json.Marshal(e.Details); jerr == nil {
			fmt.Fprintln(w, "  details:", string(b))
		}
	}
	return ExitCode(err)
}

func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }
