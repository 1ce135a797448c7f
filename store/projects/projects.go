// Package projects is the projects domain: its rows, its rules and its SQL.
// A project groups a tenant's resources for policy and usage.
package projects

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// ResourceType is the catalog type a project is decided on.
const ResourceType = "project"

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

const columns = `id, tenant_id, name, description, created_by, created_at, archived_at`

func scan(row pgx.Row) (Project, error) {
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

// Create inserts a project and its authorization row (typ is the catalog's
// full name of the project type), in the caller's transaction, so the
// project is resolvable for decisions as soon as it exists. A name taken in
// the tenant is CONFLICT.
func Create(ctx context.Context, tx store.Tx, typ, tenantID, name, description, createdBy string) (Project, error) {
	id := core.NewID("prj")
	p, err := scan(tx.QueryRow(ctx, `INSERT INTO projects (id, tenant_id, name, description, created_by)
		VALUES ($1, $2, $3, $4, $5) RETURNING `+columns, id, tenantID, name, description, createdBy))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return Project{}, core.Errorf(core.CodeConflict, "a project named %q exists in this tenant", name).
			WithDetails(map[string]any{"field": "name"})
	}
	if err != nil {
		return Project{}, err
	}
	err = store.PutAuthzResource(ctx, tx, store.AuthzResource{Type: typ, ID: id, TenantID: tenantID, OwnerID: createdBy})
	return p, err
}

// Get reads a project of the tenant; another tenant's is NOT_FOUND.
func Get(ctx context.Context, tx store.Tx, tenantID, id string, forUpdate bool) (Project, error) {
	q := getSQL
	if forUpdate {
		q += ` FOR UPDATE`
	}
	return scanGot(tx.QueryRow(ctx, q, tenantID, id), id)
}

// QueueGet queues Get's read (unlocked) in b (store.Read); the answer is
// valid once b has run.
func QueueGet(b *store.Batch, tenantID, id string) func() (Project, error) {
	return store.QueueRow(b, func(row pgx.Row) (Project, error) { return scanGot(row, id) }, getSQL, tenantID, id)
}

const getSQL = `SELECT ` + columns + ` FROM projects WHERE tenant_id = $1 AND id = $2`

func scanGot(row pgx.Row, id string) (Project, error) {
	p, err := scan(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return Project{}, core.Errorf(core.CodeNotFound, "project %s not found", id)
	}
	return p, err
}

// List reads the tenant's live projects that the authorization projection
// holds (typ is the project type's full name), at most limit, oldest first.
func List(ctx context.Context, tx store.Tx, typ, tenantID string, page store.PageQuery) ([]Project, error) {
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+columns+` FROM projects p
		WHERE p.tenant_id = $1 AND p.archived_at IS NULL AND `+store.VisibleIn("p.id", "$1", "$2", false)+`
		  AND (`+store.MsOf("p.created_at")+`, p.id) > ($4, $5)
		ORDER BY `+store.MsOf("p.created_at")+`, p.id LIMIT $3`, tenantID, typ, page.Fetch(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Project, error) { return scan(r) })
}

// Archive archives a live project; an archived one is INVALID_STATE.
func Archive(ctx context.Context, tx store.Tx, tenantID, id string) (Project, error) {
	p, err := Get(ctx, tx, tenantID, id, true)
	if err != nil {
		return Project{}, err
	}
	if p.ArchivedAt != nil {
		return Project{}, core.Errorf(core.CodeInvalidState, "project %s is archived", p.ID)
	}
	return scan(tx.QueryRow(ctx, `UPDATE projects SET archived_at = now() WHERE id = $1 RETURNING `+columns, p.ID))
}
