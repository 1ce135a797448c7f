package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
)

// Node commands (migrations/00015_node_commands.sql): durable, idempotent
// one-shot messages to one node's agent, numbered per node by seq. They are
// delivered at least once (every session sends the queued and delivered
// ones after the agent's lastExecutedSeq) and executed at most once (the
// agent records a seq before running it and never runs one at or below it).

// NodeCommandsChannel is the channel a new or cancelled command notifies;
// the payload is the node id.
const NodeCommandsChannel = "node_commands"

// Node command kinds: the protocol's, as the column holds them.
const (
	CommandExec             = string(protocol.CommandExec)
	CommandCDIExpose        = string(protocol.CommandCDIExpose)
	CommandCDIWithdraw      = string(protocol.CommandCDIWithdraw)
	CommandInventoryRefresh = string(protocol.CommandInventoryRefresh)
	CommandReboot           = string(protocol.CommandReboot)
	CommandAgentUpdate      = string(protocol.CommandAgentUpdate)
)

// CommandKinds are every kind, as the table's CHECK lists them.
var CommandKinds = []string{CommandExec, CommandCDIExpose, CommandCDIWithdraw, CommandInventoryRefresh, CommandReboot, CommandAgentUpdate}

// Node command states: the protocol's, as the column holds them.
const (
	CommandQueued    = string(protocol.CommandQueued)
	CommandDelivered = string(protocol.CommandDelivered)
	CommandRunning   = string(protocol.CommandRunning)
	CommandSucceeded = string(protocol.CommandSucceeded)
	CommandFailed    = string(protocol.CommandFailed)
	CommandSkipped   = string(protocol.CommandSkipped)
	CommandCancelled = string(protocol.CommandCancelled)
	CommandExpired   = string(protocol.CommandExpired)
)

// CommandStates are every state, as the table's CHECK lists them.
var CommandStates = []string{CommandQueued, CommandDelivered, CommandRunning, CommandSucceeded, CommandFailed,
	CommandSkipped, CommandCancelled, CommandExpired}

// Output limits: stdout and stderr at most MaxCommandOutput bytes each, the
// error at most MaxCommandError; RecordNodeCommandResult truncates longer
// ones (and sets Truncated).
const (
	MaxCommandOutput = 64 << 10
	MaxCommandError  = 4 << 10
)

// NodeCommand is a node_commands row.
type NodeCommand struct {
	NodeID        string
	Seq           int64
	ID            string // cmd_<ULID>
	TenantID      string
	Kind          string
	State         string
	Args          json.RawMessage // a JSON object; nil is {}
	NotBefore     *time.Time
	NotAfter      *time.Time
	MinGeneration *int64
	ExitCode      *int
	Stdout        string
	Stderr        string
	Error         string
	Truncated     bool
	CreatedBy     string
	CreatedAt     time.Time
	DeliveredAt   *time.Time
	FinishedAt    *time.Time
	// CancelRequestedAt is when commands.cancel asked a delivered or running
	// command to stop; the session owes the agent a cancel frame.
	CancelRequestedAt *time.Time
}

// NodeCommandResult is the agent's result frame.
type NodeCommandResult struct {
	State     string // succeeded, failed or skipped
	ExitCode  *int
	Stdout    string
	Stderr    string
	Error     string
	Truncated bool
}

const nodeCommandColumns = `c.node_id, c.seq, c.id, c.tenant_id, c.kind, c.state, c.args, c.not_before, c.not_after,
	c.min_generation, c.exit_code, c.stdout, c.stderr, c.error, c.truncated, c.created_by, c.created_at,
	c.delivered_at, c.finished_at, c.cancel_requested_at`

func scanNodeCommand(row pgx.Row) (NodeCommand, error) {
	var c NodeCommand
	var args []byte
	err := row.Scan(&c.NodeID, &c.Seq, &c.ID, &c.TenantID, &c.Kind, &c.State, &args, &c.NotBefore, &c.NotAfter,
		&c.MinGeneration, &c.ExitCode, &c.Stdout, &c.Stderr, &c.Error, &c.Truncated, &c.CreatedBy, &c.CreatedAt,
		&c.DeliveredAt, &c.FinishedAt, &c.CancelRequestedAt)
	c.Args = json.RawMessage(args)
	return c, err
}

func collectNodeCommands(rows pgx.Rows, err error) ([]NodeCommand, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (NodeCommand, error) { return scanNodeCommand(r) })
}

func commandNotFound(id string) error {
	return core.Errorf(core.CodeNotFound, "command %s not found", id)
}

// QueueNodeCommand records a command for c.NodeID (a live node; the caller
// has checked its tenant) and answers it queued, with its id and the node's
// next seq. c's NodeID, TenantID, Kind, Args, NotBefore, NotAfter,
// MinGeneration and CreatedBy are read; the rest is assigned. With an
// idempotency key, a command the node already has under that key is
// answered instead, unchanged (the caller compares it with the request).
// The node's row is locked, so seqs are taken in commit order, without gaps.
func QueueNodeCommand(ctx context.Context, tx Tx, c NodeCommand, idempotencyKey string) (NodeCommand, error) {
	args := c.Args
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	var seq int64
	err := tx.QueryRow(ctx, `SELECT command_seq FROM nodes WHERE id = $1 AND deleted_at IS NULL FOR UPDATE`, c.NodeID).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return NodeCommand{}, core.Errorf(core.CodeNotFound, "node %s not found", c.NodeID)
	}
	if err != nil {
		return NodeCommand{}, err
	}
	if idempotencyKey != "" {
		// Under the node's lock: a concurrent insert with this key has
		// committed (or rolled back) by now.
		have, err := scanNodeCommand(tx.QueryRow(ctx, `SELECT `+nodeCommandColumns+` FROM node_commands c
			WHERE c.node_id = $1 AND c.idempotency_key = $2`, c.NodeID, idempotencyKey))
		if err == nil || !errors.Is(err, pgx.ErrNoRows) {
			return have, err
		}
	}
	if err := tx.QueryRow(ctx, `UPDATE nodes SET command_seq = command_seq + 1 WHERE id = $1 RETURNING command_seq`,
		c.NodeID).Scan(&seq); err != nil {
		return NodeCommand{}, err
	}
	return scanNodeCommand(tx.QueryRow(ctx, `INSERT INTO node_commands AS c
		(node_id, seq, id, tenant_id, kind, args, not_before, not_after, min_generation, created_by, idempotency_key)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULLIF($11, '')) RETURNING `+nodeCommandColumns,
		c.NodeID, seq, core.NewID("cmd"), c.TenantID, c.Kind, []byte(args), c.NotBefore, c.NotAfter, c.MinGeneration,
		c.CreatedBy, idempotencyKey))
}

// PendingNodeCommands answers the node's commands a session delivers: queued
// or delivered, seq after afterSeq, not_before reached (or none), by seq, at
// most limit. It first marks the queued and delivered commands whose
// not_after has passed expired: they are never delivered (again).
func PendingNodeCommands(ctx context.Context, tx Tx, nodeID string, afterSeq int64, limit int) ([]NodeCommand, error) {
	if limit < 1 {
		return nil, fmt.Errorf("store: pending commands limit %d", limit)
	}
	if _, err := tx.Exec(ctx, `UPDATE node_commands SET state = 'expired', finished_at = now()
		WHERE node_id = $1 AND state IN ('queued', 'delivered') AND not_after <= now()`, nodeID); err != nil {
		return nil, err
	}
	return collectNodeCommands(tx.Query(ctx, `SELECT `+nodeCommandColumns+` FROM node_commands c
		WHERE c.node_id = $1 AND c.state IN ('queued', 'delivered') AND c.seq > $2
		  AND (c.not_before IS NULL OR c.not_before <= now())
		ORDER BY c.seq LIMIT $3`, nodeID, afterSeq, limit))
}

// MarkNodeCommandsDelivered records that the session sent the node these
// commands: queued ones become delivered; a redelivery keeps the first
// delivered_at; other states are left alone.
func MarkNodeCommandsDelivered(ctx context.Context, tx Tx, nodeID string, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, `UPDATE node_commands SET state = 'delivered', delivered_at = coalesce(delivered_at, now())
		WHERE node_id = $1 AND seq = ANY($2) AND state = 'queued'`, nodeID, seqs)
	return err
}

// RecordNodeCommandResult records the agent's result for the node's seq.
// It is idempotent: a command keeps its first result, and a result for one
// that already has one (a result frame sent again) changes nothing. A
// cancelled command stays cancelled but takes the output; an expired one
// that had been delivered takes the result's state (the agent ran or
// refused it before the server expired it). Outputs longer than
// MaxCommandOutput bytes (MaxCommandError for the error) are truncated,
// at a character boundary, with Truncated set; invalid UTF-8 and NUL bytes,
// which text cannot hold, become U+FFFD. An unknown seq is NOT_FOUND.
func RecordNodeCommandResult(ctx context.Context, tx Tx, nodeID string, seq int64, r NodeCommandResult) error {
	switch r.State {
	case CommandSucceeded, CommandFailed, CommandSkipped:
	default:
		return core.Errorf(core.CodeInvalidInput, "command result state %q is not succeeded, failed or skipped", r.State)
	}
	stdout, t1 := clipText(r.Stdout, MaxCommandOutput)
	stderr, t2 := clipText(r.Stderr, MaxCommandOutput)
	errText, _ := clipText(r.Error, MaxCommandError)
	tag, err := tx.Exec(ctx, `UPDATE node_commands SET
			state = CASE WHEN state = 'cancelled' THEN state ELSE $3 END,
			exit_code = $4, stdout = $5, stderr = $6, error = $7, truncated = $8,
			result_at = now(), finished_at = coalesce(finished_at, now())
		WHERE node_id = $1 AND seq = $2 AND result_at IS NULL
		  AND (state IN ('queued', 'delivered', 'running') OR (state IN ('cancelled', 'expired') AND delivered_at IS NOT NULL))`,
		nodeID, seq, r.State, r.ExitCode, stdout, stderr, errText, r.Truncated || t1 || t2)
	if err != nil || tag.RowsAffected() == 1 {
		return err
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM node_commands WHERE node_id = $1 AND seq = $2)`,
		nodeID, seq).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		return core.Errorf(core.CodeNotFound, "node %s has no command %d", nodeID, seq)
	}
	return nil
}

// clipText makes s storable as text (valid UTF-8, no NUL) and at most max
// bytes, cut at a character boundary; it reports whether it cut.
func clipText(s string, max int) (string, bool) {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) <= max {
		return s, false
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut], true
}

// GetNodeCommand reads a command of the tenant's node; any other is
// NOT_FOUND.
func GetNodeCommand(ctx context.Context, tx Tx, tenantID, nodeID, id string) (NodeCommand, error) {
	c, err := scanNodeCommand(tx.QueryRow(ctx, `SELECT `+nodeCommandColumns+` FROM node_commands c
		WHERE c.id = $1 AND c.node_id = $2 AND c.tenant_id = $3`, id, nodeID, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return NodeCommand{}, commandNotFound(id)
	}
	return c, err
}

// ListNodeCommands reads the commands of the tenant's node, newest (highest
// seq) first, in state when it is not "": the page's rows below its key's
// Seq, plus one.
func ListNodeCommands(ctx context.Context, tx Tx, tenantID, nodeID, state string, page PageQuery) ([]NodeCommand, error) {
	if page.Limit < 1 {
		return nil, fmt.Errorf("store: command limit %d", page.Limit)
	}
	return collectNodeCommands(tx.Query(ctx, `SELECT `+nodeCommandColumns+` FROM node_commands c
		WHERE c.node_id = $1 AND c.tenant_id = $2 AND ($3 = '' OR c.state = $3) AND ($5 OR c.seq < $6)
		ORDER BY c.seq DESC LIMIT $4`, nodeID, tenantID, state, page.Fetch(), page.First(), page.AfterKey().Seq))
}

// CancelNodeCommand cancels a command of the tenant's node. A queued one is
// cancelled and finished at once. A delivered or running one is cancelled
// with cancel_requested_at set: the session sends the agent a cancel frame
// (CancelRequestedNodeCommands), and the agent's result is still recorded.
// Cancelling a cancelled command answers it unchanged; a finished one
// (succeeded, failed, skipped, expired) is INVALID_STATE.
func CancelNodeCommand(ctx context.Context, tx Tx, tenantID, nodeID, id string) (NodeCommand, error) {
	c, err := scanNodeCommand(tx.QueryRow(ctx, `SELECT `+nodeCommandColumns+` FROM node_commands c
		WHERE c.id = $1 AND c.node_id = $2 AND c.tenant_id = $3 FOR UPDATE`, id, nodeID, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return NodeCommand{}, commandNotFound(id)
	}
	if err != nil {
		return NodeCommand{}, err
	}
	switch c.State {
	case CommandCancelled:
		return c, nil
	case CommandQueued:
		return scanNodeCommand(tx.QueryRow(ctx, `UPDATE node_commands c SET state = 'cancelled', finished_at = now()
			WHERE c.node_id = $1 AND c.seq = $2 RETURNING `+nodeCommandColumns, c.NodeID, c.Seq))
	case CommandDelivered, CommandRunning:
		return scanNodeCommand(tx.QueryRow(ctx, `UPDATE node_commands c SET state = 'cancelled', cancel_requested_at = now()
			WHERE c.node_id = $1 AND c.seq = $2 RETURNING `+nodeCommandColumns, c.NodeID, c.Seq))
	}
	return NodeCommand{}, core.Errorf(core.CodeInvalidState, "command %s is %s: it cannot be cancelled", id, c.State).
		WithDetails(map[string]any{"reason": c.State})
}

// CancelRequestedNodeCommands answers the seqs of the node's commands
// cancelled after delivery whose result has not come yet, ascending: a
// session sends each a cancel frame (again after a reconnect).
func CancelRequestedNodeCommands(ctx context.Context, tx Tx, nodeID string) ([]int64, error) {
	rows, err := tx.Query(ctx, `SELECT seq FROM node_commands
		WHERE node_id = $1 AND state = 'cancelled' AND cancel_requested_at IS NOT NULL AND result_at IS NULL
		ORDER BY seq`, nodeID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// GPUIndexes answers, for each of a node's device ids, its GPU's index on
// the node (a MIG instance or shared slot is its parent GPU's), as the
// cdi.expose command names devices. An id that is not one of the node's
// live GPU devices is INVALID_INPUT.
func GPUIndexes(ctx context.Context, tx Tx, nodeID string, deviceIDs []string) ([]int, error) {
	out := make([]int, len(deviceIDs))
	for i, id := range deviceIDs {
		var index *string
		err := tx.QueryRow(ctx, `SELECT coalesce(p.attributes->>'index', d.attributes->>'index')
			FROM devices d LEFT JOIN devices p ON p.node_id = d.node_id AND p.device_id = d.parent AND d.parent <> ''
			WHERE d.node_id = $1 AND d.device_id = $2 AND d.removed_at IS NULL AND d.class IN ('gpu', 'gpu.mig', 'gpu.slot')`,
			nodeID, id).Scan(&index)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && index == nil) {
			return nil, core.Errorf(core.CodeInvalidInput, "the node has no GPU device %q", id).
				WithDetails(map[string]any{"field": "args.devices", "reason": "unknown"})
		}
		if err != nil {
			return nil, err
		}
		n, err := strconv.Atoi(*index)
		if err != nil || n < 0 {
			return nil, core.Errorf(core.CodeInvalidInput, "GPU device %q has no index", id).
				WithDetails(map[string]any{"field": "args.devices", "reason": "unknown"})
		}
		out[i] = n
	}
	return out, nil
}

// NodeCommandBySeq reads the node's command seq; a missing one is
// NOT_FOUND.
func NodeCommandBySeq(ctx context.Context, tx Tx, nodeID string, seq int64) (NodeCommand, error) {
	c, err := scanNodeCommand(tx.QueryRow(ctx, `SELECT `+nodeCommandColumns+` FROM node_commands c
		WHERE c.node_id = $1 AND c.seq = $2`, nodeID, seq))
	if errors.Is(err, pgx.ErrNoRows) {
		return NodeCommand{}, core.Errorf(core.CodeNotFound, "node %s has no command %d", nodeID, seq)
	}
	return c, err
}
