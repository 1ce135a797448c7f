// Package projects describes the projects.* methods.
package projects

import (
	"context"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/projects"
)

// Project is a project as the methods answer it.
type Project = domain.Project

// ProjectList is projects.list's answer.
type ProjectList struct {
	Items      []Project `json:"items"`
	NextCursor string    `json:"nextCursor,omitempty"`
}

// CreateInput is projects.create's input. Names are unique in a tenant.
type CreateInput struct {
	TenantID    string `json:"tenantId" jsonschema:"required" id:"tenant"`
	Name        string `json:"name" jsonschema:"required,minLength=1,maxLength=128"`
	Description string `json:"description,omitempty" jsonschema:"maxLength=256"`
}

// ProjectInput names one project.
type ProjectInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	ProjectID string `json:"projectId" jsonschema:"required" id:"prj"`
}

// The methods.
const (
	Create  rpc.Ref[CreateInput, Project]             = "projects.create"
	Get     rpc.Ref[ProjectInput, Project]            = "projects.get"
	List    rpc.Ref[rpc.TenantListInput, ProjectList] = "projects.list"
	Archive rpc.Ref[ProjectInput, Project]            = "projects.archive"
)

// Methods describes the projects.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	typ := func() string { return d.Catalog.FullName(domain.ResourceType) }
	return []rpc.Descriptor{
		&rpc.Method[CreateInput, Project]{Name: Create, Action: "compute:projects:manage", DecidedOn: "compute-tenant",
			Phase: "v0.1", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in CreateInput) (Project, error) {
				return domain.Create(ctx, tx, typ(), c.TenantID, in.Name, in.Description, c.Caller.IdentityID)
			}},
		&rpc.Method[ProjectInput, Project]{Name: Get, Action: "compute:projects:read", DecidedOn: "compute-project",
			Phase: "v0.1", Kind: core.KindRead,
			Read: func(c *rpc.Call, b *store.Batch, in ProjectInput) func() (Project, error) {
				return domain.QueueGet(b, c.TenantID, in.ProjectID)
			}},
		// Oldest first: creation millisecond, then id.
		&rpc.Method[rpc.TenantListInput, ProjectList]{Name: List, Action: "compute:projects:read", DecidedOn: "compute-tenant + items",
			Phase: "v0.1", Kind: core.KindRead,
			List: func(ctx context.Context, c *rpc.Call, tx store.Tx, in rpc.TenantListInput) (rpc.Page, error) {
				q, err := in.Page()
				if err != nil {
					return rpc.Page{}, err
				}
				rows, err := domain.List(ctx, tx, typ(), c.TenantID, q)
				return rpc.PageOf(rows, q, func(p Project) store.Key { return store.Key{At: p.CreatedAt, ID: p.ID} },
					func(p Project) iam.Resource { return d.Resource(domain.ResourceType, p.ID) },
					func(kept []Project, next string) any { return ProjectList{Items: kept, NextCursor: next} }), err
			}},
		&rpc.Method[ProjectInput, Project]{Name: Archive, Action: "compute:projects:manage", DecidedOn: "compute-project",
			Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ProjectInput) (Project, error) {
				return domain.Archive(ctx, tx, c.TenantID, in.ProjectID)
			}},
	}
}
