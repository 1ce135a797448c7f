// Package sandboxes describes the sandboxes.* and sandboxTemplates.*
// methods (docs/sandboxes.md). sandboxes.create is an admission:
// transaction 1 writes the draft sandbox and its authorization row
// (decided on with templateId, vcpu, memoryGiB, gpus, ttlSeconds, warm),
// transaction 2 places its workload (an instance, store/instances) and
// records its deadline. Only sandboxes.extend moves the deadline;
// SandboxWorkflow ends the sandbox when it passes.
package sandboxes

import (
	"context"
	"maps"
	"slices"
	"time"

	instancesact "github.com/better-compute/better-compute/activities/instances"
	sandboxesact "github.com/better-compute/better-compute/activities/sandboxes"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/api/tunnels"
	"github.com/better-compute/better-compute/core"
	coresandboxes "github.com/better-compute/better-compute/core/sandboxes"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	instancedomain "github.com/better-compute/better-compute/store/instances"
	pooldomain "github.com/better-compute/better-compute/store/pools"
	domain "github.com/better-compute/better-compute/store/sandboxes"
)

// Sandbox and Template are as the methods answer them.
type (
	Sandbox  = domain.Sandbox
	Template = domain.Template
)

// SandboxList is sandboxes.list's answer.
type SandboxList struct {
	Items      []Sandbox `json:"items"`
	NextCursor string    `json:"nextCursor,omitempty"`
}

// TemplateList is sandboxTemplates.list's answer.
type TemplateList struct {
	Items      []Template `json:"items"`
	NextCursor string     `json:"nextCursor,omitempty"`
}

// CreateInput is sandboxes.create's input: a template and, optionally, a
// lifetime within the template's maximum (else its default); or a
// snapshot to restore (its template when templateId is absent).
type CreateInput struct {
	TenantID       string `json:"tenantId" jsonschema:"required" id:"tenant"`
	IdempotencyKey string `json:"idempotencyKey" jsonschema:"required" id:"tenant"`
	TemplateID     string `json:"templateId,omitempty" id:"tpl"`
	TTLSeconds     int    `json:"ttlSeconds,omitempty" jsonschema:"minimum=1,maximum=86400"`
	FromSnapshot   string `json:"fromSnapshot,omitempty" id:"snap"`
}

// SandboxInput names one sandbox.
type SandboxInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	SandboxID string `json:"sandboxId" jsonschema:"required" id:"sbx"`
}

// ExtendInput moves a sandbox's deadline to an explicit instant.
type ExtendInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	SandboxID string `json:"sandboxId" jsonschema:"required" id:"sbx"`
	ExpiresAt int64  `json:"expiresAt" jsonschema:"required,minimum=1" unit:"epoch-ms"`
}

// ExecInput is sandboxes.exec's input: a command run in the sandbox's
// container, its stdio streamed through the tunnel the call answers.
type ExecInput struct {
	TenantID  string            `json:"tenantId" jsonschema:"required" id:"tenant"`
	SandboxID string            `json:"sandboxId" jsonschema:"required" id:"sbx"`
	Command   []string          `json:"command" jsonschema:"required,minItems=1,maxItems=256"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"maxProperties=128"`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"maxLength=4096,pattern=^/"`
	// TimeoutSeconds kills the command after it (default 60).
	TimeoutSeconds int `json:"timeoutSeconds,omitempty" jsonschema:"minimum=1,maximum=3600"`
	// OutputLimitBytes bounds stdout and stderr together (default 16 MiB);
	// past it the output is dropped and the exit frame says truncated.
	OutputLimitBytes int64 `json:"outputLimitBytes,omitempty" jsonschema:"minimum=1,maximum=268435456"`
}

// defaultExecTimeout is an exec's timeout when the input names none.
const defaultExecTimeout = 60 * time.Second

// ListInput is sandboxes.list's input: live sandboxes, or ended ones
// (deleted, failed) with ended.
type ListInput struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	TemplateID string `json:"templateId,omitempty" id:"tpl"`
	Ended      bool   `json:"ended,omitempty"`
	rpc.ListInput
}

// TemplateInput is sandboxTemplates.create's input. runtime defaults to
// gvisor; TTLs to 300 s and at most 3600 s; ttlAction to delete.
type TemplateInput struct {
	TenantID          string                  `json:"tenantId" jsonschema:"required" id:"tenant"`
	Name              string                  `json:"name" jsonschema:"required,minLength=1,maxLength=63,pattern=^[a-z0-9]([a-z0-9-]{0\\,61}[a-z0-9])?$"`
	PoolID            string                  `json:"poolId" jsonschema:"required" id:"pool"`
	FlavorID          string                  `json:"flavorId" jsonschema:"required" id:"flv"`
	ImageID           string                  `json:"imageId" jsonschema:"required" id:"img"`
	Runtime           coresandboxes.Runtime   `json:"runtime,omitempty"`
	Command           []string                `json:"command,omitempty" jsonschema:"maxItems=64"`
	DefaultTTLSeconds int                     `json:"defaultTtlSeconds,omitempty" jsonschema:"minimum=1,maximum=86400"`
	MaxTTLSeconds     int                     `json:"maxTtlSeconds,omitempty" jsonschema:"minimum=1,maximum=86400"`
	TTLAction         coresandboxes.TTLAction `json:"ttlAction,omitempty"`
	WarmPoolSize      int                     `json:"warmPoolSize,omitempty" jsonschema:"minimum=0,maximum=64"`
	// Volumes are mounted into every sandbox of the template: all on one
	// host, in the template's pool; not for runtime vm.
	Volumes []MountInput `json:"volumes,omitempty" jsonschema:"maxItems=16"`
	// Env is the guest's environment: values plain or secret://
	// references to the tenant's secrets (compute:secrets:manage).
	Env map[string]string `json:"env,omitempty" jsonschema:"maxProperties=128"`
}

// TemplateRef names one template.
type TemplateRef struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	TemplateID string `json:"templateId" jsonschema:"required" id:"tpl"`
}

// TemplateUpdateInput changes a template; an absent field keeps its value.
type TemplateUpdateInput struct {
	TenantID          string                   `json:"tenantId" jsonschema:"required" id:"tenant"`
	TemplateID        string                   `json:"templateId" jsonschema:"required" id:"tpl"`
	FlavorID          *string                  `json:"flavorId,omitempty" id:"flv"`
	ImageID           *string                  `json:"imageId,omitempty" id:"img"`
	Runtime           *coresandboxes.Runtime   `json:"runtime,omitempty"`
	Command           *[]string                `json:"command,omitempty" jsonschema:"maxItems=64"`
	DefaultTTLSeconds *int                     `json:"defaultTtlSeconds,omitempty" jsonschema:"minimum=1,maximum=86400"`
	MaxTTLSeconds     *int                     `json:"maxTtlSeconds,omitempty" jsonschema:"minimum=1,maximum=86400"`
	TTLAction         *coresandboxes.TTLAction `json:"ttlAction,omitempty"`
	WarmPoolSize      *int                     `json:"warmPoolSize,omitempty" jsonschema:"minimum=0,maximum=64"`
	// Volumes, when set, replaces the template's volumes ([] removes them).
	Volumes *[]MountInput `json:"volumes,omitempty" jsonschema:"maxItems=16"`
	// Env, when set, replaces the template's environment.
	Env *map[string]string `json:"env,omitempty" jsonschema:"maxProperties=128"`
}

// TemplateListInput is sandboxTemplates.list's input.
type TemplateListInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	rpc.ListInput
}

// The methods.
const (
	Create rpc.Ref[CreateInput, Sandbox]      = "sandboxes.create"
	Get    rpc.Ref[SandboxInput, Sandbox]     = "sandboxes.get"
	List   rpc.Ref[ListInput, SandboxList]    = "sandboxes.list"
	Extend rpc.Ref[ExtendInput, Sandbox]      = "sandboxes.extend"
	Delete rpc.Ref[SandboxInput, Sandbox]     = "sandboxes.delete"
	Exec   rpc.Ref[ExecInput, tunnels.Opened] = "sandboxes.exec"

	CreateTemplate rpc.Ref[TemplateInput, Template]         = "sandboxTemplates.create"
	GetTemplate    rpc.Ref[TemplateRef, Template]           = "sandboxTemplates.get"
	ListTemplates  rpc.Ref[TemplateListInput, TemplateList] = "sandboxTemplates.list"
	UpdateTemplate rpc.Ref[TemplateUpdateInput, Template]   = "sandboxTemplates.update"
	DeleteTemplate rpc.Ref[TemplateRef, Template]           = "sandboxTemplates.delete"
)

type methods struct{ d rpc.Deps }

func (m methods) types() domain.Types {
	return domain.Types{Sandbox: m.d.Catalog.FullName(domain.ResourceType), Pool: m.d.Catalog.FullName(pooldomain.ResourceType)}
}

func (m methods) templateType() string {
	return m.d.Catalog.FullName(coresandboxes.TemplateResourceType)
}

// Methods describes the sandboxes.* and sandboxTemplates.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	m := methods{d}
	return append(append(m.snapshots(), []rpc.Descriptor{
		&rpc.Method[CreateInput, Sandbox]{Name: Create, Action: "compute:sandboxes:create", DecidedOn: "compute-sandbox (the draft)",
			Phase: "v0.5", Kind: core.KindAdmission,
			Admission: &rpc.Admission[CreateInput, Sandbox]{
				Prepare: func(ctx context.Context, c *rpc.Call, tx store.Tx, draftID string, in CreateInput) (iam.Resource, error) {
					row, err := domain.Draft(ctx, tx, m.types(), c.TenantID, draftID, c.Caller.IdentityID,
						domain.Request{TemplateID: in.TemplateID, TTLSeconds: in.TTLSeconds, FromSnapshot: in.FromSnapshot})
					return iam.Resource{Type: row.Type, ID: row.ID}, err
				},
				Complete: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ CreateInput) (Sandbox, error) {
					return domain.Complete(ctx, tx, c.TenantID, c.Resource.ID)
				},
				Denied: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ CreateInput) error {
					return domain.Deny(ctx, tx, c.TenantID, c.Resource.ID)
				},
				Failed: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ CreateInput, cause error) error {
					return domain.Fail(ctx, tx, c.TenantID, c.Resource.ID, cause)
				},
				Started: m.started,
			}},
		&rpc.Method[SandboxInput, Sandbox]{Name: Get, Action: "compute:sandboxes:read", DecidedOn: "compute-sandbox",
			Phase: "v0.5", Kind: core.KindRead,
			Read: func(c *rpc.Call, b *store.Batch, in SandboxInput) func() (Sandbox, error) {
				return domain.QueueLoad(b, c.TenantID, in.SandboxID)
			}},
		&rpc.Method[ListInput, SandboxList]{Name: List, Action: "compute:sandboxes:read", DecidedOn: "compute-tenant + items",
			Phase: "v0.5", Kind: core.KindRead,
			List: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListInput) (rpc.Page, error) {
				q, err := in.Page()
				if err != nil {
					return rpc.Page{}, err
				}
				items, err := domain.List(ctx, tx, m.types().Sandbox, c.TenantID, domain.Filter{TemplateID: in.TemplateID, Ended: in.Ended}, q)
				return rpc.PageOf(items, q, func(s Sandbox) store.Key { return store.Key{At: s.CreatedAt, ID: s.ID} },
					func(s Sandbox) iam.Resource { return d.Resource(domain.ResourceType, s.ID) },
					func(kept []Sandbox, next string) any { return SandboxList{Items: kept, NextCursor: next} }), err
			}},
		&rpc.Method[ExtendInput, Sandbox]{Name: Extend, Action: "compute:sandboxes:update", DecidedOn: "compute-sandbox",
			Phase: "v0.5", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ExtendInput) (Sandbox, error) {
				return domain.Extend(ctx, tx, c.TenantID, in.SandboxID, in.ExpiresAt)
			},
			After: func(ctx context.Context, c *rpc.Call, _ ExtendInput, out Sandbox) (Sandbox, error) {
				return m.signal(ctx, out)
			}},
		&rpc.Method[ExecInput, tunnels.Opened]{Name: Exec, Action: "compute:sandboxes:exec", DecidedOn: "compute-sandbox",
			Phase: "v0.5", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ExecInput) (tunnels.Opened, error) {
				nodeID, instanceID, err := domain.ExecTarget(ctx, tx, c.TenantID, in.SandboxID)
				if err != nil {
					return tunnels.Opened{}, err
				}
				timeout := defaultExecTimeout
				if in.TimeoutSeconds > 0 {
					timeout = time.Duration(in.TimeoutSeconds) * time.Second
				}
				return tunnels.OpenExec(ctx, m.d, c, tx, nodeID, protocol.ExecSpec{InstanceID: instanceID, Command: in.Command,
					Env: in.Env, Cwd: in.Cwd, TimeoutMs: timeout.Milliseconds()}, in.OutputLimitBytes, 0)
			}},
		&rpc.Method[SandboxInput, Sandbox]{Name: Delete, Action: "compute:sandboxes:delete", DecidedOn: "compute-sandbox",
			Phase: "v0.5", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in SandboxInput) (Sandbox, error) {
				return domain.Delete(ctx, tx, c.TenantID, in.SandboxID)
			},
			After: func(ctx context.Context, c *rpc.Call, _ SandboxInput, out Sandbox) (Sandbox, error) {
				if m.d.Temporal != nil && out.InstanceID != "" {
					if err := instancesact.Signal(ctx, m.d.Temporal, out.InstanceID, instancesact.SignalDesiredChanged); err != nil {
						m.d.Logger.WarnContext(ctx, "signalling a sandbox's workload", "sandbox", out.ID, "error", err)
					}
				}
				return m.signal(ctx, out)
			}},
		&rpc.Method[TemplateInput, Template]{Name: CreateTemplate,
			Action:    "compute:sandboxes:manage, and compute:secrets:manage when it names secrets; for each volume it names, compute:sandboxes:manage (read-write mount) or compute:sandboxes:read (read-only)",
			DecidedOn: "compute-tenant (the secrets decision also on compute-fleet in the root tenant; the volume decisions on each compute-sandbox-volume, 77bf9f5)",
			Phase:     "v0.5", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in TemplateInput) (Template, error) {
				return domain.CreateTemplate(ctx, tx, m.templateType(), c.TenantID, c.Caller.IdentityID, domain.TemplateSpec{
					Name: in.Name, PoolID: in.PoolID, FlavorID: in.FlavorID, ImageID: in.ImageID, Runtime: in.Runtime,
					Command: in.Command, DefaultTTLSeconds: in.DefaultTTLSeconds, MaxTTLSeconds: in.MaxTTLSeconds,
					TTLAction: in.TTLAction, WarmPoolSize: in.WarmPoolSize, Volumes: mounts(in.Volumes),
					Env: in.Env})
			},
			Also: m.createTemplateDecisions,
			After: func(ctx context.Context, c *rpc.Call, _ TemplateInput, t Template) (Template, error) {
				if t.WarmPoolSize == 0 {
					return t, nil
				}
				return m.warmPool(ctx, c, t)
			}},
		&rpc.Method[TemplateRef, Template]{Name: GetTemplate, Action: "compute:sandboxes:read", DecidedOn: "compute-sandbox-template",
			Phase: "v0.5", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in TemplateRef) (Template, error) {
				return domain.GetTemplate(ctx, tx, c.TenantID, in.TemplateID)
			}},
		&rpc.Method[TemplateListInput, TemplateList]{Name: ListTemplates, Action: "compute:sandboxes:read", DecidedOn: "compute-tenant + items",
			Phase: "v0.5", Kind: core.KindRead,
			List: func(ctx context.Context, c *rpc.Call, tx store.Tx, in TemplateListInput) (rpc.Page, error) {
				q, err := in.Page()
				if err != nil {
					return rpc.Page{}, err
				}
				items, err := domain.ListTemplates(ctx, tx, m.templateType(), c.TenantID, q)
				return rpc.PageOf(items, q, func(t Template) store.Key { return store.Key{At: t.CreatedAt, ID: t.ID} },
					func(t Template) iam.Resource { return d.Resource(coresandboxes.TemplateResourceType, t.ID) },
					func(kept []Template, next string) any { return TemplateList{Items: kept, NextCursor: next} }), err
			}},
		&rpc.Method[TemplateUpdateInput, Template]{Name: UpdateTemplate,
			Action:    "compute:sandboxes:manage, and compute:secrets:manage when the resulting template names secrets and the update changes them or what the guest runs; the per-volume decisions for a new volumes list, or for the current one when the update changes what the guest runs",
			DecidedOn: "compute-sandbox-template (the secrets decision on compute-tenant, plus compute-fleet in the root tenant; the volume decisions on each compute-sandbox-volume)",
			Phase:     "v0.5", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in TemplateUpdateInput) (Template, error) {
				return domain.UpdateTemplate(ctx, tx, c.TenantID, in.TemplateID, domain.TemplateChange{
					FlavorID: in.FlavorID, ImageID: in.ImageID, Runtime: in.Runtime, Command: in.Command,
					DefaultTTLSeconds: in.DefaultTTLSeconds, MaxTTLSeconds: in.MaxTTLSeconds, TTLAction: in.TTLAction,
					WarmPoolSize: in.WarmPoolSize, Volumes: templateVolumes(in.Volumes),
					Env: in.Env})
			},
			Also: m.updateTemplateDecisions,
			After: func(ctx context.Context, c *rpc.Call, _ TemplateUpdateInput, t Template) (Template, error) {
				return m.warmPool(ctx, c, t)
			}},
		&rpc.Method[TemplateRef, Template]{Name: DeleteTemplate, Action: "compute:sandboxes:manage", DecidedOn: "compute-sandbox-template",
			Phase: "v0.5", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in TemplateRef) (Template, error) {
				return domain.DeleteTemplate(ctx, tx, m.templateType(), c.TenantID, in.TemplateID)
			},
			After: func(ctx context.Context, c *rpc.Call, _ TemplateRef, t Template) (Template, error) {
				return m.warmPool(ctx, c, t)
			}},
	}...), m.volumeMethods()...)
}

// started starts the admitted sandbox's workload's workflow and its own
// (after the commit and on every replay) and records the starts; a
// failure leaves them to the reconcilers, and the call answers
// UNAVAILABLE so a retry with the same key starts them.
func (m methods) started(ctx context.Context, c *rpc.Call, _ CreateInput) error {
	if m.d.Temporal == nil {
		return nil
	}
	var s Sandbox
	if err := m.d.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		s, err = domain.Load(ctx, tx, c.TenantID, c.Resource.ID)
		return err
	}); err != nil {
		return err
	}
	if s.InstanceID == "" {
		return nil // refused: nothing runs
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := instancesact.StartInstance(ctx, m.d.Temporal, m.d.TaskQueue, instancesact.InstanceParams{
		TenantID: s.TenantID, InstanceID: s.InstanceID, PoolID: s.PoolID}); err != nil {
		return err
	}
	if err := instancedomain.WorkflowStarted(ctx, m.d.Store.Pool, s.InstanceID); err != nil {
		return err
	}
	if err := sandboxesact.StartSandbox(ctx, m.d.Temporal, m.d.TaskQueue, sandboxesact.SandboxParams{
		TenantID: s.TenantID, SandboxID: s.ID, PoolID: s.PoolID}); err != nil {
		return err
	}
	if err := domain.WorkflowStarted(ctx, m.d.Store.Pool, s.ID); err != nil {
		return err
	}
	// A claim leaves the template's warm pool one short: tell it (best
	// effort; its poll tops it up anyway).
	if err := sandboxesact.Signal(ctx, m.d.Temporal, sandboxesact.WarmPoolID(s.TemplateID)); err != nil {
		m.d.Logger.WarnContext(ctx, "signalling a warm pool", "template", s.TemplateID, "error", err)
	}
	return nil
}

// warmPool starts (or wakes) the template's warm pool after a change of
// the template, best effort: the reconciler starts any it missed.
func (m methods) warmPool(ctx context.Context, _ *rpc.Call, t Template) (Template, error) {
	if m.d.Temporal == nil {
		return t, nil
	}
	if err := sandboxesact.StartWarmPool(ctx, m.d.Temporal, m.d.TaskQueue, sandboxesact.WarmPoolParams{
		TenantID: t.TenantID, TemplateID: t.ID, PoolID: t.PoolID}); err != nil {
		m.d.Logger.WarnContext(ctx, "starting a warm pool", "template", t.ID, "error", err)
	}
	return t, nil
}

// signal tells the sandbox's workflow its row changed, best effort: the
// row holds the change and the workflow's next step reads it.
func (m methods) signal(ctx context.Context, out Sandbox) (Sandbox, error) {
	if m.d.Temporal == nil {
		return out, nil
	}
	if err := sandboxesact.Signal(ctx, m.d.Temporal, out.ID); err != nil {
		m.d.Logger.WarnContext(ctx, "signalling a sandbox's workflow", "sandbox", out.ID, "error", err)
	}
	return out, nil
}

// createTemplateDecisions are sandboxTemplates.create's further
// decisions: the secrets decision when its env names secrets, then each
// volume's.
func (m methods) createTemplateDecisions(ctx context.Context, c *rpc.Call, tx store.Tx, in TemplateInput) ([]rpc.Requirement, error) {
	var out []rpc.Requirement
	if domain.NamesSecrets(in.Env) {
		out = m.d.SecretsDecision(c.TenantID)
	}
	volumes, err := m.createVolumeDecisions(ctx, c, tx, in)
	return append(out, volumes...), err
}

// updateTemplateDecisions are sandboxTemplates.update's: the secrets
// decision when the resulting template names secrets and the update
// changes its env or what the guest runs (image, command, runtime), then
// the volumes' (updateVolumeDecisions).
func (m methods) updateTemplateDecisions(ctx context.Context, c *rpc.Call, tx store.Tx, in TemplateUpdateInput) ([]rpc.Requirement, error) {
	var out []rpc.Requirement
	if in.Env != nil || in.ImageID != nil || in.Command != nil || in.Runtime != nil {
		t, err := domain.GetTemplate(ctx, tx, c.TenantID, in.TemplateID)
		if err != nil {
			return nil, err
		}
		env := t.Env
		if in.Env != nil {
			env = *in.Env
		}
		changed := (in.Env != nil && !maps.Equal(*in.Env, t.Env)) || guestChanges(t, in)
		if domain.NamesSecrets(env) && changed {
			out = m.d.SecretsDecision(c.TenantID)
		}
	}
	volumes, err := m.updateVolumeDecisions(ctx, c, tx, in)
	return append(out, volumes...), err
}

// guestChanges says whether the update changes what t's guests run: its
// image, its command or its runtime.
func guestChanges(t Template, in TemplateUpdateInput) bool {
	return (in.ImageID != nil && *in.ImageID != t.ImageID) || (in.Runtime != nil && string(*in.Runtime) != t.Runtime) ||
		(in.Command != nil && !slices.Equal(*in.Command, t.Command))
}
