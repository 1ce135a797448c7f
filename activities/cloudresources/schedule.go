package cloudresources

import (
	"context"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/cloudresources"
)

// reconcilePage bounds the resources one page of the reconciler reads.
const reconcilePage = 500

// reconcileGrace is how long an unstarted resource waits for the API's
// own start before the reconciler makes it.
const reconcileGrace = 2 * time.Second

// ReconcileResources starts the workflow of every live resource (a running one
// is kept, a closed one started anew, an unrecorded start recorded), then
// sweeps drafts older than an hour. It answers how many rows it started.
func (a *Resources) ReconcileResources(ctx context.Context) (int, error) {
	started, after := 0, ""
	for {
		var page []domain.Owed
		if err := a.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
			page, err = domain.OwedWorkflows(ctx, tx, reconcileGrace, after, reconcilePage)
			return err
		}); err != nil {
			return started, err
		}
		for _, o := range page {
			if err := a.StartWorkflow(ctx, ResourceParams{TenantID: o.TenantID, ResourceID: o.ID}); err != nil {
				return started, fmt.Errorf("cloud resources: starting %s: %w", o.ID, err)
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
