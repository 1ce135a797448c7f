// Package fleet describes the fleet.* methods: the root tenant's sites,
// pools, flavors, offers and nodes' labels and taints as one declarative
// document, planned against the live state and
// applied by a workflow (docs/fleet-as-code.md).
package fleet

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	fleetact "github.com/better-compute/better-compute/activities/fleet"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	doc "github.com/better-compute/better-compute/core/fleet"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/fleet"
)

// Document is the fleet document.
type Document = doc.Document

// Change is one change of a plan.
type Change = doc.Change

// Plan is fleet.plan's answer.
type Plan = domain.Plan

// Apply is fleet.apply's answer and one of fleet.status's.
type Apply = domain.Apply

// ExportInput is fleet.export's input.
type ExportInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
}

// Export is fleet.export's answer: the document (as JSON) and its digest.
type Export struct {
	Document Document `json:"document"`
	Digest   string   `json:"digest"`
}

// PlanInput is fleet.plan's input: the document as YAML or JSON text.
type PlanInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	Document string `json:"document" jsonschema:"required,minLength=1,maxLength=1048576"`
}

// ApplyInput is fleet.apply's input: the plan and the digest it was
// computed against.
type ApplyInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PlanID   string `json:"planId" jsonschema:"required" id:"fplan"`
	Digest   string `json:"digest" jsonschema:"required,maxLength=71,pattern=^sha256:[0-9a-f]{64}$"`
}

// StatusInput is fleet.status's input; limit bounds the applies answered
// (default 5).
type StatusInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	Limit    int    `json:"limit,omitempty" jsonschema:"minimum=1,maximum=50"`
}

// Status is fleet.status's answer: the last applies, newest first, and the
// drift, the changes that would bring the live state back to the last
// applied document (none without a succeeded apply).
type Status struct {
	Applies []Apply  `json:"applies"`
	Drift   []Change `json:"drift"`
	Digest  string   `json:"digest"`
}

// The methods.
const (
	ExportMethod rpc.Ref[ExportInput, Export] = "fleet.export"
	PlanMethod   rpc.Ref[PlanInput, Plan]     = "fleet.plan"
	ApplyMethod  rpc.Ref[ApplyInput, Apply]   = "fleet.apply"
	StatusMethod rpc.Ref[StatusInput, Status] = "fleet.status"
)

// rootOnly refuses another tenant: the document is the platform's fleet.
func rootOnly(d rpc.Deps, c *rpc.Call) error {
	if c.TenantID != d.RootTenant {
		return core.Errorf(core.CodeInvalidInput, "the fleet document is the root tenant's").
			WithDetails(map[string]any{"field": "tenantId", "reason": "tenant"})
	}
	return nil
}

// Methods describes the fleet.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	schema, schemaErr := doc.Schema()
	makePlan := func(ctx context.Context, c *rpc.Call, tx store.Tx, in PlanInput) (Plan, error) {
		if err := rootOnly(d, c); err != nil {
			return Plan{}, err
		}
		if schemaErr != nil {
			return Plan{}, fmt.Errorf("fleet schema: %w", schemaErr)
		}
		want, err := doc.Parse(schema, in.Document)
		if err != nil {
			return Plan{}, err
		}
		live, err := domain.ReadLive(ctx, tx, c.TenantID)
		if err != nil {
			return Plan{}, err
		}
		changes := doc.Diff(live, want)
		if refused := doc.Refused(changes); len(refused) > 0 {
			return Plan{}, core.Errorf(core.CodeInvalidState, "%d changes cannot be applied", len(refused)).
				WithDetails(map[string]any{"refused": jsonValue(refused)})
		}
		return domain.SavePlan(ctx, tx, c.TenantID, c.Caller.IdentityID, doc.Digest(live.Document), want, changes)
	}
	return []rpc.Descriptor{
		&rpc.Method[ExportInput, Export]{Name: ExportMethod, Action: "compute:fleet:admin", DecidedOn: "compute-fleet",
			Phase: "v0.2", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ExportInput) (Export, error) {
				if err := rootOnly(d, c); err != nil {
					return Export{}, err
				}
				live, err := domain.ReadLive(ctx, tx, c.TenantID)
				return Export{Document: live.Document, Digest: doc.Digest(live.Document)}, err
			}},
		// A plan with a change that cannot be applied is refused whole
		// (INVALID_STATE, details.refused), so a stored plan always applies.
		// The table makes it a read (it changes no resource); the plan it
		// stores is written in a transaction of its own.
		&rpc.Method[PlanInput, Plan]{Name: PlanMethod, Action: "compute:fleet:admin", DecidedOn: "compute-fleet",
			Phase: "v0.2", Kind: core.KindRead,
			Direct: func(ctx context.Context, c *rpc.Call, in PlanInput) (plan Plan, err error) {
				err = d.Store.InTx(ctx, pgx.TxOptions{}, func(tx store.Tx) (err error) {
					plan, err = makePlan(ctx, c, tx, in)
					return err
				})
				return plan, err
			}},

		// The apply row is the workflow's outbox: the workflow (id = the
		// apply id) is started once it commits, and applies what its rows
		// say is pending.
		&rpc.Method[ApplyInput, Apply]{Name: ApplyMethod, Action: "compute:fleet:admin", DecidedOn: "compute-fleet",
			Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ApplyInput) (Apply, error) {
				if err := rootOnly(d, c); err != nil {
					return Apply{}, err
				}
				return domain.StartApply(ctx, tx, c.TenantID, c.AuditCaller(), in.PlanID, in.Digest)
			},
			After: func(ctx context.Context, c *rpc.Call, in ApplyInput, out Apply) (Apply, error) {
				if d.Temporal == nil {
					return out, core.Errorf(core.CodeUnavailable, "no workflow engine")
				}
				return out, fleetact.Start(ctx, d.Temporal, d.TaskQueue, out.ID)
			}},
		&rpc.Method[StatusInput, Status]{Name: StatusMethod, Action: "compute:fleet:admin", DecidedOn: "compute-fleet",
			Phase: "v0.2", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in StatusInput) (Status, error) {
				if err := rootOnly(d, c); err != nil {
					return Status{}, err
				}
				if in.Limit == 0 {
					in.Limit = 5
				}
				applies, err := domain.Applies(ctx, tx, c.TenantID, in.Limit)
				if err != nil {
					return Status{}, err
				}
				live, err := domain.ReadLive(ctx, tx, c.TenantID)
				if err != nil {
					return Status{}, err
				}
				st := Status{Applies: applies, Drift: []Change{}, Digest: doc.Digest(live.Document)}
				last, err := domain.LastApplied(ctx, tx, c.TenantID)
				if err != nil || last == nil {
					return st, err
				}
				if drift := doc.Diff(live, *last); drift != nil {
					st.Drift = drift
				}
				return st, nil
			}},
	}
}

// jsonValue is v as JSON values, for an error's details.
func jsonValue(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}
