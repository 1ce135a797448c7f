package api

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
)

// Project is a project as the API returns it.
type Project struct {
	ID          string `json:"id"`
	TenantID    string `json:"tenantId"`
	Name        string `json:"name"`
	Description string `json:"description"`
	CreatedBy   string `json:"createdBy"`
	CreatedAt   int64  `json:"createdAt"`
	ArchivedAt  *int64 `json:"archivedAt,omitempty"`
}

// ProjectList is projects.list's answer.
type ProjectList struct {
	Items []Project `json:"items"`
}

const projectColumns = `id, tenant_id, name, description, created_by, created_at, archived_at`

func scanProject(row pgx.Row) (Project, error) {
	var p Project
	var created time.Time
	var archived *time.Time
	if err := row.Scan(&p.ID, &p.TenantID, &p.Name, &p.Description, &p.CreatedBy, &created, &archived); err != nil {
		return Project{}, err
	}
	p.CreatedAt = created.UnixMilli()
	if archived != nil {
		ms := archived.UnixMilli()
		p.ArchivedAt = &ms
	}
	return p, nil
}

func (s *Server) projectResource(id string) iam.Resource {
	return iam.Resource{Type: s.catalog.FullName("project"), ID: id}
}

func (s *Server) projectsCreate(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		Name        string `json:"name"`
		Description string `json:"description"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	id := core.NewID("prj")
	p, err := scanProject(tx.QueryRow(ctx, `INSERT INTO projects (id, tenant_id, name, description, created_by)
		VALUES ($1, $2, $3, $4, $5) RETURNING `+projectColumns, id, c.TenantID, in.Name, in.Description, c.Caller.IdentityID))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return nil, core.Errorf(core.CodeConflict, "a project named %q exists in this tenant", in.Name).
			WithDetails(map[string]any{"field": "name"})
	}
	if err != nil {
		return nil, err
	}
	// The projection row makes the project resolvable for decisions, in the
	// same transaction as the project itself.
	err = store.PutAuthzResource(ctx, tx, store.AuthzResource{
		Type: s.catalog.FullName("project"), ID: id, TenantID: c.TenantID, OwnerID: c.Caller.IdentityID,
	})
	return p, err
}

func (s *Server) projectsGet(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		ProjectID string `json:"projectId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	return s.loadProject(ctx, tx, c.TenantID, in.ProjectID, false)
}

// loadProject reads a project of the tenant; another tenant's is NOT_FOUND.
func (s *Server) loadProject(ctx context.Context, tx store.Tx, tenantID, id string, forUpdate bool) (Project, error) {
	q := `SELECT ` + projectColumns + ` FROM projects WHERE tenant_id = $1 AND id = $2`
	if forUpdate {
		q += ` FOR UPDATE`
	}
	p, err := scanProject(tx.QueryRow(ctx, q, tenantID, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Project{}, core.Errorf(core.CodeNotFound, "project %s not found", id)
	}
	return p, err
}

func (s *Server) projectsList(ctx context.Context, c *Call, tx store.Tx) (rpc.Page, error) {
	// The SQL pre-filter: the tenant's live projects, of which the
	// projection holds a row (in the tenant's view).
	rows, err := tx.Query(ctx, `SELECT `+projectColumns+` FROM projects p
		WHERE p.tenant_id = $1 AND p.archived_at IS NULL
		  AND EXISTS (SELECT 1 FROM authz_resources a WHERE a.type = $2 AND a.id = p.id AND a.tenant_id = $1)
		ORDER BY p.created_at, p.id LIMIT $3`, c.TenantID, s.catalog.FullName("project"), listLimit)
	if err != nil {
		return rpc.Page{}, err
	}
	projects, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Project, error) { return scanProject(r) })
	if err != nil {
		return rpc.Page{}, err
	}
	return rpc.PageOf(projects, func(x Project) iam.Resource { return s.projectResource(x.ID) },
		func(kept []Project) any { return ProjectList{Items: kept} }), nil
}

func (s *Server) projectsArchive(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		ProjectID string `json:"projectId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	p, err := s.loadProject(ctx, tx, c.TenantID, in.ProjectID, true)
	if err != nil {
		return nil, err
	}
	if p.ArchivedAt != nil {
		return nil, core.Errorf(core.CodeInvalidState, "project %s is archived", p.ID)
	}
	return scanProject(tx.QueryRow(ctx, `UPDATE projects SET archived_at = now() WHERE id = $1 RETURNING `+projectColumns, p.ID))
}
