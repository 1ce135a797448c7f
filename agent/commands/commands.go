// Package commands is the agent's side of node commands
// (docs/agent-protocol.md, "Commands"): it runs each command the session
// delivers at most once and answers its result frame.
//
// At most once: before a command runs, its seq is recorded in the state
// directory (a temporary file, fsync, rename, fsync of the directory) as the
// last executed, and a command whose seq is at or below the recorded one is
// never run again ("skipped", "already executed"). So a command delivered
// again after a reconnect, or after the agent restarted, is not re-run; a
// crash while one runs loses its result, never runs it twice.
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
	"sync"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
)

// Command kinds.
const (
	KindExec             = string(protocol.CommandExec)
	KindCDIExpose        = string(protocol.CommandCDIExpose)
	KindCDIWithdraw      = string(protocol.CommandCDIWithdraw)
	KindInventoryRefresh = string(protocol.CommandInventoryRefresh)
	KindReboot           = string(protocol.CommandReboot)
	KindAgentUpdate      = string(protocol.CommandAgentUpdate)
)

// Result states.
const (
	Succeeded = string(protocol.CommandSucceeded)
	Failed    = string(protocol.CommandFailed)
	Skipped   = string(protocol.CommandSkipped)
)

// Skipped results' errors.
const (
	ErrAlreadyExecuted = "already executed"
	ErrExpired         = "expired"
	ErrGeneration      = "generation"
	ErrCancelled       = "cancelled"
)

// Limits: each of stdout and stderr is kept to MaxOutput bytes (Truncated
// says when more was written); exec's timeout defaults to DefaultTimeout.
const (
	MaxOutput      = 64 << 10
	DefaultTimeout = 60 * time.Second
	MaxTimeout     = time.Hour
)

// DefaultCDIDir is where CDI specs are written when Executor.CDIDir is "".
const DefaultCDIDir = "/etc/cdi"

// lastExecutedFile, in the state directory, holds the last executed seq.
const lastExecutedFile = "last-executed-seq"

// Command is a command frame.
type Command struct {
	Seq           int64           `json:"seq"`
	ID            string          `json:"id"`
	Kind          string          `json:"kind"`
	Args          json.RawMessage `json:"args"`
	NotBefore     int64           `json:"notBefore"` // epoch ms, 0 = none
	NotAfter      int64           `json:"notAfter"`  // epoch ms, 0 = none
	MinGeneration int64           `json:"minGeneration"`
}

// Result is a result frame.
type Result struct {
	Seq       int64  `json:"seq"`
	State     string `json:"state"` // succeeded, failed or skipped
	ExitCode  *int   `json:"exitCode,omitempty"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Error     string `json:"error"`
	Truncated bool   `json:"truncated"`
}

// Executor runs commands. Its zero value (with a StateDir) works: Now
// defaults to time.Now, CDIDir to DefaultCDIDir; a nil ObservedGeneration
// observes generation 0 and a nil RefreshInventory fails inventory.refresh.
type Executor struct {
	StateDir           string
	CDIDir             string // default /etc/cdi
	Simulate           bool   // reboot does nothing
	Now                func() time.Time
	ObservedGeneration func() int64
	RefreshInventory   func(ctx context.Context) error
	// AgentUpdate replaces the running build (agent/selfupdate); on
	// success it does not return, and the new build answers the command.
	// Nil fails agent.update.
	AgentUpdate func(ctx context.Context, seq int64, args protocol.AgentUpdateArgs) error
}

// stateLocks serialises the check and record of the last executed seq per
// state directory, across every Executor of the process.
var stateLocks sync.Map // cleaned state dir → *sync.Mutex

func (e *Executor) lock() func() {
	m, _ := stateLocks.LoadOrStore(filepath.Clean(e.StateDir), &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

func (e *Executor) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// LastExecuted answers the last executed seq (0 when none), which the
// hello frame carries as lastExecutedSeq.
func (e *Executor) LastExecuted() (int64, error) {
	defer e.lock()()
	return e.lastExecuted()
}

func (e *Executor) lastExecuted() (int64, error) {
	if e.StateDir == "" {
		return 0, errors.New("commands: no state directory")
	}
	raw, err := os.ReadFile(filepath.Join(e.StateDir, lastExecutedFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	seq, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil || seq < 0 {
		return 0, fmt.Errorf("commands: %s holds %q, not a seq", lastExecutedFile, raw)
	}
	return seq, nil
}

// claim records seq as the last executed unless it is at or below the
// recorded one; it reports whether the command may run.
func (e *Executor) claim(seq int64) (bool, error) {
	defer e.lock()()
	last, err := e.lastExecuted()
	if err != nil || seq <= last {
		return false, err
	}
	if err := os.MkdirAll(e.StateDir, 0o700); err != nil {
		return false, err
	}
	return true, writeFileAtomic(e.StateDir, lastExecutedFile, []byte(strconv.FormatInt(seq, 10)+"\n"), 0o600)
}

// Run runs c at most once and answers its result. A command whose seq is
// at or below the last executed one is skipped ("already executed"), as is
// one whose notAfter has passed by the agent's clock ("expired") or whose
// minGeneration is above the observed generation ("generation"). One whose
// notBefore is ahead is waited for; when ctx ends first, it is skipped
// ("cancelled") and not recorded, so a later delivery runs it. Once
// recorded, the command runs; ctx's end then stops it (exec kills its
// process group).
func (e *Executor) Run(ctx context.Context, c Command) Result {
	skip := func(why string) Result { return Result{Seq: c.Seq, State: Skipped, Error: why} }
	fail := func(err error) Result { return Result{Seq: c.Seq, State: Failed, Error: err.Error()} }
	if c.Seq < 1 {
		return fail(fmt.Errorf("command seq %d is not positive", c.Seq))
	}
	if last, err := e.LastExecuted(); err != nil {
		return fail(err)
	} else if c.Seq <= last {
		return skip(ErrAlreadyExecuted)
	}
	if c.NotAfter > 0 && e.now().UnixMilli() >= c.NotAfter {
		return skip(ErrExpired)
	}
	if c.NotBefore > 0 {
		if wait := time.UnixMilli(c.NotBefore).Sub(e.now()); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return skip(ErrCancelled)
			case <-t.C:
			}
		}
		if c.NotAfter > 0 && e.now().UnixMilli() >= c.NotAfter {
			return skip(ErrExpired)
		}
	}
	if ctx.Err() != nil {
		return skip(ErrCancelled)
	}
	if c.MinGeneration > 0 {
		var observed int64
		if e.ObservedGeneration != nil {
			observed = e.ObservedGeneration()
		}
		if c.MinGeneration > observed {
			return skip(ErrGeneration)
		}
	}
	ok, err := e.claim(c.Seq)
	if err != nil {
		return fail(fmt.Errorf("recording seq %d: %w", c.Seq, err))
	}
	if !ok { // another delivery of it claimed it meanwhile
		return skip(ErrAlreadyExecuted)
	}
	r := e.execute(ctx, c)
	r.Seq = c.Seq
	return r
}

func (e *Executor) execute(ctx context.Context, c Command) Result {
	var err error
	switch c.Kind {
	case KindExec:
		var a execArgs
		if err = strictArgs(c.Args, &a); err == nil {
			return runExec(ctx, a)
		}
	case KindCDIExpose:
		var a cdiExposeArgs
		if err = strictArgs(c.Args, &a); err == nil {
			err = e.expose(a)
		}
	case KindCDIWithdraw:
		var a cdiWithdrawArgs
		if err = strictArgs(c.Args, &a); err == nil {
			err = e.withdraw(a)
		}
	case KindInventoryRefresh:
		if e.RefreshInventory == nil {
			err = errors.New("this agent cannot refresh its inventory")
		} else {
			err = e.RefreshInventory(ctx)
		}
	case KindAgentUpdate:
		var a protocol.AgentUpdateArgs
		if err = strictArgs(c.Args, &a); err == nil {
			if e.AgentUpdate == nil {
				err = errors.New("this agent cannot update itself")
			} else {
				err = e.AgentUpdate(ctx, c.Seq, a)
			}
		}
	case KindReboot:
		if e.Simulate {
			return Result{State: Succeeded}
		}
		return runExec(ctx, execArgs{Argv: []string{"systemctl", "reboot"}})
	default:
		err = fmt.Errorf("unknown command kind %q", c.Kind)
	}
	if err != nil {
		return Result{State: Failed, Error: err.Error()}
	}
	return Result{State: Succeeded}
}

// strictArgs decodes args (none is {}) refusing unknown fields.
func strictArgs(raw json.RawMessage, v any) error {
	if len(strings.TrimSpace(string(raw))) == 0 || string(raw) == "null" {
		raw = json.RawMessage(`{}`)
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("bad args: %w", err)
	}
	return nil
}

// writeFileAtomic replaces dir/name with data: a temporary file in dir,
// written, fsynced and renamed over it, then dir fsynced.
func writeFileAtomic(dir, name string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // fails harmlessly once renamed
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
