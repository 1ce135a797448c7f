// Package instances describes the instances.* methods. create is an
// admission: transaction 1 writes the draft and its authorization row
// (decided on with vcpu, memoryGiB, gpus, imageId, imageVerified and
// projectId), transaction 2 places it (a vps-host node's allocation, or
// nothing on a provider pool). start, stop, resize and delete change the
// desired state in the database (core/instances' table says in which
// states), then signal the instance's workflow, which converges the
// observed state on it.
package instances

import (
	"context"
	"time"

	instancesact "github.com/better-compute/better-compute/activities/instances"
	"github.com/better-compute/better-compute/activities/visibility"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	states "github.com/better-compute/better-compute/core/instances"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/instances"
	pooldomain "github.com/better-compute/better-compute/store/pools"
)

// Instance is an instance as the methods answer it.
type Instance = domain.Instance

// InstanceList is instances.list's answer.
type InstanceList struct {
	Items      []Instance `json:"items"`
	NextCursor string     `json:"nextCursor,omitempty"`
}

// CreateInput is instances.create's input. userData is plain text or a
// secret:// reference of the tenant (then the call also needs
// compute:secrets:manage); command (container flavors only) replaces the
// image's /sbin/init.
type CreateInput struct {
	TenantID       string `json:"tenantId" jsonschema:"required" id:"tenant"`
	IdempotencyKey string `json:"idempotencyKey" jsonschema:"required" id:"tenant"`
	PoolID         string `json:"poolId" jsonschema:"required" id:"pool"`
	FlavorID       string `json:"flavorId" jsonschema:"required" id:"flv"`
	// ImageID (vps-host pools) or ProviderImage (provider pools: a slug or
	// id that providerAccounts.offers lists), exactly one.
	ImageID       string   `json:"imageId,omitempty" id:"img"`
	ProviderImage string   `json:"providerImage,omitempty" jsonschema:"maxLength=100,pattern=^[a-z0-9][a-z0-9._-]*$"`
	Name          string   `json:"name" jsonschema:"required,minLength=1,maxLength=63,pattern=^[a-z0-9]([a-z0-9-]{0\\,61}[a-z0-9])?$"`
	ProjectID     string   `json:"projectId,omitempty" id:"prj"`
	UserData      string   `json:"userData,omitempty" jsonschema:"maxLength=65536"`
	Command       []string `json:"command,omitempty" jsonschema:"maxItems=64" jsonschema_description:"Replaces the image's /sbin/init; each argument at most 4096 bytes."`
	ReservationID string   `json:"reservationId,omitempty" id:"rsv"`
}

// InstanceInput names one instance.
type InstanceInput struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	InstanceID string `json:"instanceId" jsonschema:"required" id:"inst"`
}

// ResizeInput is instances.resize's input: a flavor of the instance's pool.
type ResizeInput struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	InstanceID string `json:"instanceId" jsonschema:"required" id:"inst"`
	FlavorID   string `json:"flavorId" jsonschema:"required" id:"flv"`
}

// ListInput is instances.list's input. Scope mine (the default) keeps the
// caller's own instances; deleted ones are listed only with state deleted.
type ListInput struct {
	TenantID  string       `json:"tenantId" jsonschema:"required" id:"tenant"`
	Scope     string       `json:"scope,omitempty" jsonschema:"enum=mine,enum=all"`
	State     states.State `json:"state,omitempty"`
	PoolID    string       `json:"poolId,omitempty" id:"pool"`
	ProjectID string       `json:"projectId,omitempty" id:"prj"`
	rpc.ListInput
}

// The methods.
const (
	Create rpc.Ref[CreateInput, Instance]   = "instances.create"
	Get    rpc.Ref[InstanceInput, Instance] = "instances.get"
	List   rpc.Ref[ListInput, InstanceList] = "instances.list"
	Start  rpc.Ref[InstanceInput, Instance] = "instances.start"
	Stop   rpc.Ref[InstanceInput, Instance] = "instances.stop"
	Resize rpc.Ref[ResizeInput, Instance]   = "instances.resize"
	Delete rpc.Ref[InstanceInput, Instance] = "instances.delete"
)

type methods struct{ d rpc.Deps }

func (m methods) types() domain.Types {
	return domain.Types{Instance: m.d.Catalog.FullName(domain.ResourceType), Pool: m.d.Catalog.FullName(pooldomain.ResourceType)}
}

// Methods describes the instances.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	m := methods{d}
	change := func(name rpc.Ref[InstanceInput, Instance], action string, method states.Method) rpc.Descriptor {
		return &rpc.Method[InstanceInput, Instance]{Name: name, Action: action, DecidedOn: "compute-instance",
			Phase: "v0.3", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in InstanceInput) (Instance, error) {
				out, _, err := domain.Change(ctx, tx, c.TenantID, in.InstanceID, method)
				return out, err
			},
			After: m.signal}
	}
	return []rpc.Descriptor{
		&rpc.Method[CreateInput, Instance]{Name: Create,
			Action:    "compute:instances:create, and compute:secrets:manage when userData is a secret:// reference",
			DecidedOn: "compute-instance (the draft); the secrets decision on compute-tenant, plus compute-fleet in the root tenant",
			Phase:     "v0.3", Kind: core.KindAdmission,
			Admission: &rpc.Admission[CreateInput, Instance]{
				Prepare: func(ctx context.Context, c *rpc.Call, tx store.Tx, draftID string, in CreateInput) (iam.Resource, error) {
					row, err := domain.Draft(ctx, tx, m.types(), c.TenantID, draftID, c.Caller.IdentityID, domain.Request{
						PoolID: in.PoolID, FlavorID: in.FlavorID, ImageID: in.ImageID, ProviderImage: in.ProviderImage, Name: in.Name, ProjectID: in.ProjectID,
						UserData: in.UserData, Command: in.Command, ReservationID: in.ReservationID})
					return iam.Resource{Type: row.Type, ID: row.ID}, err
				},
				Also: m.secretsDecision,
				Complete: func(ctx context.Context, c *rpc.Call, tx store.Tx, in CreateInput) (Instance, error) {
					return domain.Place(ctx, tx, c.TenantID, c.Resource.ID)
				},
				Denied: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ CreateInput) error {
					return domain.Deny(ctx, tx, c.TenantID, c.Resource.ID)
				},
				Failed: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ CreateInput, cause error) error {
					return domain.Fail(ctx, tx, c.TenantID, c.Resource.ID, cause)
				},
				Started: m.started,
			}},
		&rpc.Method[InstanceInput, Instance]{Name: Get, Action: "compute:instances:read", DecidedOn: "compute-instance",
			Phase: "v0.3", Kind: core.KindRead,
			Read: func(c *rpc.Call, b *store.Batch, in InstanceInput) func() (Instance, error) {
				return domain.QueueLoad(b, c.TenantID, in.InstanceID)
			}},
		// Newest first: creation millisecond, then id, both descending.
		&rpc.Method[ListInput, InstanceList]{Name: List, Action: "compute:instances:read", DecidedOn: "compute-tenant + items",
			Phase: "v0.3", Kind: core.KindRead,
			List: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListInput) (rpc.Page, error) {
				q, err := in.Page()
				if err != nil {
					return rpc.Page{}, err
				}
				f := domain.Filter{State: string(in.State), PoolID: in.PoolID, ProjectID: in.ProjectID}
				if c.Scope == rpc.ScopeMine {
					f.Owner = c.Caller.IdentityID
				}
				items, err := domain.List(ctx, tx, m.types().Instance, c.TenantID, f, q)
				return rpc.PageOf(items, q, func(i Instance) store.Key { return store.Key{At: i.CreatedAt, ID: i.ID} },
					func(i Instance) iam.Resource { return d.Resource(domain.ResourceType, i.ID) },
					func(kept []Instance, next string) any { return InstanceList{Items: kept, NextCursor: next} }), err
			}},
		change(Start, "compute:instances:update", states.MethodStart),
		change(Stop, "compute:instances:update", states.MethodStop),
		&rpc.Method[ResizeInput, Instance]{Name: Resize, Action: "compute:instances:update", DecidedOn: "compute-instance",
			Phase: "v0.3", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ResizeInput) (Instance, error) {
				return domain.Resize(ctx, tx, c.TenantID, in.InstanceID, in.FlavorID)
			},
			After: func(ctx context.Context, c *rpc.Call, _ ResizeInput, out Instance) (Instance, error) {
				return m.signal(ctx, c, InstanceInput{}, out)
			}},
		change(Delete, "compute:instances:delete", states.MethodDelete),
	}
}

// secretsDecision is the create's further decision when userData is a
// secret:// reference (rpc.Deps.SecretsDecision).
func (m methods) secretsDecision(c *rpc.Call, in CreateInput) []rpc.Requirement {
	if !domain.IsSecretRef(in.UserData) {
		return nil
	}
	return m.d.SecretsDecision(c.TenantID)
}

// started starts the admitted instance's workflow (after the commit and
// on every replay) and records the start; a failure leaves the start
// owed to the reconciler, and the call answers UNAVAILABLE so a retry
// with the same key starts it.
func (m methods) started(ctx context.Context, c *rpc.Call, _ CreateInput) error {
	if m.d.Temporal == nil {
		return nil
	}
	var in Instance
	if err := m.d.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		in, err = domain.Load(ctx, tx, c.TenantID, c.Resource.ID, false)
		return err
	}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := instancesact.StartInstance(ctx, m.d.Temporal, m.d.TaskQueue, instancesact.InstanceParams{
		TenantID: in.TenantID, InstanceID: in.ID, PoolID: in.PoolID}); err != nil {
		return err
	}
	return domain.WorkflowStarted(ctx, m.d.Store.Pool, in.ID)
}

// signal tells the instance's workflow its desired state changed, best
// effort: the row holds the change, and the workflow's poll (or the
// reconciler's start) finds it.
func (m methods) signal(ctx context.Context, c *rpc.Call, _ InstanceInput, out Instance) (Instance, error) {
	if m.d.Temporal == nil {
		return out, nil
	}
	ctx = visibility.WithCaller(ctx, callerOf(c))
	if err := instancesact.Signal(ctx, m.d.Temporal, out.ID, instancesact.SignalDesiredChanged); err != nil {
		m.d.Logger.WarnContext(ctx, "signalling an instance's workflow", "instance", out.ID, "error", err)
	}
	return out, nil
}

func callerOf(c *rpc.Call) string {
	if c == nil || c.Caller == nil {
		return ""
	}
	return c.Caller.IdentityID
}
