package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/store"
)

// superseded is store/metal's Superseded (the same code and reason, so
// callers map both alike): the operation a write names is no longer the
// node's operation in flight.
func superseded(nodeID string, opSeq int64) error {
	return core.Errorf(core.CodeConflict, "operation %d of node %s is no longer in flight", opSeq, nodeID).
		WithDetails(map[string]any{"reason": "superseded", "opSeq": opSeq})
}

// fence locks the node's lifecycle row, checks that opSeq is in flight,
// and answers its deadline.
func fence(ctx context.Context, tx store.Tx, nodeID string, opSeq int64) (time.Time, error) {
	var seq int64
	var op string
	var deadline *time.Time
	err := tx.QueryRow(ctx, `SELECT op_seq, operation, deadline_at FROM node_metal WHERE node_id = $1 FOR UPDATE`, nodeID).
		Scan(&seq, &op, &deadline)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, core.Errorf(core.CodeNotFound, "node %s not found", nodeID)
	}
	if err != nil {
		return time.Time{}, err
	}
	if op == "" || seq != opSeq {
		return time.Time{}, superseded(nodeID, opSeq)
	}
	if deadline == nil {
		return time.Time{}, nil
	}
	return *deadline, nil
}

// fenced reads the tenant's workflow, locked, and fences its operation
// opSeq: a workflow that no longer runs under opSeq is superseded too.
func fenced(ctx context.Context, tx store.Tx, tenantID, id string, opSeq int64) (Workflow, time.Time, error) {
	w, err := read(ctx, tx, tenantID, id, true)
	if err != nil {
		return Workflow{}, time.Time{}, err
	}
	deadline, err := fence(ctx, tx, w.NodeID, opSeq)
	if err != nil {
		return Workflow{}, time.Time{}, err
	}
	if w.OpSeq != opSeq || !provisioning.Live(w.State) {
		return Workflow{}, time.Time{}, superseded(w.NodeID, opSeq)
	}
	return w, deadline, nil
}

// ForOperation reads the tenant's node's workflow that operation opSeq
// runs (a deploy's, or the one a retry resumes); NOT_FOUND when none.
func ForOperation(ctx context.Context, tx store.Tx, tenantID, nodeID string, opSeq int64) (Workflow, error) {
	var id string
	err := tx.QueryRow(ctx, `SELECT id FROM workflows WHERE tenant_id = $1 AND node_id = $2 AND op_seq = $3
		ORDER BY created_at DESC LIMIT 1`, tenantID, nodeID, opSeq).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Workflow{}, core.Errorf(core.CodeNotFound, "operation %d of node %s runs no workflow", opSeq, nodeID)
	}
	if err != nil {
		return Workflow{}, err
	}
	return read(ctx, tx, tenantID, id, false)
}

// Start is what BeginStep did.
type Start struct {
	// Paused: a pause was requested; the step did not start.
	Paused   bool
	Attempt  int
	Deadline time.Time
	// Step is the step's name.
	Step string
}

// BeginStep starts an attempt of step index of the workflow under opSeq
// (fenced). A requested pause changes nothing but the workflow's state
// (paused at that step) and answers Paused; otherwise the step runs its
// next attempt (started_at set on the first) and the workflow runs at
// that step. It answers the operation's deadline as the row holds it.
func BeginStep(ctx context.Context, tx store.Tx, tenantID, id string, opSeq int64, index int) (Start, error) {
	w, deadline, err := fenced(ctx, tx, tenantID, id, opSeq)
	if err != nil {
		return Start{}, err
	}
	if index < 0 || index >= len(w.Steps) {
		return Start{}, core.Errorf(core.CodeInvalidInput, "workflow %s has no step %d", id, index)
	}
	out := Start{Deadline: deadline, Step: w.Steps[index].Name}
	if w.PauseRequested {
		_, err := tx.Exec(ctx, `UPDATE workflows SET state = 'paused', paused_at = COALESCE(paused_at, now()), step_index = $2
			WHERE id = $1`, id, index)
		out.Paused = true
		return out, err
	}
	if err := tx.QueryRow(ctx, `UPDATE workflow_steps SET state = 'running', attempts = attempts + 1,
			started_at = COALESCE(started_at, now()), attempt_started_at = now(), finished_at = NULL
		WHERE workflow_id = $1 AND idx = $2 RETURNING attempts`, id, index).Scan(&out.Attempt); err != nil {
		return Start{}, err
	}
	_, err = tx.Exec(ctx, `UPDATE workflows SET state = 'running', step_index = $2, started_at = COALESCE(started_at, now())
		WHERE id = $1`, id, index)
	return out, err
}

// Outcome is one attempt's outcome.
type Outcome struct {
	OK     bool
	Final  bool
	Output string
	Error  string
	Reason string
}

// Clip cuts s to at most n bytes, on a rune boundary.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// EndStep records an attempt's outcome of step index (fenced): OK ends the
// step succeeded; a final failure ends it failed, its output and error
// kept; any other failure keeps it running with the attempt's error. Each
// outcome appends the attempt to the step's history. A step that is not
// running writes nothing (a retried activity's second answer).
func EndStep(ctx context.Context, tx store.Tx, tenantID, id string, opSeq int64, index int, o Outcome) error {
	if _, _, err := fenced(ctx, tx, tenantID, id, opSeq); err != nil {
		return err
	}
	state := provisioning.StepRunning
	switch {
	case o.OK:
		state = provisioning.StepSucceeded
	case o.Final:
		state = provisioning.StepFailed
	}
	output := Clip(o.Output, provisioning.MaxOutputBytes)
	errText := Clip(o.Error, 4<<10)
	var attempt int
	var started *time.Time
	var now time.Time
	var rawLog []byte
	err := tx.QueryRow(ctx, `SELECT attempts, attempt_started_at, attempt_log, now() FROM workflow_steps
		WHERE workflow_id = $1 AND idx = $2 AND state = 'running' FOR UPDATE`, id, index).Scan(&attempt, &started, &rawLog, &now)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	var log []Attempt
	if err := json.Unmarshal(rawLog, &log); err != nil {
		return err
	}
	a := Attempt{Attempt: attempt, OK: o.OK, Error: errText, Reason: o.Reason, FinishedAt: now.UnixMilli()}
	if started != nil {
		a.StartedAt, a.DurationMs = started.UnixMilli(), now.Sub(*started).Milliseconds()
	}
	log = append(log, a)
	if len(log) > maxAttemptLog {
		log = log[len(log)-maxAttemptLog:]
	}
	rawLog, err = json.Marshal(log)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE workflow_steps SET state = $3, output = $4, error = $5, reason = $6, attempt_log = $7,
			finished_at = CASE WHEN $3 = 'running' THEN NULL ELSE now() END
		WHERE workflow_id = $1 AND idx = $2`, id, index, state, output, errText, o.Reason, string(rawLog))
	if err != nil || state != provisioning.StepFailed {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE workflows SET error = $2, step_index = $3 WHERE id = $1`, id, errText, index)
	return err
}

// End is how an operation's end ends its workflow.
type End struct {
	NodeID string
	OpSeq  int64
	// Failed: the operation failed (else it finished).
	Failed bool
	// State is "" (succeeded, or failed when Failed) or
	// provisioning.WorkflowAborted.
	State   string
	Message string
	Reason  string
}

// EndForOperation ends the live workflow operation opSeq of the node runs,
// in the transaction that ends the operation (store/metal's Finish and
// Fail), and answers its id ("" when the operation runs none). Finished:
// succeeded, or aborted (the step in flight aborted). Failed: failed at
// its step (a step still running fails with the failure's message, one
// that failed keeps its output), or aborted.
func EndForOperation(ctx context.Context, tx store.Tx, e End) (string, error) {
	var id string
	err := tx.QueryRow(ctx, `SELECT id FROM workflows WHERE node_id = $1 AND op_seq = $2
		AND state IN ('pending', 'running', 'paused') FOR UPDATE`, e.NodeID, e.OpSeq).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	state := provisioning.WorkflowSucceeded
	switch {
	case e.State == provisioning.WorkflowAborted:
		state = provisioning.WorkflowAborted
	case e.Failed:
		state = provisioning.WorkflowFailed
	}
	stepState := provisioning.StepFailed
	if state == provisioning.WorkflowAborted {
		stepState = provisioning.StepAborted
	}
	if state != provisioning.WorkflowSucceeded {
		// The step in flight ends with the workflow; a failed one already
		// holds its own error and output.
		var idx int
		err := tx.QueryRow(ctx, `UPDATE workflow_steps SET state = $2, finished_at = now(),
				error = CASE WHEN error = '' THEN $3 ELSE error END, reason = CASE WHEN reason = '' THEN $4 ELSE reason END
			WHERE workflow_id = $1 AND state = 'running' RETURNING idx`, id, stepState, Clip(e.Message, 4<<10), e.Reason).Scan(&idx)
		switch {
		case err == nil:
			if _, err := tx.Exec(ctx, `UPDATE workflows SET step_index = $2 WHERE id = $1`, id, idx); err != nil {
				return "", err
			}
		case !errors.Is(err, pgx.ErrNoRows):
			return "", err
		}
	}
	errText := ""
	if state != provisioning.WorkflowSucceeded {
		errText = Clip(e.Message, 4<<10)
		if errText == "" {
			errText = state
		}
	}
	_, err = tx.Exec(ctx, `UPDATE workflows SET state = $2, finished_at = now(),
			error = CASE WHEN error = '' OR $2 <> 'failed' THEN $3 ELSE error END,
			pause_requested_at = NULL, paused_at = NULL
		WHERE id = $1`, id, state, errText)
	return id, err
}

// FailedStep is the name of the workflow's failed step ("" when none).
func (w Workflow) FailedStep() string {
	for _, s := range w.Steps {
		if s.State == provisioning.StepFailed {
			return s.Name
		}
	}
	return ""
}
