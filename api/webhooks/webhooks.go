// Package webhooks describes the webhooks.* methods: a tenant's
// subscriptions to its events, delivered signed and in order by one
// workflow per webhook (docs/webhooks.md).
package webhooks

import (
	"context"

	act "github.com/better-compute/better-compute/activities/webhooks"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	rules "github.com/better-compute/better-compute/core/webhooks"
	sender "github.com/better-compute/better-compute/drivers/webhooks"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/webhooks"
)

// Webhook is a subscription, never with its secret.
type Webhook = domain.Webhook

// Delivery is one message to a webhook with its last attempts.
type Delivery = domain.Delivery

// EventType is one event type a webhook may subscribe to.
type EventType = rules.EventType

// CreateInput is webhooks.create's input.
type CreateInput struct {
	TenantID    string   `json:"tenantId" jsonschema:"required" id:"tenant"`
	URL         string   `json:"url" jsonschema:"required,minLength=8,maxLength=2048" jsonschema_description:"Where deliveries are POSTed: https (http only to loopback in the dev stack); a host resolving to a private, loopback or link-local address is refused."`
	EventTypes  []string `json:"eventTypes" jsonschema:"required,minItems=1,maxItems=64,uniqueItems=true" jsonschema_description:"Event types (webhooks.eventTypes), prefixes ending in .* (reservation.*), or *."`
	Description string   `json:"description,omitempty" jsonschema:"maxLength=1024"`
}

// Created is webhooks.create's and webhooks.rotateSecret's answer: the
// webhook and its signing secret, shown this once.
type Created struct {
	Webhook Webhook `json:"webhook"`
	Secret  string  `json:"secret"`
}

// WebhookInput names one webhook.
type WebhookInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	WebhookID string `json:"webhookId" jsonschema:"required" id:"whk"`
}

// UpdateInput is webhooks.update's input; fields left out are kept.
// enabled true makes a failing or disabled webhook active again.
type UpdateInput struct {
	TenantID    string   `json:"tenantId" jsonschema:"required" id:"tenant"`
	WebhookID   string   `json:"webhookId" jsonschema:"required" id:"whk"`
	URL         *string  `json:"url,omitempty" jsonschema:"minLength=8,maxLength=2048"`
	EventTypes  []string `json:"eventTypes,omitempty" jsonschema:"minItems=1,maxItems=64,uniqueItems=true"`
	Description *string  `json:"description,omitempty" jsonschema:"maxLength=1024"`
	Enabled     *bool    `json:"enabled,omitempty"`
}

// ListInput is webhooks.list's input.
type ListInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	rpc.ListInput
}

// List is webhooks.list's answer.
type List struct {
	Items      []Webhook `json:"items"`
	NextCursor string    `json:"nextCursor,omitempty"`
}

// DeliveriesInput is webhooks.deliveries's input.
type DeliveriesInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	WebhookID string `json:"webhookId" jsonschema:"required" id:"whk"`
	rpc.ListInput
}

// Deliveries is webhooks.deliveries's answer, newest first.
type Deliveries struct {
	Items      []Delivery `json:"items"`
	NextCursor string     `json:"nextCursor,omitempty"`
}

// RedeliverInput names one delivery of a webhook.
type RedeliverInput struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	WebhookID  string `json:"webhookId" jsonschema:"required" id:"whk"`
	DeliveryID string `json:"deliveryId" jsonschema:"required" id:"msg"`
}

// EventTypes is webhooks.eventTypes's answer: every type, one answer.
type EventTypes struct {
	Types []EventType `json:"types"`
}

// The methods.
const (
	Create         rpc.Ref[CreateInput, Created]        = "webhooks.create"
	ListMethod     rpc.Ref[ListInput, List]             = "webhooks.list"
	Get            rpc.Ref[WebhookInput, Webhook]       = "webhooks.get"
	Update         rpc.Ref[UpdateInput, Webhook]        = "webhooks.update"
	RotateSecret   rpc.Ref[WebhookInput, Created]       = "webhooks.rotateSecret"
	Delete         rpc.Ref[WebhookInput, Webhook]       = "webhooks.delete"
	Ping           rpc.Ref[WebhookInput, Delivery]      = "webhooks.ping"
	DeliveriesList rpc.Ref[DeliveriesInput, Deliveries] = "webhooks.deliveries"
	Redeliver      rpc.Ref[RedeliverInput, Delivery]    = "webhooks.redeliver"
	EventTypesList rpc.Ref[rpc.TenantInput, EventTypes] = "webhooks.eventTypes"
)

const action, decidedOn, phase = "compute:webhooks:manage", "compute-tenant", "v0.3"

// Methods describes the webhooks.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	urls := sender.New(d.WebhookLoopback, 0)
	// wake starts or signals the webhook's workflow once the change
	// committed. The change stands if that fails: the reconciler starts the
	// workflow within a minute, so the call still succeeds.
	wake := func(ctx context.Context, c *rpc.Call, id string) error {
		if d.Temporal == nil {
			return nil
		}
		if err := act.Start(ctx, d.Temporal, d.TaskQueue, act.Params{WebhookID: id, TenantID: c.TenantID}, true); err != nil && d.Logger != nil {
			d.Logger.Warn("webhooks: waking the workflow failed; the reconciler will start it", "webhook", id, "error", err)
		}
		return nil
	}
	return []rpc.Descriptor{
		&rpc.Method[CreateInput, Created]{Name: Create, Action: action, DecidedOn: decidedOn, Phase: phase, Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in CreateInput) (Created, error) {
				if err := urls.CheckURL(ctx, in.URL); err != nil {
					return Created{}, err
				}
				w, secret, err := domain.Create(ctx, tx, d.Secrets, c.TenantID, c.Caller.IdentityID,
					domain.New{URL: in.URL, Description: in.Description, EventTypes: in.EventTypes})
				return Created{Webhook: w, Secret: secret}, err
			},
			After: func(ctx context.Context, c *rpc.Call, in CreateInput, out Created) (Created, error) {
				return out, wake(ctx, c, out.Webhook.ID)
			}},
		&rpc.Method[ListInput, List]{Name: ListMethod, Action: action, DecidedOn: decidedOn, Phase: phase, Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListInput) (List, error) {
				q, err := in.Page()
				if err != nil {
					return List{}, err
				}
				rows, err := domain.List(ctx, tx, c.TenantID, q)
				if err != nil {
					return List{}, err
				}
				items, next := rpc.Paged(rows, q, Webhook.Key)
				return List{Items: items, NextCursor: next}, nil
			}},
		&rpc.Method[WebhookInput, Webhook]{Name: Get, Action: action, DecidedOn: decidedOn, Phase: phase, Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in WebhookInput) (Webhook, error) {
				return domain.Get(ctx, tx, c.TenantID, in.WebhookID)
			}},
		&rpc.Method[UpdateInput, Webhook]{Name: Update, Action: action, DecidedOn: decidedOn, Phase: phase, Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in UpdateInput) (Webhook, error) {
				if in.URL != nil {
					if err := urls.CheckURL(ctx, *in.URL); err != nil {
						return Webhook{}, err
					}
				}
				return domain.Update(ctx, tx, c.TenantID, in.WebhookID,
					domain.Change{URL: in.URL, Description: in.Description, EventTypes: in.EventTypes, Enabled: in.Enabled})
			},
			After: func(ctx context.Context, c *rpc.Call, in UpdateInput, out Webhook) (Webhook, error) {
				return out, wake(ctx, c, out.ID)
			}},
		&rpc.Method[WebhookInput, Created]{Name: RotateSecret, Action: action, DecidedOn: decidedOn, Phase: phase, Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in WebhookInput) (Created, error) {
				w, secret, err := domain.RotateSecret(ctx, tx, d.Secrets, c.TenantID, in.WebhookID)
				return Created{Webhook: w, Secret: secret}, err
			}},
		&rpc.Method[WebhookInput, Webhook]{Name: Delete, Action: action, DecidedOn: decidedOn, Phase: phase, Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in WebhookInput) (Webhook, error) {
				return domain.Delete(ctx, tx, c.TenantID, in.WebhookID)
			},
			After: func(ctx context.Context, c *rpc.Call, in WebhookInput, out Webhook) (Webhook, error) {
				return out, wake(ctx, c, out.ID) // it sees the deletion and ends
			}},
		&rpc.Method[WebhookInput, Delivery]{Name: Ping, Action: action, DecidedOn: decidedOn, Phase: phase, Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in WebhookInput) (Delivery, error) {
				return domain.Ping(ctx, tx, c.TenantID, in.WebhookID)
			},
			After: func(ctx context.Context, c *rpc.Call, in WebhookInput, out Delivery) (Delivery, error) {
				return out, wake(ctx, c, in.WebhookID)
			}},
		&rpc.Method[DeliveriesInput, Deliveries]{Name: DeliveriesList, Action: action, DecidedOn: decidedOn, Phase: phase, Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in DeliveriesInput) (Deliveries, error) {
				q, err := in.Page()
				if err != nil {
					return Deliveries{}, err
				}
				rows, err := domain.Deliveries(ctx, tx, c.TenantID, in.WebhookID, q)
				if err != nil {
					return Deliveries{}, err
				}
				items, next := rpc.Paged(rows, q, Delivery.Key)
				return Deliveries{Items: items, NextCursor: next}, nil
			}},
		&rpc.Method[RedeliverInput, Delivery]{Name: Redeliver, Action: action, DecidedOn: decidedOn, Phase: phase, Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in RedeliverInput) (Delivery, error) {
				return domain.Redeliver(ctx, tx, c.TenantID, in.WebhookID, in.DeliveryID)
			},
			After: func(ctx context.Context, c *rpc.Call, in RedeliverInput, out Delivery) (Delivery, error) {
				return out, wake(ctx, c, in.WebhookID)
			}},
		&rpc.Method[rpc.TenantInput, EventTypes]{Name: EventTypesList, Action: action, DecidedOn: decidedOn, Phase: "served, no §9.2 row", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in rpc.TenantInput) (EventTypes, error) {
				return EventTypes{Types: rules.EventTypes()}, nil
			}},
	}
}
