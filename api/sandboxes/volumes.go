package sandboxes

import (
	"context"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	coresandboxes "github.com/better-compute/better-compute/core/sandboxes"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	pooldomain "github.com/better-compute/better-compute/store/pools"
	domain "github.com/better-compute/better-compute/store/sandboxes"
)

// Volume and TemplateVolume are as the methods answer them.
type (
	Volume         = domain.Volume
	TemplateVolume = domain.TemplateVolume
)

// VolumeList is sandboxVolumes.list's answer.
type VolumeList struct {
	Items      []Volume `json:"items"`
	NextCursor string   `json:"nextCursor,omitempty"`
}

// VolumeCreateInput is sandboxVolumes.create's input: a size in a
// vps-host pool, whose host the create chooses.
type VolumeCreateInput struct {
	TenantID       string `json:"tenantId" jsonschema:"required" id:"tenant"`
	IdempotencyKey string `json:"idempotencyKey" jsonschema:"required" id:"tenant"`
	PoolID         string `json:"poolId" jsonschema:"required" id:"pool"`
	SizeGiB        int    `json:"sizeGiB" jsonschema:"required,minimum=1,maximum=1024"`
}

// VolumeInput names one volume.
type VolumeInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	VolumeID string `json:"volumeId" jsonschema:"required" id:"vol"`
}

// VolumeResizeInput grows a volume to SizeGiB.
type VolumeResizeInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	VolumeID string `json:"volumeId" jsonschema:"required" id:"vol"`
	SizeGiB  int    `json:"sizeGiB" jsonschema:"required,minimum=1,maximum=1024"`
}

// VolumeListInput is sandboxVolumes.list's input. Scope mine (the
// default) keeps the caller's own volumes; all every volume of the tenant
// the caller may read.
type VolumeListInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	Scope    string `json:"scope,omitempty" jsonschema:"enum=mine,enum=all"`
	rpc.ListInput
}

// MountInput is one volume a template mounts into its sandboxes.
type MountInput struct {
	VolumeID string `json:"volumeId" jsonschema:"required" id:"vol"`
	// MountPath is where in the sandbox: an absolute, clean path, not /
	// and not under /proc, /sys or /dev.
	MountPath string `json:"mountPath" jsonschema:"required,minLength=2,maxLength=4096,pattern=^/"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
}

// The volume methods.
const (
	CreateVolume rpc.Ref[VolumeCreateInput, Volume]   = "sandboxVolumes.create"
	GetVolume    rpc.Ref[VolumeInput, Volume]         = "sandboxVolumes.get"
	ListVolumes  rpc.Ref[VolumeListInput, VolumeList] = "sandboxVolumes.list"
	ResizeVolume rpc.Ref[VolumeResizeInput, Volume]   = "sandboxVolumes.resize"
	DeleteVolume rpc.Ref[VolumeInput, Volume]         = "sandboxVolumes.delete"
)

func (m methods) volumeTypes() domain.VolumeTypes {
	return domain.VolumeTypes{Volume: m.d.Catalog.FullName(coresandboxes.VolumeResourceType), Pool: m.d.Catalog.FullName(pooldomain.ResourceType)}
}

// volumeMethods describes the sandboxVolumes.* methods.
func (m methods) volumeMethods() []rpc.Descriptor {
	return []rpc.Descriptor{
		&rpc.Method[VolumeCreateInput, Volume]{Name: CreateVolume, Action: "compute:sandboxes:manage, with the requested sizeGiB",
			DecidedOn: "compute-sandbox-volume (the volume it would create, under its pool; 6cb30e9, was compute-tenant)",
			Phase:     "v1.0", Kind: core.KindAdmission,
			Admission: &rpc.Admission[VolumeCreateInput, Volume]{
				Prepare: func(ctx context.Context, c *rpc.Call, tx store.Tx, draftID string, in VolumeCreateInput) (iam.Resource, error) {
					row, err := domain.DraftVolume(ctx, tx, m.volumeTypes(), c.TenantID, draftID, c.Caller.IdentityID, in.PoolID, in.SizeGiB)
					return iam.Resource{Type: row.Type, ID: row.ID}, err
				},
				Complete: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ VolumeCreateInput) (Volume, error) {
					return domain.CompleteVolume(ctx, tx, c.TenantID, c.Resource.ID)
				},
				Denied: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ VolumeCreateInput) error {
					return domain.DenyVolume(ctx, tx, c.TenantID, c.Resource.ID)
				},
				Failed: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ VolumeCreateInput, cause error) error {
					return domain.FailVolume(ctx, tx, c.TenantID, c.Resource.ID, cause)
				},
			}},
		&rpc.Method[VolumeInput, Volume]{Name: GetVolume, Action: "compute:sandboxes:read", DecidedOn: "compute-sandbox-volume",
			Phase: "v1.0", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in VolumeInput) (Volume, error) {
				return domain.GetVolume(ctx, tx, c.TenantID, in.VolumeID)
			}},
		&rpc.Method[VolumeListInput, VolumeList]{Name: ListVolumes, Action: "compute:sandboxes:read",
			DecidedOn: "compute-tenant (scope mine by default, or all)", Phase: "v1.0", Kind: core.KindRead,
			List: func(ctx context.Context, c *rpc.Call, tx store.Tx, in VolumeListInput) (rpc.Page, error) {
				q, err := in.Page()
				if err != nil {
					return rpc.Page{}, err
				}
				owner := ""
				if c.Scope == rpc.ScopeMine {
					owner = c.Caller.IdentityID
				}
				items, err := domain.ListVolumes(ctx, tx, m.volumeTypes().Volume, c.TenantID, owner, q)
				return rpc.PageOf(items, q, func(v Volume) store.Key { return store.Key{At: v.CreatedAt, ID: v.ID} },
					func(v Volume) iam.Resource { return m.d.Resource(coresandboxes.VolumeResourceType, v.ID) },
					func(kept []Volume, next string) any { return VolumeList{Items: kept, NextCursor: next} }), err
			}},
		&rpc.Method[VolumeResizeInput, Volume]{Name: ResizeVolume, Action: "compute:sandboxes:manage, with the new sizeGiB pending",
			DecidedOn: "compute-sandbox-volume", Phase: "v1.0", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in VolumeResizeInput) (Volume, error) {
				return domain.ResizeVolume(ctx, tx, m.volumeTypes(), c.TenantID, in.VolumeID, in.SizeGiB)
			}},
		&rpc.Method[VolumeInput, Volume]{Name: DeleteVolume, Action: "compute:sandboxes:manage", DecidedOn: "compute-sandbox-volume",
			Phase: "v1.0", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in VolumeInput) (Volume, error) {
				return domain.DeleteVolume(ctx, tx, m.volumeTypes().Volume, c.TenantID, in.VolumeID)
			}},
	}
}

// mounts is the store's form of a template's volumes.
func mounts(in []MountInput) []TemplateVolume {
	if in == nil {
		return nil
	}
	out := make([]TemplateVolume, len(in))
	for i, v := range in {
		out[i] = TemplateVolume{VolumeID: v.VolumeID, MountPath: v.MountPath, ReadOnly: v.ReadOnly}
	}
	return out
}

// templateVolumes is an update's volumes list, nil when it keeps them.
func templateVolumes(in *[]MountInput) *[]TemplateVolume {
	if in == nil {
		return nil
	}
	out := mounts(*in)
	if out == nil {
		out = []TemplateVolume{}
	}
	return &out
}

// volumeDecisions are a template's per-volume decisions:
// compute:sandboxes:manage on each volume it mounts read-write,
// compute:sandboxes:read on each it mounts read-only.
func (m methods) volumeDecisions(vs []TemplateVolume) []rpc.Requirement {
	out := make([]rpc.Requirement, 0, len(vs))
	for _, v := range vs {
		action := "compute:sandboxes:manage"
		if v.ReadOnly {
			action = "compute:sandboxes:read"
		}
		out = append(out, rpc.Requirement{Action: action, Resource: m.d.Resource(coresandboxes.VolumeResourceType, v.VolumeID)})
	}
	return out
}

// createVolumeDecisions are sandboxTemplates.create's per-volume
// decisions, for each volume the input names.
func (m methods) createVolumeDecisions(_ context.Context, _ *rpc.Call, _ store.Tx, in TemplateInput) ([]rpc.Requirement, error) {
	return m.volumeDecisions(mounts(in.Volumes)), nil
}

// updateVolumeDecisions are sandboxTemplates.update's: for a new volumes
// list, each of its volumes; without one, each of the template's current
// volumes when the update changes what the guest runs (its image, its
// command or its runtime).
func (m methods) updateVolumeDecisions(ctx context.Context, c *rpc.Call, tx store.Tx, in TemplateUpdateInput) ([]rpc.Requirement, error) {
	if in.Volumes != nil {
		return m.volumeDecisions(mounts(*in.Volumes)), nil
	}
	if in.ImageID == nil && in.Command == nil && in.Runtime == nil {
		return nil, nil
	}
	t, err := domain.GetTemplate(ctx, tx, c.TenantID, in.TemplateID)
	if err != nil {
		return nil, err
	}
	if !guestChanges(t, in) {
		return nil, nil
	}
	return m.volumeDecisions(t.Volumes), nil
}
