// Package profiles describes the profiles.* methods: versioned
// provisioning profiles of a tenant, their validation against a node and
// their rendering for one.
package profiles

import (
	"context"
	"encoding/json"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	coreprofiles "github.com/better-compute/better-compute/core/profiles"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/profiles"
)

// Profile is a profile as the methods answer it.
type Profile = domain.Profile

// VersionInfo is one version of a profile, without its document.
type VersionInfo = domain.VersionInfo

// Problem is one thing wrong with a profile: its field, reason and message.
type Problem = provisioning.Problem

// Detail is a profile with one version's document (the latest unless asked
// for another) and the list of its versions.
type Detail struct {
	Profile
	Version  int             `json:"version"`
	Document json.RawMessage `json:"document"`
	Versions []VersionInfo   `json:"versions"`
}

// ProfileList is profiles.list's answer.
type ProfileList struct {
	Items      []Profile `json:"items"`
	NextCursor string    `json:"nextCursor,omitempty"`
}

// Validation is profiles.validate's answer: valid, or every problem found.
type Validation struct {
	ProfileID string    `json:"profileId"`
	Version   int       `json:"version"`
	NodeID    string    `json:"nodeId,omitempty"`
	Valid     bool      `json:"valid"`
	Problems  []Problem `json:"problems"`
}

// Rendering is profiles.render's answer: the steps and context a
// provisioning workflow of the profile would run for the node.
type Rendering struct {
	ProfileID string               `json:"profileId"`
	Version   int                  `json:"version"`
	NodeID    string               `json:"nodeId"`
	Steps     []provisioning.Step  `json:"steps"`
	Context   provisioning.Context `json:"context"`
}

// Names are DNS labels, as sites' and pools'. The document is the
// profile's JSON document (core/profiles' schema, docs/profiles.md).

// CreateInput is profiles.create's input.
type CreateInput struct {
	TenantID string          `json:"tenantId" jsonschema:"required" id:"tenant"`
	Name     string          `json:"name" jsonschema:"required,maxLength=63,pattern=^[a-z0-9]([-a-z0-9]{0\\,61}[a-z0-9])?$"`
	Document json.RawMessage `json:"document" jsonschema:"required,type=object" maxBytes:"262144"`
}

// GetInput is profiles.get's input; version 0 (or none) is the latest.
type GetInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	ProfileID string `json:"profileId" jsonschema:"required" id:"prof"`
	Version   int    `json:"version,omitempty" jsonschema:"minimum=1,maximum=1000000"`
}

// ValidateInput is profiles.validate's input: a version of the profile
// (the latest by default), against one of the tenant's nodes when nodeId
// is given.
type ValidateInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	ProfileID string `json:"profileId" jsonschema:"required" id:"prof"`
	Version   int    `json:"version,omitempty" jsonschema:"minimum=1,maximum=1000000"`
	NodeID    string `json:"nodeId,omitempty" id:"node"`
}

// RenderInput is profiles.render's input.
type RenderInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	ProfileID string `json:"profileId" jsonschema:"required" id:"prof"`
	Version   int    `json:"version,omitempty" jsonschema:"minimum=1,maximum=1000000"`
	NodeID    string `json:"nodeId" jsonschema:"required" id:"node"`
}

// UpdateInput is profiles.update's input: the document of the new version.
type UpdateInput struct {
	TenantID  string          `json:"tenantId" jsonschema:"required" id:"tenant"`
	ProfileID string          `json:"profileId" jsonschema:"required" id:"prof"`
	Document  json.RawMessage `json:"document" jsonschema:"required,type=object" maxBytes:"262144"`
}

// ProfileInput names one profile.
type ProfileInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	ProfileID string `json:"profileId" jsonschema:"required" id:"prof"`
}

// The methods.
const (
	Create   rpc.Ref[CreateInput, Detail]              = "profiles.create"
	Get      rpc.Ref[GetInput, Detail]                 = "profiles.get"
	Validate rpc.Ref[ValidateInput, Validation]        = "profiles.validate"
	Render   rpc.Ref[RenderInput, Rendering]           = "profiles.render"
	List     rpc.Ref[rpc.TenantListInput, ProfileList] = "profiles.list"
	Update   rpc.Ref[UpdateInput, Detail]              = "profiles.update"
	Delete   rpc.Ref[ProfileInput, Profile]            = "profiles.delete"
)

// Methods describes the profiles.* methods without the workflow store:
// profiles.delete cannot tell whether a live workflow runs the profile,
// so it refuses (UNAVAILABLE). Domain(live) is the domain with it.
func Methods(d rpc.Deps) []rpc.Descriptor { return methods(d, nil) }

// Domain is the profiles.* methods with live, the count of a profile's
// live workflows that profiles.delete checks.
func Domain(live domain.LiveWorkflows) rpc.Domain {
	return func(d rpc.Deps) []rpc.Descriptor { return methods(d, live) }
}

func methods(d rpc.Deps, live domain.LiveWorkflows) []rpc.Descriptor {
	typ := func() string { return d.Catalog.FullName(domain.ResourceType) }
	return []rpc.Descriptor{
		&rpc.Method[CreateInput, Detail]{Name: Create, Action: "compute:profiles:manage", DecidedOn: "compute-tenant",
			Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in CreateInput) (Detail, error) {
				p, v, err := domain.Create(ctx, tx, typ(), c.TenantID, c.Caller.IdentityID, in.Name, in.Document)
				if err != nil {
					return Detail{}, err
				}
				return detail(ctx, tx, p, v)
			}},
		&rpc.Method[GetInput, Detail]{Name: Get, Action: "compute:profiles:read", DecidedOn: "compute-profile",
			Phase: "v0.2", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in GetInput) (Detail, error) {
				p, v, err := domain.GetVersion(ctx, tx, c.TenantID, in.ProfileID, in.Version)
				if err != nil {
					return Detail{}, err
				}
				return detail(ctx, tx, p, v)
			}},
		// The node is read within the call's tenant: another tenant's is
		// NOT_FOUND, as a missing one.
		&rpc.Method[ValidateInput, Validation]{Name: Validate, Action: "compute:profiles:read", DecidedOn: "compute-profile",
			Phase: "v0.2", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ValidateInput) (Validation, error) {
				var target *coreprofiles.Target
				if in.NodeID != "" {
					t, err := domain.TargetForNode(ctx, tx, c.TenantID, in.NodeID)
					if err != nil {
						return Validation{}, nodeField(err)
					}
					target = &t
				}
				checked, err := domain.Check(ctx, tx, d.Secrets, c.TenantID, in.ProfileID, in.Version, target)
				if err != nil {
					return Validation{}, err
				}
				problems := checked.Problems
				if problems == nil {
					problems = []Problem{}
				}
				return Validation{ProfileID: checked.Profile.ID, Version: checked.Version.Version, NodeID: in.NodeID,
					Valid: len(problems) == 0, Problems: problems}, nil
			}},
		&rpc.Method[RenderInput, Rendering]{Name: Render, Action: "compute:profiles:read", DecidedOn: "compute-profile",
			Phase: "v0.2", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in RenderInput) (Rendering, error) {
				t, err := domain.TargetForNode(ctx, tx, c.TenantID, in.NodeID)
				if err != nil {
					return Rendering{}, nodeField(err)
				}
				checked, err := domain.Check(ctx, tx, d.Secrets, c.TenantID, in.ProfileID, in.Version, &t)
				if err != nil {
					return Rendering{}, err
				}
				if len(checked.Problems) > 0 {
					return Rendering{}, domain.ProblemsError(checked.Problems)
				}
				return Rendering{ProfileID: checked.Profile.ID, Version: checked.Version.Version, NodeID: in.NodeID,
					Steps: checked.Rendered.Steps, Context: checked.Rendered.Context}, nil
			}},
		// Oldest first: creation millisecond, then id.
		&rpc.Method[rpc.TenantListInput, ProfileList]{Name: List, Action: "compute:profiles:read", DecidedOn: "compute-tenant + items",
			Phase: "v0.2", Kind: core.KindRead,
			List: func(ctx context.Context, c *rpc.Call, tx store.Tx, in rpc.TenantListInput) (rpc.Page, error) {
				q, err := in.Page()
				if err != nil {
					return rpc.Page{}, err
				}
				rows, err := domain.List(ctx, tx, typ(), c.TenantID, q)
				return rpc.PageOf(rows, q, func(p Profile) store.Key { return store.Key{At: p.CreatedAt, ID: p.ID} },
					func(p Profile) iam.Resource { return d.Resource(domain.ResourceType, p.ID) },
					func(kept []Profile, next string) any { return ProfileList{Items: kept, NextCursor: next} }), err
			}},
		&rpc.Method[UpdateInput, Detail]{Name: Update, Action: "compute:profiles:manage", DecidedOn: "compute-profile",
			Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in UpdateInput) (Detail, error) {
				p, v, err := domain.Update(ctx, tx, c.TenantID, in.ProfileID, c.Caller.IdentityID, in.Document)
				if err != nil {
					return Detail{}, err
				}
				return detail(ctx, tx, p, v)
			}},
		&rpc.Method[ProfileInput, Profile]{Name: Delete, Action: "compute:profiles:manage", DecidedOn: "compute-profile",
			Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ProfileInput) (Profile, error) {
				return domain.Delete(ctx, tx, c.TenantID, in.ProfileID, live)
			}},
	}
}

// detail is a profile with one version and its versions' list.
func detail(ctx context.Context, tx store.Tx, p Profile, v domain.Version) (Detail, error) {
	versions, err := domain.Versions(ctx, tx, p.ID)
	if err != nil {
		return Detail{}, err
	}
	return Detail{Profile: p, Version: v.Version, Document: v.Document, Versions: versions}, nil
}

// nodeField names the input's nodeId in a node's NOT_FOUND or
// INVALID_STATE, so the caller knows which id it was.
func nodeField(err error) error {
	ce := core.AsError(err)
	if ce == nil || (ce.Code != core.CodeNotFound && ce.Code != core.CodeInvalidState) {
		return err
	}
	if _, named := ce.Details["field"]; named {
		return err
	}
	return ce.WithDetails(map[string]any{"field": "nodeId"})
}
