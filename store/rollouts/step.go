package rollouts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	corerollouts "github.com/better-compute/better-compute/core/rollouts"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/images"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/pools"
)

// DrainMode is how a rollout drains a node: it waits for the node's
// reservations to end (nodes.drain's wait mode), never releasing them.
const DrainMode = "wait"

// StepResult is what one Step did: the rollout's state and wave after it,
// whether it moved to the next wave, the drains it began (whose
// NodeDrainWorkflow the caller starts once the step is committed) and
// whether the rollout is over.
type StepResult struct {
	State    string       `json:"state"`
	Wave     int          `json:"wave"`
	NextWave bool         `json:"nextWave,omitempty"`
	Drains   []DrainStart `json:"drains,omitempty"`
	Done     bool         `json:"done,omitempty"`
	// Counts are the wave's nodes per state after the step.
	Counts map[string]int `json:"counts,omitempty"`
}

// DrainStart names a node whose drain a step began.
type DrainStart struct {
	TenantID string `json:"tenantId"`
	NodeID   string `json:"nodeId"`
}

// stepRow is a rollout node with what a step reads of its node.
type stepRow struct {
	NodeID, State, Error     string
	Wave                     int
	CommandSeq               *int64
	WasCordoned, Late        bool
	TenantID                 *string // nil: the node is gone
	DrainState, Connectivity string
	AgentVersion             string
	Cordoned                 bool
}

// rolloutRow is what a step reads of its rollout, locked.
type rolloutRow struct {
	ID, TenantID, State, ReleaseID, PoolID string
	Wave, Waves, ResumedFailed             int
	Threshold                              float64
	Acceptance                             *Acceptance
	Timeout                                time.Duration
	Rollback                               bool
}

// Step advances rollout id by what its rows say, in tx, and is safe to
// repeat: every effect (a drain, a command) is recorded on the node's row
// in the same transaction, and a command is queued under the idempotency
// key <rolloutId>/<step>, so a step retried after a crash finds it rather
// than queuing a second one. In the current wave it begins drains while
// the pool's budget allows, queues agent.update on drained nodes, checks
// updated ones (the command succeeded, the node is connected and says the
// release's agentVersion, the acceptance command exited 0) and uncordons
// them; a node past its deadline fails; a wave whose failed share exceeds
// the threshold pauses the rollout (pausedOnFailure), and a finished wave
// moves it on. A paused rollout (by the operator or on failure) lets
// the nodes in flight finish and starts none. An aborting rollout skips its pending nodes, ends its
// drains, waits for its updates in flight, rolls back when asked, and is
// then aborted. The rollout's tenant is the platform's (whose images and
// signers a release uses); by names the caller in node events.
func Step(ctx context.Context, tx store.Tx, id, by string) (StepResult, error) {
	o, err := lockRollout(ctx, tx, id)
	if err != nil {
		return StepResult{}, err
	}
	if o.State == corerollouts.Aborted || o.State == corerollouts.Succeeded {
		return StepResult{State: o.State, Wave: o.Wave, Done: true}, nil
	}
	rel, err := GetRelease(ctx, tx, o.ReleaseID)
	if err != nil {
		return StepResult{}, err
	}
	s := &stepper{tx: tx, o: o, rel: rel, root: o.TenantID, by: by}
	if o.State == corerollouts.Aborting {
		return s.abort(ctx)
	}
	return s.run(ctx)
}

func lockRollout(ctx context.Context, tx store.Tx, id string) (rolloutRow, error) {
	var o rolloutRow
	var acceptance []byte
	var timeoutS int
	err := tx.QueryRow(ctx, `SELECT id, tenant_id, state, release_id, pool_id, wave, waves, resumed_failed, failure_threshold,
		acceptance_command, node_timeout_s, rollback FROM rollouts WHERE id = $1 FOR UPDATE`, id).
		Scan(&o.ID, &o.TenantID, &o.State, &o.ReleaseID, &o.PoolID, &o.Wave, &o.Waves, &o.ResumedFailed, &o.Threshold,
			&acceptance, &timeoutS, &o.Rollback)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return rolloutRow{}, notFound(id)
		}
		return rolloutRow{}, err
	}
	o.Timeout = time.Duration(timeoutS) * time.Second
	if len(acceptance) > 0 && string(acceptance) != "null" {
		o.Acceptance = &Acceptance{}
		if err := json.Unmarshal(acceptance, o.Acceptance); err != nil {
			return rolloutRow{}, err
		}
	}
	return o, nil
}

type stepper struct {
	tx   store.Tx
	o    rolloutRow
	rel  Release
	root string
	by   string
	res  StepResult
}

// rows reads the rollout's nodes (of wave, or all when wave < 0), locked.
func (s *stepper) rows(ctx context.Context, wave int) ([]stepRow, error) {
	rows, err := s.tx.Query(ctx, `SELECT rn.node_id, rn.state, rn.error, rn.wave, rn.command_seq, rn.was_cordoned,
			rn.step_at < now() - make_interval(secs => $3), n.tenant_id, coalesce(n.drain_state, ''),
			coalesce(n.connectivity, ''), coalesce(n.agent_version, ''), coalesce(n.cordoned, false)
		FROM rollout_nodes rn LEFT JOIN nodes n ON n.id = rn.node_id AND n.deleted_at IS NULL
		WHERE rn.rollout_id = $1 AND ($2 < 0 OR rn.wave = $2) ORDER BY rn.node_id FOR UPDATE OF rn`,
		s.o.ID, wave, s.o.Timeout.Seconds())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []stepRow
	for rows.Next() {
		var r stepRow
		if err := rows.Scan(&r.NodeID, &r.State, &r.Error, &r.Wave, &r.CommandSeq, &r.WasCordoned, &r.Late, &r.TenantID,
			&r.DrainState, &r.Connectivity, &r.AgentVersion, &r.Cordoned); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func (s *stepper) set(ctx context.Context, r *stepRow, state, errText string, seq *int64) error {
	r.State = state
	_, err := s.tx.Exec(ctx, `UPDATE rollout_nodes SET state = $3, error = $4, command_seq = coalesce($5, command_seq),
		was_cordoned = $6, step_at = now() WHERE rollout_id = $1 AND node_id = $2`,
		s.o.ID, r.NodeID, state, errText, seq, r.WasCordoned)
	return err
}

// queue queues a command for r's node under the key <rolloutId>/<step>,
// lasting the node's deadline.
func (s *stepper) queue(ctx context.Context, r *stepRow, step, kind string, args any) (int64, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		return 0, err
	}
	notAfter := time.Now().Add(s.o.Timeout)
	c, err := store.QueueNodeCommand(ctx, s.tx, store.NodeCommand{NodeID: r.NodeID, TenantID: *r.TenantID, Kind: kind,
		Args: raw, NotAfter: &notAfter, CreatedBy: s.by}, s.o.ID+"/"+step)
	return c.Seq, err
}

// updateArgs are the agent.update args of release rel's bcd artifact.
func (s *stepper) updateArgs(ctx context.Context, rel Release) (protocol.AgentUpdateArgs, error) {
	var art Artifact
	for _, a := range rel.Artifacts {
		if a.Name == corerollouts.KindBCD {
			art = a
		}
	}
	im, err := images.Get(ctx, s.tx, s.root, art.ImageID)
	if err != nil {
		return protocol.AgentUpdateArgs{}, err
	}
	sig, err := images.Signature(ctx, s.tx, s.root, art.ImageID)
	if err != nil {
		return protocol.AgentUpdateArgs{}, err
	}
	signers, err := images.New(nil, s.root, "", 0).ListSigners(ctx, s.tx, "fleet")
	if err != nil {
		return protocol.AgentUpdateArgs{}, err
	}
	keys := make([]string, len(signers))
	for i, k := range signers {
		keys[i] = k.AuthorizedKey
	}
	return protocol.AgentUpdateArgs{ReleaseID: rel.ID, Artifact: art.Name, Version: rel.AgentVersion, SHA256: im.SHA256,
		SizeBytes: im.SizeBytes, Signature: sig, Signers: keys,
		ConfirmWithinSeconds: int(min(s.o.Timeout, 10*time.Minute) / time.Second / 2)}, nil
}

// finish uncordons a node the rollout cordoned (ending its drain) and
// records it succeeded.
func (s *stepper) finish(ctx context.Context, r *stepRow) error {
	if !r.WasCordoned && r.Cordoned {
		if _, err := nodes.SetCordon(ctx, s.tx, *r.TenantID, r.NodeID, false, s.by); err != nil {
			return err
		}
	}
	return s.set(ctx, r, corerollouts.NodeSucceeded, "", nil)
}

// command reads r's node command; nil while it has not finished.
func (s *stepper) command(ctx context.Context, r *stepRow) (*store.NodeCommand, error) {
	if r.CommandSeq == nil {
		return nil, fmt.Errorf("rollouts: node %s is %s without a command", r.NodeID, r.State)
	}
	c, err := store.NodeCommandBySeq(ctx, s.tx, r.NodeID, *r.CommandSeq)
	if err != nil {
		return nil, err
	}
	switch c.State {
	case store.CommandQueued, store.CommandDelivered, store.CommandRunning:
		return nil, nil
	}
	return &c, nil
}

// advance takes r one step in the current wave: start says a pending node
// may begin (the pool's budget has room), accept whether an updated node
// runs the acceptance check (not while aborting).
func (s *stepper) advance(ctx context.Context, r *stepRow, start, accept bool) error {
	if r.TenantID == nil {
		if corerollouts.NodeDone(r.State) {
			return nil
		}
		return s.set(ctx, r, corerollouts.NodeSkipped, "the node was deleted", nil)
	}
	switch r.State {
	case corerollouts.NodePending:
		if !start {
			return nil
		}
		r.WasCordoned = r.Cordoned
		if _, err := nodes.Drain(ctx, s.tx, *r.TenantID, r.NodeID, DrainMode, s.by); err != nil {
			var ce *core.Error
			if errors.As(err, &ce) && ce.Code == core.CodeInvalidState {
				return nil // the pool's budget is spent elsewhere: later
			}
			return err
		}
		s.res.Drains = append(s.res.Drains, DrainStart{TenantID: *r.TenantID, NodeID: r.NodeID})
		return s.set(ctx, r, corerollouts.NodeDraining, "", nil)
	case corerollouts.NodeDraining:
		switch {
		case r.DrainState == "drained":
			args, err := s.updateArgs(ctx, s.rel)
			if err != nil {
				return err
			}
			seq, err := s.queue(ctx, r, "update", store.CommandAgentUpdate, args)
			if err != nil {
				return err
			}
			return s.set(ctx, r, corerollouts.NodeUpdating, "", &seq)
		case r.DrainState == "":
			return s.set(ctx, r, corerollouts.NodeFailed, "the node's drain was ended (uncordoned) before the update", nil)
		case r.Late:
			return s.set(ctx, r, corerollouts.NodeFailed, fmt.Sprintf("the node did not drain within %s", s.o.Timeout), nil)
		default:
			// Started again each step (a running drain is kept): a worker
			// killed between the drain's commit and its workflow's start
			// does not strand the node.
			s.res.Drains = append(s.res.Drains, DrainStart{TenantID: *r.TenantID, NodeID: r.NodeID})
		}
	case corerollouts.NodeUpdating:
		c, err := s.command(ctx, r)
		if err != nil {
			return err
		}
		switch {
		case c != nil && c.State != store.CommandSucceeded:
			return s.set(ctx, r, corerollouts.NodeFailed, fmt.Sprintf("agent.update %s: %s", c.State, c.Error), nil)
		case c != nil && r.Connectivity == "connected" && r.AgentVersion == s.rel.AgentVersion:
			if accept && s.o.Acceptance != nil {
				seq, err := s.queue(ctx, r, "accept", store.CommandExec,
					nodes.ExecArgs{Argv: s.o.Acceptance.Argv, TimeoutSeconds: s.o.Acceptance.TimeoutSeconds})
				if err != nil {
					return err
				}
				return s.set(ctx, r, corerollouts.NodeChecking, "", &seq)
			}
			return s.finish(ctx, r)
		case r.Late:
			return s.set(ctx, r, corerollouts.NodeFailed, fmt.Sprintf("the node did not come back on %s within %s (connectivity %s, agent %s)",
				s.rel.AgentVersion, s.o.Timeout, r.Connectivity, r.AgentVersion), nil)
		}
	case corerollouts.NodeChecking:
		c, err := s.command(ctx, r)
		if err != nil {
			return err
		}
		switch {
		case c != nil && c.State == store.CommandSucceeded && c.ExitCode != nil && *c.ExitCode == 0:
			return s.finish(ctx, r)
		case c != nil:
			code := "none"
			if c.ExitCode != nil {
				code = fmt.Sprint(*c.ExitCode)
			}
			return s.set(ctx, r, corerollouts.NodeFailed, fmt.Sprintf("the acceptance command %s (exit %s) %s", c.State, code, c.Error), nil)
		case r.Late:
			return s.set(ctx, r, corerollouts.NodeFailed, fmt.Sprintf("the acceptance command did not finish within %s", s.o.Timeout), nil)
		}
	}
	return nil
}

func inFlight(state string) bool {
	return state == corerollouts.NodeDraining || state == corerollouts.NodeUpdating || state == corerollouts.NodeChecking
}

func (s *stepper) run(ctx context.Context) (StepResult, error) {
	s.res = StepResult{State: s.o.State, Wave: s.o.Wave}
	rows, err := s.rows(ctx, s.o.Wave)
	if err != nil {
		return StepResult{}, err
	}
	pool, err := pools.LoadByID(ctx, s.tx, s.o.PoolID)
	if err != nil {
		return StepResult{}, err
	}
	b, err := nodes.DrainBudget(ctx, s.tx, pool)
	if err != nil {
		return StepResult{}, err
	}
	flying := 0
	for _, r := range rows {
		if inFlight(r.State) {
			flying++
		}
	}
	// A paused rollout lets the nodes in flight finish, and starts none.
	paused := s.o.State != corerollouts.Running
	for i := range rows {
		r := &rows[i]
		was := inFlight(r.State)
		if err := s.advance(ctx, r, !paused && flying < b.Allowed, true); err != nil {
			return StepResult{}, fmt.Errorf("rollouts: %s node %s: %w", s.o.ID, r.NodeID, err)
		}
		if now := inFlight(r.State); now != was {
			if now {
				flying++
			} else {
				flying--
			}
		}
	}
	failed, done := 0, 0
	s.res.Counts = map[string]int{}
	for _, r := range rows {
		s.res.Counts[r.State]++
		if r.State == corerollouts.NodeFailed {
			failed++
		}
		if corerollouts.NodeDone(r.State) {
			done++
		}
	}
	if paused {
		return s.res, nil
	}
	if float64(failed-s.o.ResumedFailed) > s.o.Threshold*float64(len(rows)) {
		s.res.State = corerollouts.PausedOnFailure
		return s.res, setState(ctx, s.tx, s.o.ID, corerollouts.PausedOnFailure,
			fmt.Sprintf("wave %d: %d of %d nodes failed, above the threshold %g", s.o.Wave, failed, len(rows), s.o.Threshold))
	}
	if done < len(rows) {
		return s.res, nil
	}
	if s.o.Wave+1 >= s.o.Waves {
		s.res.State, s.res.Done = corerollouts.Succeeded, true
		return s.res, setState(ctx, s.tx, s.o.ID, corerollouts.Succeeded, "")
	}
	s.res.Wave, s.res.NextWave = s.o.Wave+1, true
	_, err = s.tx.Exec(ctx, `UPDATE rollouts SET wave = wave + 1, resumed_failed = 0, updated_at = now() WHERE id = $1`, s.o.ID)
	return s.res, err
}

func (s *stepper) abort(ctx context.Context) (StepResult, error) {
	s.res = StepResult{State: s.o.State, Wave: s.o.Wave}
	rows, err := s.rows(ctx, -1)
	if err != nil {
		return StepResult{}, err
	}
	var prev *Release
	if s.o.Rollback {
		if prev, err = previousRelease(ctx, s.tx, s.rel); err != nil {
			return StepResult{}, err
		}
	}
	flying := 0
	for i := range rows {
		r := &rows[i]
		switch {
		case r.TenantID == nil:
			err = s.advance(ctx, r, false, false)
		case r.State == corerollouts.NodePending:
			err = s.set(ctx, r, corerollouts.NodeSkipped, "the rollout was aborted", nil)
		case r.State == corerollouts.NodeDraining:
			// The update has not begun: end the drain the rollout began.
			if !r.WasCordoned {
				if _, err = nodes.SetCordon(ctx, s.tx, *r.TenantID, r.NodeID, false, s.by); err != nil {
					break
				}
			}
			err = s.set(ctx, r, corerollouts.NodeSkipped, "the rollout was aborted", nil)
		case inFlight(r.State):
			// An update in flight ends by its own result or deadline.
			err = s.advance(ctx, r, false, false)
		}
		if err != nil {
			return StepResult{}, fmt.Errorf("rollouts: aborting %s node %s: %w", s.o.ID, r.NodeID, err)
		}
		if inFlight(r.State) {
			flying++
			continue
		}
		if r.State == corerollouts.NodeSucceeded && prev != nil {
			args, err := s.updateArgs(ctx, *prev)
			if err != nil {
				return StepResult{}, err
			}
			seq, err := s.queue(ctx, r, "rollback", store.CommandAgentUpdate, args)
			if err != nil {
				return StepResult{}, err
			}
			if err := s.set(ctx, r, corerollouts.NodeRolledBack, "", &seq); err != nil {
				return StepResult{}, err
			}
		}
	}
	if flying > 0 {
		return s.res, nil
	}
	s.res.State, s.res.Done = corerollouts.Aborted, true
	return s.res, setState(ctx, s.tx, s.o.ID, corerollouts.Aborted, "aborted by the operator")
}
