package sandboxes

import (
	"context"
	"fmt"
	"time"

	"go.temporal.io/sdk/client"

	instancesact "github.com/better-compute/better-compute/activities/instances"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	"github.com/better-compute/better-compute/store/instances"
	domain "github.com/better-compute/better-compute/store/sandboxes"
)

// Sandboxes are the sandbox workflow's activities. Each is one
// transaction, so a worker killed inside one leaves nothing behind.
type Sandboxes struct {
	Store     *store.Store
	Temporal  client.Client
	TaskQueue string
	// SandboxType is the sandbox type's full catalog name (the drafts'
	// authorization rows the sweep deletes), SnapshotType the snapshot
	// type's (a ttlAction snapshot's authorization row).
	SandboxType, SnapshotType string
	// Blobs holds snapshots' bytes: the reconciler removes those of
	// deleted and failed snapshots (nil: they are kept).
	Blobs blobs.Store
}

// Step runs one step of the sandbox's lifetime (store/sandboxes.Step) and,
// when the step ended the workload, tells the workload's workflow.
func (a *Sandboxes) Step(ctx context.Context, id string) (Progress, error) {
	var p domain.Progress
	if err := a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		p, err = domain.Step(ctx, tx, id, a.SnapshotType)
		return err
	}); err != nil {
		return Progress{}, err
	}
	if p.InstanceID != "" && a.Temporal != nil && p.State != "live" {
		if err := instancesact.Signal(ctx, a.Temporal, p.InstanceID, instancesact.SignalDesiredChanged); err != nil {
			return Progress{}, err
		}
	}
	return Progress{Ended: p.Ended, State: p.State, UntilDeadline: time.Duration(p.ExpiresAt-p.Now) * time.Millisecond}, nil
}

// TopUpWarmPool runs one step of the template's warm pool (store/sandboxes.TopUp)
// and starts the workflows of the workloads it placed (recording them) and
// signals those it deleted.
func (a *Sandboxes) TopUpWarmPool(ctx context.Context, templateID string) (WarmProgress, error) {
	var w domain.Warm
	if err := a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		w, err = domain.TopUp(ctx, tx, templateID)
		return err
	}); err != nil {
		return WarmProgress{}, err
	}
	for _, id := range w.Placed {
		if err := instancesact.StartInstance(ctx, a.Temporal, a.TaskQueue, instancesact.InstanceParams{TenantID: w.TenantID,
			InstanceID: id, PoolID: w.PoolID}); err != nil {
			return WarmProgress{}, err
		}
		if err := instances.WorkflowStarted(ctx, a.Store.Pool, id); err != nil {
			return WarmProgress{}, err
		}
	}
	for _, id := range w.Deleted {
		if err := instancesact.Signal(ctx, a.Temporal, id, instancesact.SignalDesiredChanged); err != nil {
			return WarmProgress{}, err
		}
	}
	return WarmProgress{Placed: len(w.Placed), Deleted: len(w.Deleted), Refused: w.Refused, Ended: w.Ended}, nil
}

// reconcilePage bounds one page of the reconciler.
const reconcilePage = 500

// ReconcileGrace is how long an unstarted sandbox waits for the API's own
// start before the reconciler makes it.
const ReconcileGrace = 2 * time.Second

// ReconcileSandboxes starts the workflows of live sandboxes and of warm
// pools: a closed run is started again, a running one kept (a warm pool's
// is signalled, so it tops up). Then it sweeps drafts older than an hour
// and removes the bytes of deleted and failed snapshots. It answers how
// many workflows it started.
func (a *Sandboxes) ReconcileSandboxes(ctx context.Context) (int, error) {
	started, after := 0, ""
	for {
		var page []domain.Owed
		if err := a.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
			page, err = domain.OwedWorkflows(ctx, tx, ReconcileGrace, true, after, reconcilePage)
			return err
		}); err != nil {
			return started, err
		}
		for _, o := range page {
			if err := StartSandbox(ctx, a.Temporal, a.TaskQueue, SandboxParams{TenantID: o.TenantID, SandboxID: o.SandboxID, PoolID: o.PoolID}); err != nil {
				return started, fmt.Errorf("sandboxes: starting %s: %w", o.SandboxID, err)
			}
			if err := domain.WorkflowStarted(ctx, a.Store.Pool, o.SandboxID); err != nil {
				return started, err
			}
			started++
			after = o.SandboxID
		}
		if len(page) < reconcilePage {
			break
		}
	}
	for after = ""; ; {
		var page []domain.WarmPool
		if err := a.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
			page, err = domain.WarmTemplates(ctx, tx, after, reconcilePage)
			return err
		}); err != nil {
			return started, err
		}
		for _, w := range page {
			if err := StartWarmPool(ctx, a.Temporal, a.TaskQueue, WarmPoolParams{TenantID: w.TenantID, TemplateID: w.TemplateID, PoolID: w.PoolID}); err != nil {
				return started, fmt.Errorf("sandboxes: starting %s's warm pool: %w", w.TemplateID, err)
			}
			started++
			after = w.TemplateID
		}
		if len(page) < reconcilePage {
			break
		}
	}
	if err := a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		_, err := domain.SweepDrafts(ctx, tx, a.SandboxType, time.Hour)
		return err
	}); err != nil {
		return started, err
	}
	return started, a.removeSnapshotBlobs(ctx)
}

// removeSnapshotBlobs removes the bytes of deleted and failed snapshots
// that nothing else of their tenant shares, then records each removal: a
// crash in between removes it again (a missing blob is no error).
func (a *Sandboxes) removeSnapshotBlobs(ctx context.Context) error {
	if a.Blobs == nil {
		return nil
	}
	for {
		list, err := domain.UnremovedBlobs(ctx, a.Store.Pool, reconcilePage)
		if err != nil {
			return err
		}
		for _, b := range list {
			if err := a.Blobs.Delete(ctx, blobs.Key{TenantID: b.TenantID, SHA256: b.SHA256}); err != nil {
				return fmt.Errorf("sandboxes: removing snapshot %s's bytes: %w", b.SnapshotID, err)
			}
			if err := domain.BlobRemoved(ctx, a.Store.Pool, b.SnapshotID); err != nil {
				return err
			}
		}
		if len(list) < reconcilePage {
			return nil
		}
	}
}
