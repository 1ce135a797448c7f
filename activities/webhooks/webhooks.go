// Package webhooks holds the activities of the webhook delivery workflow
// (workflows/webhooks) and the names both sides and the API use.
package webhooks

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/activities/visibility"
	rules "github.com/better-compute/better-compute/core/webhooks"
	sender "github.com/better-compute/better-compute/drivers/webhooks"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/secrets"
	domain "github.com/better-compute/better-compute/store/webhooks"
)

// Names as registered; they are persisted in workflow histories, so they
// never change.
const (
	WorkflowName    = "WebhookWorkflow"
	ActivityDeliver = "WebhookDeliver"
	// SignalChanged wakes a webhook's workflow: it was created, changed,
	// pinged or a delivery redelivered.
	SignalChanged = "changed"

	ReconcileWorkflowName = "ReconcileWebhooksWorkflow"
	ReconcileScheduleID   = "webhooks-reconciler"
	ActivityReconcile     = "WebhooksReconcile"
)

// DefaultIdlePoll is how often an idle webhook's workflow looks for new
// events.
const DefaultIdlePoll = 2 * time.Second

// Params are a webhook workflow's input.
type Params struct {
	WebhookID string
	TenantID  string
	// IdlePoll overrides DefaultIdlePoll (tests, the dev stack).
	IdlePoll time.Duration
}

// Step is what one Deliver did: the deliveries it sent, and how long the
// workflow waits before the next (a retry's backoff, or the idle poll).
// Gone: the webhook was deleted, the workflow ends.
type Step struct {
	Sent int
	Wait time.Duration
	Gone bool
}

// Bounds of one Deliver: it returns to the workflow after this many
// deliveries or this long, so the workflow's history records progress.
const (
	stepDeliveries = 200
	stepTime       = 30 * time.Second
)

// Webhooks is the activity side of the delivery workflow.
type Webhooks struct {
	Store  *store.Store
	Vault  *secrets.Vault
	Sender *sender.Sender
	// Temporal and TaskQueue start the workflows the reconciler owes.
	Temporal  client.Client
	TaskQueue string
	IdlePoll  time.Duration
	// Backoff is the wait after failed attempt n (nil: rules.RetryAfter
	// with jitter; tests shorten it).
	Backoff func(n int) time.Duration
}

func (a *Webhooks) backoff(n int) time.Duration {
	if a.Backoff != nil {
		return a.Backoff(n)
	}
	return rules.RetryAfter(n, rand.Float64())
}

// WebhookDeliver takes the events after the webhook's cursor into its
// deliveries and sends them, oldest first, one at a time, until none is
// due, one fails (its retry is scheduled) or the step's bounds are spent.
func (a *Webhooks) WebhookDeliver(ctx context.Context, p Params) (Step, error) {
	idle := p.IdlePoll
	if idle <= 0 {
		idle = DefaultIdlePoll
	}
	var step Step
	began := time.Now()
	for step.Sent < stepDeliveries && time.Since(began) < stepTime {
		var out *domain.Outgoing
		var due time.Duration
		err := a.Store.InTx(ctx, pgx.TxOptions{}, func(tx store.Tx) error {
			_, gone, err := domain.FanOut(ctx, tx, p.WebhookID)
			if err != nil || gone {
				step.Gone = gone
				return err
			}
			out, due, err = domain.Next(ctx, tx, a.Vault, p.WebhookID)
			return err
		})
		if err != nil || step.Gone {
			return step, err
		}
		if out == nil {
			// Nothing due: the head's retry (nothing may pass it: order), or
			// the idle poll.
			step.Wait = idle
			if due > 0 {
				step.Wait = due
			}
			return step, nil
		}
		res := a.Sender.Send(ctx, sender.Message{URL: out.URL, ID: out.DeliveryID, Body: out.Body, Secrets: out.Secrets})
		activity.RecordHeartbeat(ctx, out.DeliveryID)
		var state string
		err = a.Store.InTx(ctx, pgx.TxOptions{}, func(tx store.Tx) (err error) {
			state, err = domain.Record(ctx, tx, out.DeliveryID, out.Attempt,
				domain.Result{Status: res.Status, Latency: res.Latency, Response: res.Response, Err: res.Err, OK: res.OK},
				a.backoff(out.Attempt))
			return err
		})
		if err != nil {
			return step, fmt.Errorf("webhooks: recording %s: %w", out.DeliveryID, err)
		}
		if !res.OK && state == "pending" {
			// Its retry is due later: the next step finds how long.
			return step, nil
		}
		step.Sent++
	}
	return step, nil
}

// reconcilePage bounds the webhooks one reconciliation starts.
const reconcilePage = 1000

// WebhooksReconcile starts the workflow of every live webhook (a running
// one is kept) and answers how many it asked for.
func (a *Webhooks) WebhooksReconcile(ctx context.Context) (int, error) {
	var live []string
	if err := a.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		live, err = domain.Live(ctx, tx, reconcilePage)
		return err
	}); err != nil {
		return 0, err
	}
	for _, id := range live {
		if err := Start(ctx, a.Temporal, a.TaskQueue, Params{WebhookID: id, IdlePoll: a.IdlePoll}, false); err != nil {
			return 0, fmt.Errorf("webhooks: starting %s: %w", id, err)
		}
	}
	return len(live), nil
}

// Start starts the webhook's workflow (id = the webhook id) unless it
// runs; wake also signals it, so a running one looks at once.
func Start(ctx context.Context, c client.Client, taskQueue string, p Params, wake bool) error {
	opts := client.StartWorkflowOptions{
		ID:                       p.WebhookID,
		TaskQueue:                taskQueue,
		Memo:                     visibility.Fields{TenantID: p.TenantID}.Memo("webhook"),
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}
	var err error
	if wake {
		_, err = c.SignalWithStartWorkflow(ctx, p.WebhookID, SignalChanged, nil, opts, WorkflowName, p)
	} else {
		_, err = c.ExecuteWorkflow(ctx, opts, WorkflowName, p)
	}
	return err
}
