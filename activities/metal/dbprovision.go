package metal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/images"
	domain "github.com/better-compute/better-compute/store/metal"
	nodestore "github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/workflows"
)

var _ ProvisionStore = (*DBStore)(nil)

// commandCreator is who the node commands a workflow's node steps queue
// are created by.
const commandCreator = "workflow"

// LoadWorkflow implements ProvisionStore.
func (s *DBStore) LoadWorkflow(ctx context.Context, tenantID, nodeID string, opSeq int64) (WorkflowRun, error) {
	var out WorkflowRun
	err := s.tx(ctx, func(tx store.Tx) error {
		w, err := workflows.ForOperation(ctx, tx, tenantID, nodeID, opSeq)
		if err != nil {
			return err
		}
		out = WorkflowRun{ID: w.ID, TenantID: w.TenantID, NodeID: w.NodeID, State: w.State, Context: w.Context(),
			PauseRequested: w.PauseRequested, Steps: make([]StepRun, len(w.Steps))}
		for i, st := range w.Steps {
			out.Steps[i] = StepRun{Step: st.Spec(), State: st.State, Attempts: st.Attempts, Output: st.Output, Error: st.Error}
		}
		return nil
	})
	return out, err
}

// BeginStep implements ProvisionStore: the step's attempt and the node's
// step in flight (node_metal.step, with its event) in one transaction.
func (s *DBStore) BeginStep(ctx context.Context, tenantID, workflowID string, opSeq int64, index int) (StepStart, error) {
	var out StepStart
	err := s.tx(ctx, func(tx store.Tx) error {
		st, err := workflows.BeginStep(ctx, tx, tenantID, workflowID, opSeq, index)
		if err != nil {
			return err
		}
		out = StepStart{Paused: st.Paused, Attempt: st.Attempt, Deadline: st.Deadline}
		if st.Paused {
			return nil
		}
		nodeID, err := workflowNode(ctx, tx, tenantID, workflowID)
		if err != nil {
			return err
		}
		return domain.SetStep(ctx, tx, nodeID, opSeq, st.Step)
	})
	return out, err
}

func workflowNode(ctx context.Context, tx store.Tx, tenantID, workflowID string) (string, error) {
	var nodeID string
	err := tx.QueryRow(ctx, `SELECT node_id FROM workflows WHERE tenant_id = $1 AND id = $2`, tenantID, workflowID).Scan(&nodeID)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", workflows.NotFound(workflowID)
	}
	return nodeID, err
}

// EndStep implements ProvisionStore.
func (s *DBStore) EndStep(ctx context.Context, tenantID, workflowID string, opSeq int64, index int, o StepOutcome) error {
	return s.tx(ctx, func(tx store.Tx) error {
		return workflows.EndStep(ctx, tx, tenantID, workflowID, opSeq, index,
			workflows.Outcome{OK: o.OK, Final: o.Final, Output: o.Output, Error: o.Error, Reason: o.Reason})
	})
}

// CheckImage implements ProvisionStore: the image as the workflow's
// tenant sees it now, against the digest the workflow pinned.
func (s *DBStore) CheckImage(ctx context.Context, tenantID, workflowID string) (string, error) {
	var why string
	err := s.tx(ctx, func(tx store.Tx) error {
		w, err := workflows.Read(ctx, tx, tenantID, workflowID)
		if err != nil {
			return err
		}
		c := w.Context()
		if c.Image == nil {
			why = "the workflow names no image"
			return nil
		}
		im, err := images.Get(ctx, tx, tenantID, c.Image.ID)
		var e *core.Error
		switch {
		case errors.As(err, &e) && e.Code == core.CodeNotFound:
			why = fmt.Sprintf("image %s@%s (%s) is gone", c.Image.Name, c.Image.Version, c.Image.ID)
			return nil
		case err != nil:
			return err
		}
		switch {
		case im.SHA256 != c.Image.SHA256:
			why = fmt.Sprintf("image %s@%s changed: its digest is %s, the workflow pinned %s", im.Name, im.Version, im.SHA256, c.Image.SHA256)
		case !im.Deployable(false):
			why = fmt.Sprintf("image %s@%s is %s, not available", im.Name, im.Version, im.State)
		case c.RequireVerified && !im.Verified:
			why = fmt.Sprintf("image %s@%s is not verified, and the profile or pool admits verified images only", im.Name, im.Version)
		}
		return nil
	})
	return why, err
}

// Accept implements ProvisionStore.
func (s *DBStore) Accept(ctx context.Context, tenantID, workflowID string) ([]string, error) {
	var out []string
	err := s.tx(ctx, func(tx store.Tx) (err error) {
		out, err = workflows.Accept(ctx, tx, tenantID, workflowID)
		return err
	})
	return out, err
}

// EnqueueNodeCommand implements ProvisionStore: a node command with the
// key as its idempotency key, so a retried activity finds its command.
func (s *DBStore) EnqueueNodeCommand(ctx context.Context, tenantID, nodeID, key, kind string, args map[string]any) (string, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		return "", err
	}
	var id string
	err = s.tx(ctx, func(tx store.Tx) error {
		c, err := nodestore.RunCommand(ctx, tx, tenantID, nodeID, nodestore.NewCommand{Kind: kind, Args: raw,
			IdempotencyKey: key, CreatedBy: commandCreator})
		id = c.ID
		return err
	})
	return id, err
}

// NodeCommand implements ProvisionStore.
func (s *DBStore) NodeCommand(ctx context.Context, tenantID, commandID string) (CommandOutcome, error) {
	var out CommandOutcome
	err := s.tx(ctx, func(tx store.Tx) error {
		var nodeID string
		err := tx.QueryRow(ctx, `SELECT node_id FROM node_commands WHERE tenant_id = $1 AND id = $2`, tenantID, commandID).Scan(&nodeID)
		if errors.Is(err, pgx.ErrNoRows) {
			return core.Errorf(core.CodeNotFound, "command %s not found", commandID)
		}
		if err != nil {
			return err
		}
		c, err := nodestore.GetCommand(ctx, tx, tenantID, nodeID, commandID)
		if err != nil {
			return err
		}
		out = commandOutcome(c)
		return nil
	})
	return out, err
}

// commandOutcome reads a command's state as a node step awaits it: done
// once the agent answered (or it can no longer run), ok when it succeeded
// with exit code 0.
func commandOutcome(c nodestore.Command) CommandOutcome {
	var out CommandOutcome
	switch c.State {
	case store.CommandSucceeded:
		out.Done, out.OK = true, c.ExitCode == nil || *c.ExitCode == 0
	case store.CommandFailed, store.CommandSkipped, store.CommandCancelled, store.CommandExpired:
		out.Done = true
	default:
		return out
	}
	out.Output = workflows.Clip(c.Stdout, provisioning.MaxOutputBytes)
	out.Error = c.Error
	if !out.OK && out.Error == "" {
		out.Error = c.State
		if c.ExitCode != nil {
			out.Error = fmt.Sprintf("%s (exit code %d)", c.State, *c.ExitCode)
		}
		if c.Stderr != "" {
			out.Error += ": " + workflows.Clip(c.Stderr, 1<<10)
		}
	}
	return out
}
