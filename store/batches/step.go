package batches

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/ssh"

	corebatches "github.com/better-compute/better-compute/core/batches"
	"github.com/better-compute/better-compute/store"
)

// StepResult is what one Step did: the batch's state and wave after it,
// whether it moved to the next wave (step again at once), whether it is
// over, and the wave's nodes per state.
type StepResult struct {
	State    string         `json:"state"`
	Wave     int            `json:"wave"`
	NextWave bool           `json:"nextWave,omitempty"`
	Done     bool           `json:"done,omitempty"`
	Counts   map[string]int `json:"counts,omitempty"`
}

type stepBatch struct {
	id, tenantID, state string
	wave, waves         int
	maxFailures         int
	timeout             time.Duration
	commands            []corebatches.Command
	creator             store.Caller
}

type stepNode struct {
	nodeID, state string
	step          int
	seq           *int64
	results       []CommandResult
	late          bool
	live          bool // still a live node of the batch's tenant
}

// Step advances running batch id by its rows in tx, and is safe to repeat:
// every command is queued in the same transaction as the node row that
// records it, under the idempotency key <batchId>/<step>, with the audit
// row commands.run writes (under the batch's creator and the create's
// request). In the current wave it queues each pending node's first
// command, and on each running node whose command finished it records the
// result and queues the next (a command that failed, or an exec that
// exited non-zero, fails the node; one past the node timeout is cancelled
// and fails it). A node deleted or gone from the tenant is skipped. Past
// maxFailures failed nodes the batch starts no other node, and fails once
// the nodes in flight end; a finished wave moves it to the next; after
// the last it has succeeded, or failed when a node failed.
func Step(ctx context.Context, tx store.Tx, id string) (StepResult, error) {
	b, err := lockStep(ctx, tx, id)
	if err != nil {
		return StepResult{}, err
	}
	if b.state != Running {
		return StepResult{State: b.state, Wave: b.wave, Done: true}, nil
	}
	rows, err := stepNodes(ctx, tx, b)
	if err != nil {
		return StepResult{}, err
	}
	var failed int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM command_batch_nodes WHERE batch_id = $1 AND state = 'failed'`, id).Scan(&failed); err != nil {
		return StepResult{}, err
	}
	stopping := failed > b.maxFailures
	for i := range rows {
		n := &rows[i]
		was := n.state
		if err := advance(ctx, tx, b, n, !stopping); err != nil {
			return StepResult{}, fmt.Errorf("batches: %s node %s: %w", id, n.nodeID, err)
		}
		if n.state == NodeFailed && was != NodeFailed {
			failed++
			stopping = failed > b.maxFailures
		}
	}
	res := StepResult{State: Running, Wave: b.wave, Counts: map[string]int{}}
	flying, done := 0, 0
	for _, n := range rows {
		res.Counts[n.state]++
		switch n.state {
		case NodeRunning:
			flying++
		case NodeSucceeded, NodeFailed, NodeSkipped, NodeCancelled:
			done++
		}
	}
	if stopping {
		if _, err := tx.Exec(ctx, `UPDATE command_batch_nodes SET state = 'skipped', error = 'the batch stopped: too many nodes failed',
			step_at = now() WHERE batch_id = $1 AND state = 'pending'`, id); err != nil {
			return StepResult{}, err
		}
		if flying > 0 {
			return res, nil
		}
		res.State, res.Done = Failed, true
		return res, setState(ctx, tx, id, Failed, fmt.Sprintf("%d nodes failed, more than maxFailures %d", failed, b.maxFailures))
	}
	if done < len(rows) {
		return res, nil
	}
	if b.wave+1 < b.waves {
		res.Wave, res.NextWave = b.wave+1, true
		_, err := tx.Exec(ctx, `UPDATE command_batches SET wave = wave + 1, updated_at = now() WHERE id = $1`, id)
		return res, err
	}
	res.Done = true
	if failed > 0 {
		res.State = Failed
		return res, setState(ctx, tx, id, Failed, fmt.Sprintf("%d nodes failed", failed))
	}
	res.State = Succeeded
	return res, setState(ctx, tx, id, Succeeded, "")
}

func lockStep(ctx context.Context, tx store.Tx, id string) (stepBatch, error) {
	var b stepBatch
	var timeoutS int
	var cmds, creator []byte
	err := tx.QueryRow(ctx, `SELECT id, tenant_id, state, wave, (SELECT coalesce(max(wave), -1) + 1 FROM command_batch_nodes WHERE batch_id = $1),
			max_failures, node_timeout_s, commands, creator
		FROM command_batches WHERE id = $1 FOR UPDATE`, id).
		Scan(&b.id, &b.tenantID, &b.state, &b.wave, &b.waves, &b.maxFailures, &timeoutS, &cmds, &creator)
	if errors.Is(err, pgx.ErrNoRows) {
		return stepBatch{}, notFound(id)
	}
	if err != nil {
		return stepBatch{}, err
	}
	b.timeout = time.Duration(timeoutS) * time.Second
	if err := json.Unmarshal(cmds, &b.commands); err != nil {
		return stepBatch{}, err
	}
	return b, json.Unmarshal(creator, &b.creator)
}

// stepNodes reads the current wave's nodes, locked.
func stepNodes(ctx context.Context, tx store.Tx, b stepBatch) ([]stepNode, error) {
	rows, err := tx.Query(ctx, `SELECT bn.node_id, bn.state, bn.step, bn.command_seq, bn.results,
			coalesce(bn.step_at < now() - make_interval(secs => $3), false), n.id IS NOT NULL
		FROM command_batch_nodes bn
		LEFT JOIN nodes n ON n.id = bn.node_id AND n.deleted_at IS NULL AND n.tenant_id = $4
		WHERE bn.batch_id = $1 AND bn.wave = $2 ORDER BY bn.node_id FOR UPDATE OF bn`, b.id, b.wave, b.timeout.Seconds(), b.tenantID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (stepNode, error) {
		var n stepNode
		var results []byte
		if err := r.Scan(&n.nodeID, &n.state, &n.step, &n.seq, &results, &n.late, &n.live); err != nil {
			return stepNode{}, err
		}
		return n, json.Unmarshal(results, &n.results)
	})
}

func nodeDone(state string) bool {
	return state != NodePending && state != NodeRunning
}

// advance takes one node a step: start says a pending node may begin.
func advance(ctx context.Context, tx store.Tx, b stepBatch, n *stepNode, start bool) error {
	if nodeDone(n.state) {
		return nil
	}
	if !n.live {
		return setNode(ctx, tx, b, n, NodeSkipped, "the node was deleted or left the tenant")
	}
	if n.state == NodePending {
		if !start {
			return nil
		}
		return queue(ctx, tx, b, n, 0)
	}
	c, err := store.NodeCommandBySeq(ctx, tx, n.nodeID, *n.seq)
	if err != nil {
		return err
	}
	switch c.State {
	case store.CommandQueued, store.CommandDelivered, store.CommandRunning:
		if !n.late {
			return nil
		}
		if _, err := store.CancelNodeCommand(ctx, tx, c.TenantID, c.NodeID, c.ID); err != nil {
			return err
		}
		n.results = append(n.results, CommandResult{Kind: c.Kind, CommandID: c.ID, State: store.CommandCancelled,
			Error: "timed out"})
		return setNode(ctx, tx, b, n, NodeFailed, fmt.Sprintf("command %d (%s) did not finish within %s", n.step, c.Kind, b.timeout))
	}
	n.results = append(n.results, CommandResult{Kind: c.Kind, CommandID: c.ID, State: c.State, ExitCode: c.ExitCode, Error: c.Error})
	switch {
	case c.State != store.CommandSucceeded:
		return setNode(ctx, tx, b, n, NodeFailed, fmt.Sprintf("command %d (%s) %s: %s", n.step, c.Kind, c.State, c.Error))
	case c.ExitCode != nil && *c.ExitCode != 0:
		return setNode(ctx, tx, b, n, NodeFailed, fmt.Sprintf("command %d (%s) exited %d", n.step, c.Kind, *c.ExitCode))
	case n.step+1 < len(b.commands):
		return queue(ctx, tx, b, n, n.step+1)
	}
	return setNode(ctx, tx, b, n, NodeSucceeded, "")
}

// queue queues command step for n's node, lasting the node timeout, with
// commands.run's audit row, and records the node running it.
func queue(ctx context.Context, tx store.Tx, b stepBatch, n *stepNode, step int) error {
	cmd := b.commands[step]
	notAfter := time.Now().Add(b.timeout)
	c, err := store.QueueNodeCommand(ctx, tx, store.NodeCommand{NodeID: n.nodeID, TenantID: b.tenantID, Kind: cmd.Kind,
		Args: cmd.Args, NotAfter: &notAfter, CreatedBy: b.creator.IdentityID}, fmt.Sprintf("%s/%d", b.id, step))
	if err != nil {
		return err
	}
	if err := store.WriteAudit(ctx, tx, store.Audit{TenantID: b.tenantID, Method: "commands.run",
		ResourceType: "compute-node", ResourceID: n.nodeID, Caller: b.creator}); err != nil {
		return err
	}
	n.step, n.seq, n.state = step, &c.Seq, NodeRunning
	raw, err := json.Marshal(n.results)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE command_batch_nodes SET state = 'running', step = $3, command_seq = $4, results = $5, step_at = now()
		WHERE batch_id = $1 AND node_id = $2`, b.id, n.nodeID, step, c.Seq, raw)
	return err
}

func setNode(ctx context.Context, tx store.Tx, b stepBatch, n *stepNode, state, errText string) error {
	n.state = state
	raw, err := json.Marshal(n.results)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE command_batch_nodes SET state = $3, error = $4, results = $5, step_at = now()
		WHERE batch_id = $1 AND node_id = $2`, b.id, n.nodeID, state, errText, raw)
	return err
}

func parseKey(authorized string) (ssh.PublicKey, error) {
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(authorized))
	if err != nil {
		return nil, fmt.Errorf("batches: a registered approver key does not parse: %w", err)
	}
	return pub, nil
}
