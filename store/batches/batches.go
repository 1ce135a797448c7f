// Package batches holds the command batches domain's SQL
// (docs/command-batches.md): a batch of commands over an exact node list
// frozen at create, its approvals, its cancellation and the step its
// workflow repeats to run it wave by wave. The rules that need no I/O
// (destructive kinds, the digest, the quorum, signatures) are core/batches.
package batches

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	corebatches "github.com/better-compute/better-compute/core/batches"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/nodes"
)

// Prefix is a batch id's.
const Prefix = "batch"

// Batch states.
const (
	AwaitingApproval = "awaitingApproval"
	Running          = "running"
	Succeeded        = "succeeded"
	Failed           = "failed"
	Cancelled        = "cancelled"
)

// Node states.
const (
	NodePending   = "pending"
	NodeRunning   = "running"
	NodeSucceeded = "succeeded"
	NodeFailed    = "failed"
	NodeSkipped   = "skipped"
	NodeCancelled = "cancelled"
)

// Limits and defaults.
const (
	MaxCommands        = 16
	MaxNodes           = 10000
	MaxQuorum          = 10
	DefaultQuorum      = 2 // a destructive batch's, when the input names none
	DefaultConcurrency = 10
	MaxConcurrency     = 1000
	DefaultNodeTimeout = 15 * time.Minute
	DefaultApprovalTTL = 24 * time.Hour
)

// Selection names the tenant's nodes a batch runs on: those of a pool,
// carrying every label, among the ids given (each part optional, one at
// least). Only live node-agent nodes that are not site agents are chosen.
type Selection struct {
	PoolID  string            `json:"poolId,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	NodeIDs []string          `json:"nodeIds,omitempty"`
}

// Approval is one recorded approval.
type Approval struct {
	Approver       string `json:"approver"`
	Digest         string `json:"digest"`
	KeyFingerprint string `json:"keyFingerprint"`
	ApprovedAt     int64  `json:"approvedAt"`
	ExpiresAt      int64  `json:"expiresAt"`
}

// Batch is a command_batches row, with its approvals and its nodes'
// counts per state (and, from Get, its nodes with their results).
type Batch struct {
	ID                 string                `json:"id"`
	TenantID           string                `json:"tenantId"`
	Description        string                `json:"description,omitempty"`
	State              string                `json:"state"`
	Reason             string                `json:"reason,omitempty"`
	Commands           []corebatches.Command `json:"commands"`
	Selection          Selection             `json:"selection"`
	Digest             string                `json:"digest"`
	Quorum             int                   `json:"quorum"`
	Concurrency        int                   `json:"concurrency"`
	MaxFailures        int                   `json:"maxFailures"`
	NodeTimeoutSeconds int                   `json:"nodeTimeoutSeconds"`
	ApprovalTTLSeconds int                   `json:"approvalTtlSeconds"`
	Wave               int                   `json:"wave"`
	Waves              int                   `json:"waves"`
	NodeIDs            []string              `json:"nodeIds"`
	Approvals          []Approval            `json:"approvals"`
	Counts             map[string]int        `json:"counts"`
	CreatedBy          string                `json:"createdBy"`
	CreatedAt          int64                 `json:"createdAt"`
	UpdatedAt          int64                 `json:"updatedAt"`
	StartedAt          *int64                `json:"startedAt,omitempty"`
	EndedAt            *int64                `json:"endedAt,omitempty"`
	Nodes              []Node                `json:"nodes,omitempty"`
}

// Node is one node of a batch with each command's result so far.
type Node struct {
	NodeID  string          `json:"nodeId"`
	Wave    int             `json:"wave"`
	State   string          `json:"state"`
	Results []CommandResult `json:"results"`
	Error   string          `json:"error,omitempty"`
}

// CommandResult is what one command did on one node (its output is the
// command's: commands.get).
type CommandResult struct {
	Kind      string `json:"kind"`
	CommandID string `json:"commandId"`
	State     string `json:"state"`
	ExitCode  *int   `json:"exitCode,omitempty"`
	Error     string `json:"error,omitempty"`
}

func notFound(id string) error {
	return core.Errorf(core.CodeNotFound, "command batch %s not found", id)
}

func invalidState(reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidState, format, args...).WithDetails(map[string]any{"reason": reason})
}

func badField(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

// Resolve answers the exact, sorted node list sel names in tenantID now. A
// selection naming nothing is INVALID_INPUT; a pool or a named node the
// tenant does not have is NOT_FOUND; an empty result INVALID_STATE
// (emptySelection); more than MaxNodes INVALID_INPUT.
func Resolve(ctx context.Context, tx store.DBTX, tenantID string, sel Selection) ([]string, error) {
	if sel.PoolID == "" && len(sel.Labels) == 0 && len(sel.NodeIDs) == 0 {
		return nil, badField("selection", "required", "selection names a pool, labels or node ids")
	}
	for i, id := range sel.NodeIDs {
		if !core.ValidID("node", id) {
			return nil, badField(fmt.Sprintf("selection.nodeIds.%d", i), "pattern", "selection.nodeIds holds node ids (node_…)")
		}
	}
	if sel.PoolID != "" {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM pools WHERE id = $1 AND tenant_id = $2 AND archived_at IS NULL`, sel.PoolID, tenantID).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, core.Errorf(core.CodeNotFound, "pool %s not found", sel.PoolID)
		}
		if err != nil {
			return nil, err
		}
	}
	ids, err := resolve(ctx, tx, tenantID, sel)
	if err != nil {
		return nil, err
	}
	for _, want := range sel.NodeIDs {
		if _, found := slices.BinarySearch(ids, want); !found && len(sel.Labels) == 0 && sel.PoolID == "" {
			return nil, core.Errorf(core.CodeNotFound, "node %s not found (or it takes no commands)", want).
				WithDetails(map[string]any{"field": "selection.nodeIds"})
		}
	}
	switch {
	case len(ids) == 0:
		return nil, invalidState("emptySelection", "the selection names no node that takes commands")
	case len(ids) > MaxNodes:
		return nil, badField("selection", "range", "the selection names %d nodes, more than a batch's %d", len(ids), MaxNodes)
	}
	return ids, nil
}

// resolve is the selection's query: live node-agent nodes of the tenant
// that are not site agents, sorted by id.
func resolve(ctx context.Context, tx store.DBTX, tenantID string, sel Selection) ([]string, error) {
	labels := sel.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	rawLabels, err := json.Marshal(labels)
	if err != nil {
		return nil, err
	}
	ids := sel.NodeIDs
	if ids == nil {
		ids = []string{}
	}
	rows, err := tx.Query(ctx, `SELECT id FROM nodes WHERE tenant_id = $1 AND deleted_at IS NULL AND adapter = 'bcd/v1'
		AND role <> 'site' AND ($2 = '' OR pool_id = $2) AND labels @> $3 AND (cardinality($4::text[]) = 0 OR id = ANY($4))
		ORDER BY id LIMIT $5`, tenantID, sel.PoolID, rawLabels, ids, MaxNodes+1)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// CreateRequest is one commandBatches.create.
type CreateRequest struct {
	TenantID    string
	Description string
	Commands    []corebatches.Command
	Selection   Selection
	// Quorum nil: DefaultQuorum for a destructive batch, 0 otherwise.
	Quorum      *int
	Concurrency int
	MaxFailures int
	NodeTimeout time.Duration
	ApprovalTTL time.Duration
	Caller      store.Caller
}

// Create records a batch over the exact node list its selection resolves
// to now, with its digest. A destructive batch (corebatches.NeedsQuorum)
// needs a quorum of at least one approver besides its creator and waits
// for it (awaitingApproval); another runs at once unless it asks for a
// quorum.
func Create(ctx context.Context, tx store.Tx, r CreateRequest) (Batch, error) {
	if len(r.Commands) == 0 || len(r.Commands) > MaxCommands {
		return Batch{}, badField("commands", "range", "a batch runs 1 to %d commands", MaxCommands)
	}
	cmds := make([]corebatches.Command, len(r.Commands))
	for i, c := range r.Commands {
		args, err := nodes.BatchCommandArgs(c.Kind, c.Args)
		if err != nil {
			return Batch{}, inCommand(i, err)
		}
		cmds[i] = corebatches.Command{Kind: c.Kind, Args: args}
	}
	b := corebatches.Batch{ID: core.NewID(Prefix), TenantID: r.TenantID, Commands: cmds}
	switch {
	case r.Quorum != nil:
		b.Quorum = *r.Quorum
	case corebatches.NeedsQuorum(b):
		b.Quorum = DefaultQuorum
	}
	if b.Quorum < 0 || b.Quorum > MaxQuorum {
		return Batch{}, badField("quorum", "range", "quorum is 0 to %d approvers", MaxQuorum)
	}
	if b.Quorum == 0 && corebatches.NeedsQuorum(b) {
		return Batch{}, badField("quorum", "destructive", "a batch of destructive commands (exec, reboot) needs a quorum of at least one approver")
	}
	ids, err := Resolve(ctx, tx, r.TenantID, r.Selection)
	if err != nil {
		return Batch{}, err
	}
	b.Nodes = ids
	digest, err := corebatches.Digest(b)
	if err != nil {
		return Batch{}, err
	}
	concurrency := r.Concurrency
	if concurrency == 0 {
		concurrency = DefaultConcurrency
	}
	timeout, ttl := r.NodeTimeout, r.ApprovalTTL
	if timeout == 0 {
		timeout = DefaultNodeTimeout
	}
	if ttl == 0 {
		ttl = DefaultApprovalTTL
	}
	state := AwaitingApproval
	if b.Quorum == 0 {
		state = Running
	}
	rawCmds, err := json.Marshal(cmds)
	if err != nil {
		return Batch{}, err
	}
	rawSel, err := json.Marshal(r.Selection)
	if err != nil {
		return Batch{}, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO command_batches (id, tenant_id, state, description, commands, selection, nodes,
			digest, quorum, concurrency, max_failures, node_timeout_s, approval_ttl_s, created_by, creator, started_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, CASE WHEN $3 = 'running' THEN now() END)`,
		b.ID, r.TenantID, state, r.Description, rawCmds, rawSel, ids, digest, b.Quorum, concurrency, r.MaxFailures,
		int(timeout/time.Second), int(ttl/time.Second), r.Caller.IdentityID, r.Caller); err != nil {
		return Batch{}, err
	}
	waves := make([]int, len(ids))
	for i := range ids {
		waves[i] = i / concurrency
	}
	if _, err := tx.Exec(ctx, `INSERT INTO command_batch_nodes (batch_id, node_id, wave)
		SELECT $1, n, w FROM unnest($2::text[], $3::int[]) AS u(n, w)`, b.ID, ids, waves); err != nil {
		return Batch{}, err
	}
	return Get(ctx, tx, r.TenantID, b.ID, false)
}

// inCommand names command i in an INVALID_INPUT's field.
func inCommand(i int, err error) error {
	ce := core.AsError(err)
	if ce == nil || ce.Code != core.CodeInvalidInput {
		return err
	}
	details := map[string]any{}
	for k, v := range ce.Details {
		details[k] = v
	}
	field, _ := details["field"].(string)
	details["field"] = fmt.Sprintf("commands.%d.%s", i, field)
	return core.Errorf(core.CodeInvalidInput, "commands.%d: %s", i, ce.Message).WithDetails(details)
}

const batchColumns = `b.id, b.tenant_id, b.description, b.state, b.state_reason, b.commands, b.selection, b.digest, b.quorum,
	b.concurrency, b.max_failures, b.node_timeout_s, b.approval_ttl_s, b.wave,
	(SELECT coalesce(max(wave), -1) + 1 FROM command_batch_nodes WHERE batch_id = b.id), b.nodes, b.created_by,
	` + `(floor(extract(epoch FROM b.created_at) * 1000)::bigint), (floor(extract(epoch FROM b.updated_at) * 1000)::bigint),
	(floor(extract(epoch FROM b.started_at) * 1000)::bigint), (floor(extract(epoch FROM b.ended_at) * 1000)::bigint),
	(SELECT coalesce(jsonb_agg(jsonb_build_object('approver', a.approver, 'digest', a.digest, 'keyFingerprint', a.key_fingerprint,
		'approvedAt', (floor(extract(epoch FROM a.approved_at) * 1000)::bigint),
		'expiresAt', (floor(extract(epoch FROM a.expires_at) * 1000)::bigint)) ORDER BY a.approved_at, a.approver), '[]')
		FROM command_batch_approvals a WHERE a.batch_id = b.id),
	(SELECT coalesce(jsonb_object_agg(state, n), '{}') FROM (SELECT state, count(*) AS n FROM command_batch_nodes
		WHERE batch_id = b.id GROUP BY state) c)`

func scanBatch(row pgx.Row) (Batch, error) {
	var b Batch
	var cmds, sel, approvals, counts []byte
	if err := row.Scan(&b.ID, &b.TenantID, &b.Description, &b.State, &b.Reason, &cmds, &sel, &b.Digest, &b.Quorum,
		&b.Concurrency, &b.MaxFailures, &b.NodeTimeoutSeconds, &b.ApprovalTTLSeconds, &b.Wave, &b.Waves, &b.NodeIDs,
		&b.CreatedBy, &b.CreatedAt, &b.UpdatedAt, &b.StartedAt, &b.EndedAt, &approvals, &counts); err != nil {
		return Batch{}, err
	}
	for _, f := range []struct {
		raw []byte
		v   any
	}{{cmds, &b.Commands}, {sel, &b.Selection}, {approvals, &b.Approvals}, {counts, &b.Counts}} {
		if err := json.Unmarshal(f.raw, f.v); err != nil {
			return Batch{}, err
		}
	}
	return b, nil
}

// Get reads a batch of the tenant, with its nodes when withNodes.
func Get(ctx context.Context, tx store.DBTX, tenantID, id string, withNodes bool) (Batch, error) {
	b, err := scanBatch(tx.QueryRow(ctx, `SELECT `+batchColumns+` FROM command_batches b WHERE b.id = $1 AND b.tenant_id = $2`, id, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Batch{}, notFound(id)
	}
	if err != nil || !withNodes {
		return b, err
	}
	rows, err := tx.Query(ctx, `SELECT node_id, wave, state, results, error FROM command_batch_nodes
		WHERE batch_id = $1 ORDER BY wave, node_id`, id)
	if err != nil {
		return Batch{}, err
	}
	b.Nodes, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Node, error) {
		var n Node
		var results []byte
		if err := r.Scan(&n.NodeID, &n.Wave, &n.State, &results, &n.Error); err != nil {
			return Node{}, err
		}
		return n, json.Unmarshal(results, &n.Results)
	})
	return b, err
}

// List reads the tenant's batches oldest first (creation millisecond, then
// id), in state when it is not "": the page after its key, plus one. A
// listed batch carries no node ids (get has them).
func List(ctx context.Context, tx store.DBTX, tenantID, state string, page store.PageQuery) ([]Batch, error) {
	if page.Limit < 1 {
		return nil, fmt.Errorf("batches: limit %d", page.Limit)
	}
	k := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+batchColumns+` FROM command_batches b
		WHERE b.tenant_id = $1 AND ($2 = '' OR b.state = $2) AND (`+store.MsOf("b.created_at")+`, b.id) > ($4, $5)
		ORDER BY `+store.MsOf("b.created_at")+`, b.id LIMIT $3`, tenantID, state, page.Fetch(), k.At, k.ID)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Batch, error) { return scanBatch(r) })
	for i := range out {
		out[i].NodeIDs = nil
	}
	return out, err
}

// Scope is what a selection resolves to now and, for a batch, how that
// differs from the list its digest covers.
type Scope struct {
	NodeIDs []string `json:"nodeIds"`
	Count   int      `json:"count"`
	// For a batch: its digest, whether the selection still resolves to its
	// list, and the nodes it would gain and lose.
	BatchID string   `json:"batchId,omitempty"`
	Digest  string   `json:"digest,omitempty"`
	Changed bool     `json:"changed,omitempty"`
	Added   []string `json:"added,omitempty"`
	Removed []string `json:"removed,omitempty"`
}

// ScopeOf resolves a selection in the tenant (commandBatches.scope before a
// create).
func ScopeOf(ctx context.Context, tx store.DBTX, tenantID string, sel Selection) (Scope, error) {
	ids, err := Resolve(ctx, tx, tenantID, sel)
	return Scope{NodeIDs: ids, Count: len(ids)}, err
}

// ScopeOfBatch re-resolves a batch's selection and compares it with the
// batch's frozen list.
func ScopeOfBatch(ctx context.Context, tx store.DBTX, tenantID, id string) (Scope, error) {
	b, err := Get(ctx, tx, tenantID, id, false)
	if err != nil {
		return Scope{}, err
	}
	return rescope(ctx, tx, b)
}

func rescope(ctx context.Context, tx store.DBTX, b Batch) (Scope, error) {
	ids, err := resolve(ctx, tx, b.TenantID, b.Selection)
	if err != nil {
		return Scope{}, err
	}
	s := Scope{NodeIDs: ids, Count: len(ids), BatchID: b.ID, Digest: b.Digest}
	// Up to MaxNodes on each side: compare by binary search, not n².
	now, frozen := slices.Sorted(slices.Values(ids)), slices.Sorted(slices.Values(b.NodeIDs))
	for _, id := range now {
		if _, found := slices.BinarySearch(frozen, id); !found {
			s.Added = append(s.Added, id)
		}
	}
	for _, id := range frozen {
		if _, found := slices.BinarySearch(now, id); !found {
			s.Removed = append(s.Removed, id)
		}
	}
	s.Changed = len(s.Added) > 0 || len(s.Removed) > 0
	return s, nil
}

// lock reads a batch of the tenant with its row locked.
func lock(ctx context.Context, tx store.Tx, tenantID, id string) (Batch, error) {
	var ok bool
	err := tx.QueryRow(ctx, `SELECT true FROM command_batches WHERE id = $1 AND tenant_id = $2 FOR UPDATE`, id, tenantID).Scan(&ok)
	if errors.Is(err, pgx.ErrNoRows) {
		return Batch{}, notFound(id)
	}
	if err != nil {
		return Batch{}, err
	}
	return Get(ctx, tx, tenantID, id, false)
}

// Key is one of an approver's registered public keys.
type Key struct {
	Fingerprint string
	PublicKey   string // authorized_keys form
}

// ApproveRequest is one commandBatches.approve: the caller's identity, the
// digest they say they signed, their signature and their registered keys.
type ApproveRequest struct {
	TenantID, BatchID string
	Approver          string
	Digest, Signature string
	Keys              []Key
}

// Approve records an approval of a batch awaiting approval. It is refused
// (INVALID_STATE with details.reason, nothing recorded) when the batch is
// not awaiting approval (state), when the approver is its creator
// (creator), approved already (duplicate), names another digest (digest),
// has no registered key (noApproverKey) or signed with none of them
// (signature). The approval that makes the quorum starts the batch, unless
// the selection no longer resolves to the batch's exact node list
// (scopeChanged): then it is refused too, and the batch never runs on
// approvals of a scope that is not the one they saw.
func Approve(ctx context.Context, tx store.Tx, r ApproveRequest) (Batch, error) {
	b, err := lock(ctx, tx, r.TenantID, r.BatchID)
	if err != nil {
		return Batch{}, err
	}
	if b.State != AwaitingApproval {
		return Batch{}, invalidState("state", "batch %s is %s: it takes no approval", b.ID, b.State)
	}
	now := time.Now()
	have := approvals(b)
	a := corebatches.Approval{Approver: r.Approver, Digest: r.Digest, ExpiresAt: now.Add(time.Duration(b.ApprovalTTLSeconds) * time.Second)}
	if err := corebatches.CheckApproval(b.Digest, b.CreatedBy, have, a, now); err != nil {
		return Batch{}, err
	}
	fingerprint, err := verify(corebatches.SignatureNamespace, b.Digest, r.Signature, r.Keys)
	if err != nil {
		return Batch{}, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO command_batch_approvals (batch_id, approver, digest, key_fingerprint, signature, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6)`, b.ID, r.Approver, r.Digest, fingerprint, r.Signature, a.ExpiresAt); err != nil {
		return Batch{}, err
	}
	if corebatches.Quorate(b.Digest, b.CreatedBy, b.Quorum, append(have, a), now) {
		s, err := rescope(ctx, tx, b)
		if err != nil {
			return Batch{}, err
		}
		if s.Changed {
			return Batch{}, core.Errorf(core.CodeInvalidState,
				"the selection of batch %s no longer resolves to the nodes its digest covers (%d added, %d removed): it will not run; cancel it and create another",
				b.ID, len(s.Added), len(s.Removed)).WithDetails(map[string]any{"reason": "scopeChanged", "added": s.Added, "removed": s.Removed})
		}
		if _, err := tx.Exec(ctx, `UPDATE command_batches SET state = 'running', started_at = now(), updated_at = now()
			WHERE id = $1`, b.ID); err != nil {
			return Batch{}, err
		}
	} else if _, err := tx.Exec(ctx, `UPDATE command_batches SET updated_at = now() WHERE id = $1`, b.ID); err != nil {
		return Batch{}, err
	}
	return Get(ctx, tx, r.TenantID, b.ID, false)
}

func approvals(b Batch) []corebatches.Approval {
	out := make([]corebatches.Approval, len(b.Approvals))
	for i, a := range b.Approvals {
		out[i] = corebatches.Approval{Approver: a.Approver, Digest: a.Digest, ExpiresAt: time.UnixMilli(a.ExpiresAt)}
	}
	return out
}

// verify answers the fingerprint of the key among keys that signed digest
// in namespace.
func verify(namespace, digest, signature string, keys []Key) (string, error) {
	if len(keys) == 0 {
		return "", invalidState("noApproverKey", "the caller has no approver key registered (the IAM admin's addApproverKey)")
	}
	var last error
	for _, k := range keys {
		pub, err := parseKey(k.PublicKey)
		if err != nil {
			return "", err
		}
		if last = corebatches.VerifySignature(namespace, digest, signature, pub); last == nil {
			return k.Fingerprint, nil
		}
		if ce := core.AsError(last); ce != nil && ce.Code == core.CodeInvalidInput {
			return "", last // not a signature at all
		}
	}
	return "", last
}

// CancelRequest is one commandBatches.cancel: the caller and their
// signature of the batch's digest in corebatches.CancelNamespace.
type CancelRequest struct {
	TenantID, BatchID string
	By, Signature     string
	Keys              []Key
}

// Cancel stops a batch awaiting approval or running, in one transaction:
// its pending nodes are cancelled, and so are the commands in flight (the
// agents are told to stop them). Any registered approver may cancel,
// its creator too: stopping never needs a quorum, but it does need a
// signature, as approving does. A cancelled batch is answered as it is;
// one that ended otherwise is INVALID_STATE.
func Cancel(ctx context.Context, tx store.Tx, r CancelRequest) (Batch, error) {
	b, err := lock(ctx, tx, r.TenantID, r.BatchID)
	if err != nil {
		return Batch{}, err
	}
	switch b.State {
	case Cancelled:
		return b, nil
	case AwaitingApproval, Running:
	default:
		return Batch{}, invalidState("state", "batch %s is %s: it cannot be cancelled", b.ID, b.State)
	}
	if _, err := verify(corebatches.CancelNamespace, b.Digest, r.Signature, r.Keys); err != nil {
		return Batch{}, err
	}
	rows, err := tx.Query(ctx, `SELECT node_id, command_seq FROM command_batch_nodes
		WHERE batch_id = $1 AND state = 'running' ORDER BY node_id FOR UPDATE`, b.ID)
	if err != nil {
		return Batch{}, err
	}
	type inFlight struct {
		node string
		seq  *int64
	}
	flying, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (inFlight, error) {
		var f inFlight
		return f, r.Scan(&f.node, &f.seq)
	})
	if err != nil {
		return Batch{}, err
	}
	for _, f := range flying {
		if f.seq == nil {
			continue
		}
		c, err := store.NodeCommandBySeq(ctx, tx, f.node, *f.seq)
		if err != nil {
			return Batch{}, err
		}
		if _, err := store.CancelNodeCommand(ctx, tx, c.TenantID, c.NodeID, c.ID); err != nil {
			if ce := core.AsError(err); ce == nil || ce.Code != core.CodeInvalidState {
				return Batch{}, err
			} // finished meanwhile: its result stands
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE command_batch_nodes SET state = 'cancelled', error = 'the batch was cancelled', step_at = now()
		WHERE batch_id = $1 AND state IN ('pending', 'running')`, b.ID); err != nil {
		return Batch{}, err
	}
	if err := setState(ctx, tx, b.ID, Cancelled, "cancelled by "+r.By); err != nil {
		return Batch{}, err
	}
	return Get(ctx, tx, r.TenantID, b.ID, false)
}

func setState(ctx context.Context, tx store.Tx, id, state, reason string) error {
	_, err := tx.Exec(ctx, `UPDATE command_batches SET state = $2, state_reason = $3, updated_at = now(),
		ended_at = CASE WHEN $2 IN ('succeeded', 'failed', 'cancelled') THEN now() END WHERE id = $1`, id, state, reason)
	return err
}

// Owed answers the running batches, oldest first, at most limit: the
// reconciler starts again the workflow of each.
func Owed(ctx context.Context, tx store.DBTX, limit int) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT id FROM command_batches WHERE state = 'running' ORDER BY created_at, id LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
