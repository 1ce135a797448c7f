// Package workflows persists provisioning workflows (wf_…): a profile
// version expanded for one node into steps, each with its state, attempts,
// output and timings. metal.deploy creates one in the Deploy operation's
// transaction; the node's lifecycle workflow runs its steps through the
// ProvisionStore methods (activities/metal.DBStore calls the functions
// here), every write fenced by the operation's op_seq; store/metal ends it
// in the transaction that ends its operation; workflows.* read, pause,
// resume and retry it.
package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/nodes"
)

// IDPrefix is a workflow id's prefix.
const IDPrefix = "wf"

// maxAttemptLog bounds the attempts a step keeps (the newest, across
// retries of the workflow).
const maxAttemptLog = 2 * provisioning.MaxAttempts

// Actions on a workflow, as INVALID_STATE's details list them.
const (
	ActionPause  = "pause"
	ActionResume = "resume"
	ActionRetry  = "retry"
	ActionAbort  = "abort"
)

// Workflow is a workflow as workflows.get answers it. Times are epoch
// milliseconds.
type Workflow struct {
	ID             string `json:"id"`
	TenantID       string `json:"tenantId"`
	NodeID         string `json:"nodeId"`
	ProfileID      string `json:"profileId"`
	ProfileVersion int    `json:"profileVersion"`
	// OpSeq is the node operation it runs under (a deploy's, or the
	// retry's that resumed it).
	OpSeq int64  `json:"opSeq"`
	State string `json:"state"`
	// StepIndex and Step are the step it is at: running, paused before,
	// failed, or the last one once it succeeded.
	StepIndex int    `json:"stepIndex"`
	Step      string `json:"step,omitempty"`
	// Paused: it stopped before its next step; PauseRequested: a pause was
	// asked for and not resumed (it pauses before the next step).
	Paused         bool   `json:"paused"`
	PauseRequested bool   `json:"pauseRequested"`
	Error          string `json:"error,omitempty"`
	BootID         string `json:"bootId,omitempty"`
	// Image is the image it writes, pinned when it was made.
	Image *provisioning.ImageRef `json:"image,omitempty"`
	// Allowed lists the workflows.* actions its state admits.
	Allowed    []string `json:"allowed"`
	CreatedBy  string   `json:"createdBy"`
	CreatedAt  int64    `json:"createdAt"`
	StartedAt  *int64   `json:"startedAt,omitempty"`
	FinishedAt *int64   `json:"finishedAt,omitempty"`
	Steps      []Step   `json:"steps"`
	// context is the whole Context (user data included), for the
	// lifecycle and the seed, never answered.
	context  provisioning.Context
	pausedAt *time.Time
}

// Context is the workflow's rendered context (the lifecycle's and the
// seed endpoint's; the API answers only Image).
func (w Workflow) Context() provisioning.Context { return w.context }

// Key is the workflow's list key (newest first).
func (w Workflow) Key() store.Key { return store.Key{At: w.CreatedAt, ID: w.ID} }

// Step is one step as a user reads it.
type Step struct {
	Index          int                 `json:"index"`
	Name           string              `json:"name"`
	On             provisioning.Runner `json:"on"`
	Action         string              `json:"action"`
	Await          string              `json:"await,omitempty"`
	TimeoutSeconds int                 `json:"timeoutSeconds"`
	Retry          provisioning.Retry  `json:"retry"`
	State          string              `json:"state"`
	Attempts       int                 `json:"attempts"`
	Output         string              `json:"output,omitempty"`
	Error          string              `json:"error,omitempty"`
	Reason         string              `json:"reason,omitempty"`
	StartedAt      *int64              `json:"startedAt,omitempty"`
	FinishedAt     *int64              `json:"finishedAt,omitempty"`
	// DurationMs is from its first attempt's start to its end (or to now
	// while it runs).
	DurationMs *int64 `json:"durationMs,omitempty"`
	// History is each attempt's outcome, oldest first.
	History []Attempt `json:"history"`
	// spec is the rendered step (its args included) as the lifecycle runs it.
	spec provisioning.Step
}

// Spec is the rendered step as the lifecycle runs it.
func (s Step) Spec() provisioning.Step { return s.spec }

// Attempt is one attempt of a step.
type Attempt struct {
	Attempt    int    `json:"attempt"`
	OK         bool   `json:"ok"`
	Error      string `json:"error,omitempty"`
	Reason     string `json:"reason,omitempty"`
	StartedAt  int64  `json:"startedAt"`
	FinishedAt int64  `json:"finishedAt"`
	DurationMs int64  `json:"durationMs"`
}

// New is a workflow to create.
type New struct {
	TenantID       string
	NodeID         string
	ProfileID      string
	ProfileVersion int
	// OpSeq is the Deploy operation it runs under.
	OpSeq     int64
	Context   provisioning.Context
	Steps     []provisioning.Step
	CreatedBy string
}

// Create persists a workflow pending at its first step, in the caller's
// transaction (metal.deploy's, after BeginOperation). The node must be
// the tenant's; a node with a live workflow is INVALID_STATE.
func Create(ctx context.Context, tx store.Tx, n New) (Workflow, error) {
	if _, err := nodes.Get(ctx, tx, n.TenantID, n.NodeID, false); err != nil {
		return Workflow{}, err
	}
	if len(n.Steps) == 0 || len(n.Steps) > provisioning.MaxSteps {
		return Workflow{}, core.Errorf(core.CodeInvalidInput, "a workflow has 1 to %d steps", provisioning.MaxSteps).
			WithDetails(map[string]any{"field": "steps", "reason": "range"})
	}
	if live, err := liveOf(ctx, tx, n.NodeID); err != nil {
		return Workflow{}, err
	} else if live != "" {
		return Workflow{}, core.Errorf(core.CodeInvalidState, "node %s runs workflow %s", n.NodeID, live).
			WithDetails(map[string]any{"workflowId": live, "reason": "liveWorkflow"})
	}
	id := core.NewID(IDPrefix)
	rawCtx, err := json.Marshal(n.Context)
	if err != nil {
		return Workflow{}, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO workflows (id, tenant_id, node_id, profile_id, profile_version, op_seq, context, created_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, id, n.TenantID, n.NodeID, n.ProfileID, n.ProfileVersion, n.OpSeq,
		string(rawCtx), n.CreatedBy); err != nil {
		return Workflow{}, err
	}
	for i, s := range n.Steps {
		raw, err := json.Marshal(s)
		if err != nil {
			return Workflow{}, err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO workflow_steps (workflow_id, idx, name, step) VALUES ($1, $2, $3, $4)`,
			id, i, s.Name, string(raw)); err != nil {
			return Workflow{}, err
		}
	}
	return read(ctx, tx, n.TenantID, id, false)
}

func liveOf(ctx context.Context, tx store.Tx, nodeID string) (string, error) {
	var id string
	err := tx.QueryRow(ctx, `SELECT id FROM workflows WHERE node_id = $1 AND state IN ('pending', 'running', 'paused')`, nodeID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return id, err
}

// NotFound is the error of a workflow the caller may not see.
func NotFound(id string) error { return core.Errorf(core.CodeNotFound, "workflow %s not found", id) }

const workflowColumns = `id, tenant_id, node_id, profile_id, profile_version, op_seq, state, step_index,
	pause_requested_at IS NOT NULL, paused_at, context, boot_id, error, created_by, created_at, started_at, finished_at`

func scanWorkflow(row pgx.Row) (Workflow, error) {
	var w Workflow
	var rawCtx []byte
	var created time.Time
	var started, finished *time.Time
	err := row.Scan(&w.ID, &w.TenantID, &w.NodeID, &w.ProfileID, &w.ProfileVersion, &w.OpSeq, &w.State, &w.StepIndex,
		&w.PauseRequested, &w.pausedAt, &rawCtx, &w.BootID, &w.Error, &w.CreatedBy, &created, &started, &finished)
	if err != nil {
		return Workflow{}, err
	}
	if err := json.Unmarshal(rawCtx, &w.context); err != nil {
		return Workflow{}, fmt.Errorf("workflow %s: context: %w", w.ID, err)
	}
	w.Image = w.context.Image
	w.Paused = w.State == provisioning.WorkflowPaused
	w.CreatedAt, w.StartedAt, w.FinishedAt = created.UnixMilli(), ms(started), ms(finished)
	w.Allowed = allowed(w)
	return w, nil
}

func ms(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	v := t.UnixMilli()
	return &v
}

// allowed lists the actions w's state admits.
func allowed(w Workflow) []string {
	switch {
	case w.State == provisioning.WorkflowPaused, provisioning.Live(w.State) && w.PauseRequested:
		return []string{ActionResume, ActionAbort}
	case provisioning.Live(w.State):
		return []string{ActionPause, ActionAbort}
	case w.State == provisioning.WorkflowFailed:
		return []string{ActionRetry}
	}
	return []string{}
}

// invalidState is INVALID_STATE with the actions w admits.
func invalidState(w Workflow, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidState, format, args...).WithDetails(map[string]any{
		"workflowId": w.ID, "state": w.State, "allowed": w.Allowed})
}

// Read reads the tenant's workflow id with its steps.
func Read(ctx context.Context, tx store.Tx, tenantID, id string) (Workflow, error) {
	return read(ctx, tx, tenantID, id, false)
}

// read reads the tenant's workflow with its steps; lock takes its row.
func read(ctx context.Context, tx store.Tx, tenantID, id string, lock bool) (Workflow, error) {
	q := `SELECT ` + workflowColumns + ` FROM workflows WHERE tenant_id = $1 AND id = $2`
	if lock {
		q += ` FOR UPDATE`
	}
	w, err := scanWorkflow(tx.QueryRow(ctx, q, tenantID, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Workflow{}, NotFound(id)
	}
	if err != nil {
		return Workflow{}, err
	}
	if w.Steps, err = steps(ctx, tx, id); err != nil {
		return Workflow{}, err
	}
	if w.StepIndex < len(w.Steps) {
		w.Step = w.Steps[w.StepIndex].Name
	}
	return w, nil
}

func steps(ctx context.Context, tx store.Tx, workflowID string) ([]Step, error) {
	rows, err := tx.Query(ctx, `SELECT idx, step, state, attempts, output, error, reason, attempt_log, started_at, finished_at, now()
		FROM workflow_steps WHERE workflow_id = $1 ORDER BY idx`, workflowID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Step, error) {
		var s Step
		var spec, log []byte
		var started, finished *time.Time
		var now time.Time
		if err := r.Scan(&s.Index, &spec, &s.State, &s.Attempts, &s.Output, &s.Error, &s.Reason, &log, &started, &finished, &now); err != nil {
			return Step{}, err
		}
		if err := json.Unmarshal(spec, &s.spec); err != nil {
			return Step{}, fmt.Errorf("workflow %s step %d: %w", workflowID, s.Index, err)
		}
		if err := json.Unmarshal(log, &s.History); err != nil {
			return Step{}, fmt.Errorf("workflow %s step %d: attempts: %w", workflowID, s.Index, err)
		}
		s.Name, s.On, s.Action, s.Await = s.spec.Name, s.spec.On, s.spec.Action, s.spec.Await
		s.TimeoutSeconds, s.Retry = s.spec.TimeoutSeconds, s.spec.Retry
		s.StartedAt, s.FinishedAt = ms(started), ms(finished)
		if started != nil {
			end := now
			if finished != nil {
				end = *finished
			}
			d := end.Sub(*started).Milliseconds()
			s.DurationMs = &d
		}
		return s, nil
	})
}

// Get reads the tenant's node's workflow id, or its latest when id is "".
// A node or workflow the tenant may not see, or a workflow of another
// node, is NOT_FOUND.
func Get(ctx context.Context, tx store.Tx, tenantID, nodeID, id string) (Workflow, error) {
	if _, err := nodes.Get(ctx, tx, tenantID, nodeID, false); err != nil {
		return Workflow{}, err
	}
	if id == "" {
		err := tx.QueryRow(ctx, `SELECT id FROM workflows WHERE node_id = $1 ORDER BY created_at DESC, id DESC LIMIT 1`, nodeID).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return Workflow{}, core.Errorf(core.CodeNotFound, "node %s has no workflow", nodeID)
		}
		if err != nil {
			return Workflow{}, err
		}
	}
	w, err := read(ctx, tx, tenantID, id, false)
	if err == nil && w.NodeID != nodeID {
		return Workflow{}, NotFound(id)
	}
	return w, err
}

// List reads a page of the tenant's node's workflows, newest first: the
// page's rows plus one (the caller cuts the page).
func List(ctx context.Context, tx store.Tx, tenantID, nodeID string, page store.PageQuery) ([]Workflow, error) {
	if _, err := nodes.Get(ctx, tx, tenantID, nodeID, false); err != nil {
		return nil, err
	}
	k := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT id FROM workflows WHERE node_id = $1 AND tenant_id = $2
			AND ($3 OR (`+store.MsOf("created_at")+`, id) < ($4, $5))
		ORDER BY `+store.MsOf("created_at")+` DESC, id DESC LIMIT $6`,
		nodeID, tenantID, page.First(), k.At, k.ID, page.Fetch())
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	out := make([]Workflow, 0, len(ids))
	for _, id := range ids {
		w, err := read(ctx, tx, tenantID, id, false)
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, nil
}

// forNode reads the tenant's node's workflow id, locked, for a change.
func forNode(ctx context.Context, tx store.Tx, tenantID, nodeID, id string) (Workflow, error) {
	if _, err := nodes.Get(ctx, tx, tenantID, nodeID, false); err != nil {
		return Workflow{}, err
	}
	w, err := read(ctx, tx, tenantID, id, true)
	if err == nil && w.NodeID != nodeID {
		return Workflow{}, NotFound(id)
	}
	return w, err
}

// Pause asks the tenant's live workflow to stop before its next step
// (pause_requested_at); the run pauses it there (BeginStep). Pausing a
// workflow already paused or asked to is a no-op; one that is not live is
// INVALID_STATE.
func Pause(ctx context.Context, tx store.Tx, tenantID, nodeID, id string) (Workflow, error) {
	w, err := forNode(ctx, tx, tenantID, nodeID, id)
	if err != nil {
		return Workflow{}, err
	}
	if !provisioning.Live(w.State) {
		return Workflow{}, invalidState(w, "workflow %s is %s: only a live workflow pauses", id, w.State)
	}
	if _, err := tx.Exec(ctx, `UPDATE workflows SET pause_requested_at = COALESCE(pause_requested_at, now()) WHERE id = $1`, id); err != nil {
		return Workflow{}, err
	}
	return read(ctx, tx, tenantID, id, false)
}

// Resume lifts the pause of the tenant's workflow: a paused one runs its
// next step again, and the node's operation deadline is pushed by the time
// it spent paused, so a pause never costs the operation its deadline. One
// neither paused nor asked to pause is INVALID_STATE.
func Resume(ctx context.Context, tx store.Tx, tenantID, nodeID, id string) (Workflow, error) {
	w, err := forNode(ctx, tx, tenantID, nodeID, id)
	if err != nil {
		return Workflow{}, err
	}
	if !provisioning.Live(w.State) || (!w.PauseRequested && w.State != provisioning.WorkflowPaused) {
		return Workflow{}, invalidState(w, "workflow %s is %s and not paused", id, w.State)
	}
	if w.pausedAt != nil {
		if _, err := tx.Exec(ctx, `UPDATE node_metal SET deadline_at = deadline_at + (now() - $3::timestamptz), updated_at = now()
			WHERE node_id = $1 AND op_seq = $2 AND operation <> ''`, nodeID, w.OpSeq, *w.pausedAt); err != nil {
			return Workflow{}, err
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE workflows SET pause_requested_at = NULL, paused_at = NULL,
			state = CASE WHEN state = 'paused' THEN (CASE WHEN started_at IS NULL THEN 'pending' ELSE 'running' END) ELSE state END
		WHERE id = $1`, id); err != nil {
		return Workflow{}, err
	}
	return read(ctx, tx, tenantID, id, false)
}

// CheckRetry reads the tenant's workflow that workflows.retry resumes: it
// must be failed, and be the failure the node is failed by (its last
// error names it), else INVALID_STATE.
func CheckRetry(ctx context.Context, tx store.Tx, tenantID, nodeID, id string) (Workflow, error) {
	w, err := forNode(ctx, tx, tenantID, nodeID, id)
	if err != nil {
		return Workflow{}, err
	}
	if w.State != provisioning.WorkflowFailed {
		return Workflow{}, invalidState(w, "workflow %s is %s: only a failed workflow is retried", id, w.State)
	}
	var failedBy string
	var state string
	if err := tx.QueryRow(ctx, `SELECT COALESCE(m.last_error->>'workflowId', ''), n.provision_state
		FROM node_metal m JOIN nodes n ON n.id = m.node_id WHERE m.node_id = $1`, nodeID).Scan(&failedBy, &state); err != nil {
		return Workflow{}, err
	}
	if failedBy != id || state != "failed" {
		w.Allowed = []string{}
		return Workflow{}, invalidState(w, "node %s is not failed by workflow %s (it is %s)", nodeID, id, state)
	}
	return w, nil
}

// Rerun moves a failed workflow (CheckRetry's) to the retry operation
// opSeq: pending again, its failed step and every step after it pending
// (their attempts and history kept).
func Rerun(ctx context.Context, tx store.Tx, id string, opSeq int64) error {
	var from int
	err := tx.QueryRow(ctx, `UPDATE workflows SET op_seq = $2, state = 'pending', error = '', finished_at = NULL,
			pause_requested_at = NULL, paused_at = NULL
		WHERE id = $1 AND state = 'failed' RETURNING step_index`, id, opSeq).Scan(&from)
	if errors.Is(err, pgx.ErrNoRows) {
		return core.Errorf(core.CodeInvalidState, "workflow %s is not failed", id)
	}
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE workflow_steps SET state = 'pending', output = '', error = '', reason = '',
			started_at = NULL, finished_at = NULL
		WHERE workflow_id = $1 AND idx >= $2`, id, from)
	return err
}

// LiveForProfile answers a live workflow of the tenant that runs the
// profile ("" when none): profiles.delete refuses such a profile.
func LiveForProfile(ctx context.Context, tx store.Tx, tenantID, profileID string) (string, error) {
	var id string
	err := tx.QueryRow(ctx, `SELECT id FROM workflows WHERE tenant_id = $1 AND profile_id = $2
		AND state IN ('pending', 'running', 'paused') ORDER BY created_at LIMIT 1`, tenantID, profileID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return id, err
}

// LiveCount counts the tenant's live workflows that run the profile (the
// store/profiles.LiveWorkflows profiles.delete checks).
func LiveCount(ctx context.Context, tx store.Tx, tenantID, profileID string) (int, error) {
	var n int
	err := tx.QueryRow(ctx, `SELECT count(*) FROM workflows WHERE tenant_id = $1 AND profile_id = $2
		AND state IN ('pending', 'running', 'paused')`, tenantID, profileID).Scan(&n)
	return n, err
}

// ImageForSite answers the image a live workflow on the node, at the
// site, writes (the site image endpoint serves only that); any other
// image, node or site is NOT_FOUND.
func ImageForSite(ctx context.Context, tx store.Tx, siteID, nodeID, imageID string) (provisioning.ImageRef, error) {
	var raw []byte
	err := tx.QueryRow(ctx, `SELECT w.context->'image' FROM workflows w JOIN nodes n ON n.id = w.node_id
			JOIN node_bmcs b ON b.node_id = w.node_id
		WHERE w.node_id = $1 AND b.site_id = $2 AND n.deleted_at IS NULL AND w.state IN ('pending', 'running', 'paused')
			AND w.context->'image'->>'id' = $3`, nodeID, siteID, imageID).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return provisioning.ImageRef{}, core.Errorf(core.CodeNotFound, "image %s not found", imageID)
	}
	if err != nil {
		return provisioning.ImageRef{}, err
	}
	var ref provisioning.ImageRef
	return ref, json.Unmarshal(raw, &ref)
}

// LiveForNode reads the node's live workflow (the seed endpoint's), the
// caller having checked the node; NOT_FOUND when none.
func LiveForNode(ctx context.Context, tx store.Tx, tenantID, nodeID string) (Workflow, error) {
	id, err := liveOf(ctx, tx, nodeID)
	if err != nil {
		return Workflow{}, err
	}
	if id == "" {
		return Workflow{}, core.Errorf(core.CodeNotFound, "node %s runs no workflow", nodeID)
	}
	return read(ctx, tx, tenantID, id, false)
}
