package nodes

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// Command is a node command as the API returns it (docs/agent-protocol.md,
// "Commands"). Times are epoch milliseconds.
type Command struct {
	ID            string          `json:"id"`
	NodeID        string          `json:"nodeId"`
	TenantID      string          `json:"tenantId"`
	Seq           int64           `json:"seq"`
	Kind          string          `json:"kind"`
	Args          json.RawMessage `json:"args"`
	State         string          `json:"state"`
	NotBefore     *int64          `json:"notBefore,omitempty"`
	NotAfter      *int64          `json:"notAfter,omitempty"`
	MinGeneration *int64          `json:"minGeneration,omitempty"`
	ExitCode      *int            `json:"exitCode,omitempty"`
	Stdout        string          `json:"stdout"`
	Stderr        string          `json:"stderr"`
	Error         string          `json:"error"`
	Truncated     bool            `json:"truncated"`
	CreatedBy     string          `json:"createdBy"`
	CreatedAt     int64           `json:"createdAt"`
	DeliveredAt   *int64          `json:"deliveredAt,omitempty"`
	FinishedAt    *int64          `json:"finishedAt,omitempty"`
	// CancelRequestedAt: commands.cancel of a delivered command; the agent
	// is told to stop it, and its result is still recorded.
	CancelRequestedAt *int64 `json:"cancelRequestedAt,omitempty"`
}

// Bounds of a command's args and timing that depend on its kind or on the
// clock, so no input schema can say them.
const (
	maxExecTimeout  = 3600
	maxExecArgs     = 256
	maxExecArgBytes = 4096
	maxExecEnv      = 128
	maxCDIDevices   = 64
	// notBefore and notAfter at most this far ahead.
	maxCommandHorizon = 366 * 24 * time.Hour
)

var (
	envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	// cdiKindPattern is a CDI kind, vendor/class (the CDI spec's grammar).
	cdiKindPattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,61}[A-Za-z0-9])?/[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$`)
)

func commandOf(c store.NodeCommand) Command {
	args := c.Args
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	return Command{ID: c.ID, NodeID: c.NodeID, TenantID: c.TenantID, Seq: c.Seq, Kind: c.Kind, Args: args, State: c.State,
		NotBefore: msPtr(c.NotBefore), NotAfter: msPtr(c.NotAfter), MinGeneration: c.MinGeneration, ExitCode: c.ExitCode,
		Stdout: c.Stdout, Stderr: c.Stderr, Error: c.Error, Truncated: c.Truncated, CreatedBy: c.CreatedBy,
		CreatedAt: c.CreatedAt.UnixMilli(), DeliveredAt: msPtr(c.DeliveredAt), FinishedAt: msPtr(c.FinishedAt),
		CancelRequestedAt: msPtr(c.CancelRequestedAt)}
}

func commandsOf(rows []store.NodeCommand) []Command {
	out := make([]Command, len(rows))
	for i, r := range rows {
		out[i] = commandOf(r)
	}
	return out
}

// ExecArgs are an exec command's args: argv run directly (no shell), a
// timeout in seconds (default 60, at most 3600) and extra environment.
type ExecArgs struct {
	Argv           []string          `json:"argv"`
	TimeoutSeconds int64             `json:"timeoutSeconds,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
}

// CDIExposeArgs are a cdi.expose command's args as stored: the reservation
// whose devices the CDI spec names, the GPU indices (device ids are
// resolved to them) and the CDI kind (default nvidia.com/gpu).
type CDIExposeArgs struct {
	ReservationID string `json:"reservationId"`
	Devices       []int  `json:"devices"`
	Kind          string `json:"kind,omitempty"`
}

// CDIWithdrawArgs are a cdi.withdraw command's args.
type CDIWithdrawArgs struct {
	ReservationID string `json:"reservationId"`
}

// NewCommand is a command to queue. NotBefore and NotAfter are epoch
// milliseconds; with an IdempotencyKey, a retry answers the command that
// key queued.
type NewCommand struct {
	Kind           string
	Args           json.RawMessage
	NotBefore      *int64
	NotAfter       *int64
	MinGeneration  *int64
	IdempotencyKey string
	CreatedBy      string
}

// RunCommand queues a command for the tenant's live node. Its args are
// checked per kind; notBefore and notAfter bound when it may run, notAfter
// in the future and after notBefore, both within a year. The key with
// another request is CONFLICT.
func RunCommand(ctx context.Context, tx store.Tx, tenantID, nodeID string, in NewCommand) (Command, error) {
	now := time.Now()
	horizon := now.Add(maxCommandHorizon).UnixMilli()
	var notBefore, notAfter *time.Time
	if in.NotBefore != nil {
		if *in.NotBefore > horizon {
			return Command{}, badField("notBefore", "range", "notBefore must be epoch milliseconds within a year")
		}
		t := time.UnixMilli(*in.NotBefore)
		notBefore = &t
	}
	if in.NotAfter != nil {
		if *in.NotAfter <= now.UnixMilli() {
			return Command{}, badField("notAfter", "past", "notAfter is in the past")
		}
		if *in.NotAfter > horizon {
			return Command{}, badField("notAfter", "range", "notAfter must be within a year")
		}
		if in.NotBefore != nil && *in.NotAfter <= *in.NotBefore {
			return Command{}, badField("notAfter", "range", "notAfter must be after notBefore")
		}
		t := time.UnixMilli(*in.NotAfter)
		notAfter = &t
	}
	n, err := Get(ctx, tx, tenantID, nodeID, false)
	if err != nil {
		return Command{}, err
	}
	if n.Adapter != "bcd/v1" {
		return Command{}, core.Errorf(core.CodeInvalidState, "node %s runs no node agent (adapter %s): it takes no commands", n.ID, n.Adapter).
			WithDetails(map[string]any{"reason": "adapter"})
	}
	if err := notSiteNode(n, "sent commands"); err != nil {
		return Command{}, err
	}
	args, err := commandArgs(ctx, tx, n.ID, in.Kind, in.Args)
	if err != nil {
		return Command{}, err
	}
	rawArgs, err := json.Marshal(args)
	if err != nil {
		return Command{}, err
	}
	want := store.NodeCommand{NodeID: n.ID, TenantID: n.TenantID, Kind: in.Kind, Args: rawArgs, NotBefore: notBefore,
		NotAfter: notAfter, MinGeneration: in.MinGeneration, CreatedBy: in.CreatedBy}
	got, err := store.QueueNodeCommand(ctx, tx, want, in.IdempotencyKey)
	if err != nil {
		return Command{}, err
	}
	if in.IdempotencyKey != "" && !sameCommand(got, want) {
		return Command{}, core.Errorf(core.CodeConflict, "idempotencyKey %q was used with another request", in.IdempotencyKey).
			WithDetails(map[string]any{"field": "idempotencyKey", "commandId": got.ID})
	}
	return commandOf(got), nil
}

// GetCommand reads a command of the tenant's live node.
func GetCommand(ctx context.Context, tx store.Tx, tenantID, nodeID, id string) (Command, error) {
	if _, err := Get(ctx, tx, tenantID, nodeID, false); err != nil {
		return Command{}, err
	}
	cmd, err := store.GetNodeCommand(ctx, tx, tenantID, nodeID, id)
	if err != nil {
		return Command{}, err
	}
	return commandOf(cmd), nil
}

// ListCommands answers the commands of the tenant's live node, newest
// first (by seq), in state when given: the page's rows after its key, plus
// one.
func ListCommands(ctx context.Context, tx store.Tx, tenantID, nodeID, state string, page store.PageQuery) ([]Command, error) {
	if _, err := Get(ctx, tx, tenantID, nodeID, false); err != nil {
		return nil, err
	}
	rows, err := store.ListNodeCommands(ctx, tx, tenantID, nodeID, state, page)
	if err != nil {
		return nil, err
	}
	return commandsOf(rows), nil
}

// CancelCommand cancels a command of the tenant's live node: a queued one
// at once; a delivered or running one is recorded cancelled with
// cancelRequestedAt, and the node's session tells the agent to stop it. A
// cancelled one is answered unchanged; a finished one is INVALID_STATE.
func CancelCommand(ctx context.Context, tx store.Tx, tenantID, nodeID, id string) (Command, error) {
	if _, err := Get(ctx, tx, tenantID, nodeID, false); err != nil {
		return Command{}, err
	}
	cmd, err := store.CancelNodeCommand(ctx, tx, tenantID, nodeID, id)
	if err != nil {
		return Command{}, err
	}
	return commandOf(cmd), nil
}

// sameCommand reports whether a command queued under an idempotency key is
// the one want asks for.
func sameCommand(have, want store.NodeCommand) bool {
	var a, b any
	if json.Unmarshal(have.Args, &a) != nil || json.Unmarshal(want.Args, &b) != nil {
		return false
	}
	sameTime := func(x, y *time.Time) bool {
		return (x == nil) == (y == nil) && (x == nil || x.UnixMilli() == y.UnixMilli())
	}
	sameGen := (have.MinGeneration == nil) == (want.MinGeneration == nil) &&
		(have.MinGeneration == nil || *have.MinGeneration == *want.MinGeneration)
	return have.Kind == want.Kind && reflect.DeepEqual(a, b) && sameTime(have.NotBefore, want.NotBefore) &&
		sameTime(have.NotAfter, want.NotAfter) && sameGen
}

// argsObject reads args as an object whose keys are exactly among allowed
// (encoding/json would match them case-insensitively).
func argsObject(raw json.RawMessage, allowed ...string) (map[string]json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return map[string]json.RawMessage{}, nil
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, badField("args", "type", "args must be an object")
	}
	for k := range obj {
		if !slices.Contains(allowed, k) {
			return nil, badField("args."+k, "unknown", "args of this kind have no field %q", k)
		}
	}
	return obj, nil
}

func argField(obj map[string]json.RawMessage, name string, v any, required bool) (bool, error) {
	raw, ok := obj[name]
	if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		if required {
			return false, badField("args."+name, "required", "args.%s is required", name)
		}
		return false, nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return false, badField("args."+name, "type", "args.%s has the wrong type", name)
	}
	return true, nil
}

// commandArgs checks a kind's args and answers them as stored. cdi.expose's
// device ids are resolved to their GPU's index on the node.
func commandArgs(ctx context.Context, tx store.Tx, nodeID, kind string, raw json.RawMessage) (any, error) {
	switch kind {
	case store.CommandExec:
		obj, err := argsObject(raw, "argv", "timeoutSeconds", "env")
		if err != nil {
			return nil, err
		}
		var a ExecArgs
		if _, err := argField(obj, "argv", &a.Argv, true); err != nil {
			return nil, err
		}
		if len(a.Argv) == 0 || a.Argv[0] == "" || len(a.Argv) > maxExecArgs {
			return nil, badField("args.argv", "range", "args.argv must hold 1 to %d arguments, the first not empty", maxExecArgs)
		}
		for _, arg := range a.Argv {
			if len(arg) > maxExecArgBytes || strings.ContainsRune(arg, 0) {
				return nil, badField("args.argv", "range", "an argument is at most %d bytes, without NUL", maxExecArgBytes)
			}
		}
		if ok, err := argField(obj, "timeoutSeconds", &a.TimeoutSeconds, false); err != nil {
			return nil, err
		} else if ok && (a.TimeoutSeconds < 1 || a.TimeoutSeconds > maxExecTimeout) {
			return nil, badField("args.timeoutSeconds", "range", "args.timeoutSeconds must be in [1, %d]", maxExecTimeout)
		}
		if _, err := argField(obj, "env", &a.Env, false); err != nil {
			return nil, err
		}
		if len(a.Env) > maxExecEnv {
			return nil, badField("args.env", "range", "args.env has at most %d variables", maxExecEnv)
		}
		for k, v := range a.Env {
			if !envNamePattern.MatchString(k) || len(v) > maxExecArgBytes || strings.ContainsRune(v, 0) {
				return nil, badField("args.env", "pattern", "args.env: %q is not a variable name, or its value is too long", k)
			}
		}
		return a, nil
	case store.CommandCDIExpose:
		obj, err := argsObject(raw, "reservationId", "devices", "kind")
		if err != nil {
			return nil, err
		}
		var a CDIExposeArgs
		if err := reservationArg(obj, &a.ReservationID); err != nil {
			return nil, err
		}
		var devices []json.RawMessage
		if _, err := argField(obj, "devices", &devices, true); err != nil {
			return nil, err
		}
		if len(devices) == 0 || len(devices) > maxCDIDevices {
			return nil, badField("args.devices", "range", "args.devices must name 1 to %d devices", maxCDIDevices)
		}
		seen := map[int]bool{}
		for _, d := range devices {
			idx, err := gpuIndex(ctx, tx, nodeID, d)
			if err != nil {
				return nil, err
			}
			if seen[idx] {
				return nil, badField("args.devices", "duplicate", "args.devices names GPU %d twice", idx)
			}
			seen[idx] = true
			a.Devices = append(a.Devices, idx)
		}
		if _, err := argField(obj, "kind", &a.Kind, false); err != nil {
			return nil, err
		}
		if a.Kind != "" && !cdiKindPattern.MatchString(a.Kind) {
			return nil, badField("args.kind", "pattern", "args.kind must be a CDI kind, vendor/class (nvidia.com/gpu)")
		}
		return a, nil
	case store.CommandCDIWithdraw:
		obj, err := argsObject(raw, "reservationId")
		if err != nil {
			return nil, err
		}
		var a CDIWithdrawArgs
		return a, reservationArg(obj, &a.ReservationID)
	case store.CommandInventoryRefresh, store.CommandReboot:
		if _, err := argsObject(raw); err != nil {
			return nil, err
		}
		return struct{}{}, nil
	}
	return nil, badField("kind", "enum", "kind %q is not a command kind", kind)
}

func reservationArg(obj map[string]json.RawMessage, id *string) error {
	if _, err := argField(obj, "reservationId", id, true); err != nil {
		return err
	}
	if !core.ValidID("rsv", *id) {
		return badField("args.reservationId", "pattern", "args.reservationId must be a reservation id")
	}
	return nil
}

// gpuIndex reads one of cdi.expose's devices: a GPU index (a non-negative
// integer) or the id of one of the node's live GPU devices (a MIG or
// shared slot is its parent GPU's), answered as the GPU's index.
func gpuIndex(ctx context.Context, tx store.Tx, nodeID string, raw json.RawMessage) (int, error) {
	var idx int
	if json.Unmarshal(raw, &idx) == nil {
		if idx < 0 || idx > 1023 {
			return 0, badField("args.devices", "range", "a GPU index is in [0, 1023]")
		}
		return idx, nil
	}
	var id string
	if json.Unmarshal(raw, &id) != nil || id == "" || len(id) > 256 {
		return 0, badField("args.devices", "type", "args.devices holds GPU indices or device ids")
	}
	indexes, err := store.GPUIndexes(ctx, tx, nodeID, []string{id})
	if err != nil {
		return 0, err
	}
	return indexes[0], nil
}

// batchKinds are the kinds a command batch may run: those whose arguments
// name nothing of one node (cdi.* name a node's devices and reservations;
// agent.update is a rollout's).
var batchKinds = []string{store.CommandExec, store.CommandReboot, store.CommandInventoryRefresh}

// BatchCommandArgs checks the args of a command a batch runs on many nodes,
// as commands.run does, and answers them normalized: the fields of an
// INVALID_INPUT name the argument ("args.argv").
func BatchCommandArgs(kind string, raw json.RawMessage) (json.RawMessage, error) {
	if !slices.Contains(batchKinds, kind) {
		return nil, badField("kind", "enum", "a batch runs %s commands, not %q", strings.Join(batchKinds, ", "), kind)
	}
	args, err := commandArgs(context.Background(), nil, "", kind, raw)
	if err != nil {
		return nil, err
	}
	return json.Marshal(args)
}
