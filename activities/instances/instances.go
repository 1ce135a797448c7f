package instances

import (
	"context"
	"fmt"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/drivers/providers"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/instances"
	"github.com/better-compute/better-compute/store/secrets"
)

// Instances are the instance workflow's activities. Each is one
// transaction, so a worker killed inside one leaves nothing behind.
type Instances struct {
	Store     *store.Store
	Temporal  client.Client
	TaskQueue string
	// Providers opens provider pools' accounts and Secrets resolves their
	// tokens and user data (provider pools only; without them a provider
	// instance's activity fails and is retried).
	Providers providers.Factory
	Secrets   *secrets.Vault
}

// ConvergeInstance moves the recorded state on what the node reported, and ends a
// deleted instance whose node no longer holds it (store/instances.Converge).
func (a *Instances) ConvergeInstance(ctx context.Context, id string) (Progress, error) {
	var p domain.Progress
	err := a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		p, err = domain.Converge(ctx, tx, id)
		return err
	})
	if err != nil {
		return Progress{}, err
	}
	out := Progress{State: p.State, Desired: p.Desired, Settled: p.Settled, Done: p.Done, ObservedError: p.ObservedError,
		Provider: p.PoolClass == domain.ClassProvider}
	if p.ConvergingSince > 0 {
		out.ConvergingFor = time.Since(time.UnixMilli(p.ConvergingSince))
	}
	return out, nil
}

// MarkInstanceFailed records that the instance did not converge in time.
func (a *Instances) MarkInstanceFailed(ctx context.Context, p MarkFailedParams) error {
	return a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		return domain.MarkFailed(ctx, tx, p.InstanceID, p.Reason, p.Message)
	})
}

// reconcilePage bounds the instances one page of the reconciler reads.
const reconcilePage = 500

// ReconcileGrace is how long an unstarted instance waits for the API's
// own start before the reconciler makes it.
const ReconcileGrace = 2 * time.Second

// ReconcileInstances starts the workflow of every live instance: one whose start
// was never recorded is started and recorded; one whose start was is
// started again, which keeps a running run and starts a closed one anew
// (terminated, cancelled or lost runs never strand a row). Then it sweeps
// drafts older than an hour. It answers how many rows it started.
func (a *Instances) ReconcileInstances(ctx context.Context) (int, error) {
	started, after := 0, ""
	for {
		var page []domain.Owed
		if err := a.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
			page, err = domain.OwedWorkflows(ctx, tx, ReconcileGrace, after, reconcilePage)
			return err
		}); err != nil {
			return started, err
		}
		for _, o := range page {
			if err := StartInstance(ctx, a.Temporal, a.TaskQueue, InstanceParams{TenantID: o.TenantID, InstanceID: o.ID, PoolID: o.PoolID}); err != nil {
				return started, fmt.Errorf("instances: starting %s: %w", o.ID, err)
			}
			if !o.Started {
				if err := domain.WorkflowStarted(ctx, a.Store.Pool, o.ID); err != nil {
					return started, err
				}
				started++
			}
		}
		if len(page) < reconcilePage {
			break
		}
		after = page[len(page)-1].ID
	}
	err := a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		_, err := domain.SweepDrafts(ctx, tx, time.Hour)
		return err
	})
	return started, err
}
