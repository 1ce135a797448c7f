// Package profiles is the profiles domain's store: profiles and their
// append-only versions (a trigger refuses any change of a version row), the
// reads and state writes of the profiles.* methods, and Expand, which turns
// one version into the steps and context of a provisioning workflow for one
// node. It is the only writer of the profiles and profile_versions tables.
package profiles

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/core"
	coreprofiles "github.com/better-compute/better-compute/core/profiles"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/store"
)

// ResourceType is the catalog type a profile is decided on.
const ResourceType = "profile"

// IDPrefix starts every profile id.
const IDPrefix = "prof"

// Profile is a profile as the API returns it.
type Profile struct {
	ID            string `json:"id"`
	TenantID      string `json:"tenantId"`
	Name          string `json:"name"`
	Target        string `json:"target"`
	LatestVersion int    `json:"latestVersion"`
	CreatedBy     string `json:"createdBy"`
	CreatedAt     int64  `json:"createdAt"`
	UpdatedAt     int64  `json:"updatedAt"`
	DeletedAt     *int64 `json:"deletedAt,omitempty"`
}

// VersionInfo is one version of a profile, without its document.
type VersionInfo struct {
	Version   int    `json:"version"`
	CreatedBy string `json:"createdBy"`
	CreatedAt int64  `json:"createdAt"`
}

// Version is one version of a profile with its document.
type Version struct {
	VersionInfo
	Document json.RawMessage `json:"document"`
}

// LiveWorkflows counts the workflows of the tenant's profile that may
// still run a step (provisioning.Live); the workflows store answers it.
type LiveWorkflows func(ctx context.Context, tx store.Tx, tenantID, profileID string) (int, error)

const columns = `id, tenant_id, name, target, latest_version, created_by, created_at, updated_at, deleted_at`

func scan(row pgx.Row) (Profile, error) {
	var p Profile
	var created, updated time.Time
	var deleted *time.Time
	if err := row.Scan(&p.ID, &p.TenantID, &p.Name, &p.Target, &p.LatestVersion, &p.CreatedBy, &created, &updated, &deleted); err != nil {
		return Profile{}, err
	}
	p.CreatedAt, p.UpdatedAt = created.UnixMilli(), updated.UnixMilli()
	if deleted != nil {
		ms := deleted.UnixMilli()
		p.DeletedAt = &ms
	}
	return p, nil
}

// NotFound is the error of a profile that is missing or another tenant's:
// the same for both.
func NotFound(id string) error { return core.Errorf(core.CodeNotFound, "profile %s not found", id) }

// Invalid is the error of a document with problems: INVALID_INPUT naming
// the first problem's field (under "document.") and reason, with every
// problem in details.problems.
func Invalid(problems []provisioning.Problem) error {
	p := problems[0]
	field := "document"
	if p.Field != "" {
		field += "." + p.Field
	}
	return core.Errorf(core.CodeInvalidInput, "the profile document is not valid: %s: %s", field, p.Message).
		WithDetails(map[string]any{"field": field, "reason": p.Reason, "problems": problems})
}

// CheckDocument parses a document and checks what needs no target and no
// database (core/profiles.Check): what create and update refuse.
func CheckDocument(raw json.RawMessage) (coreprofiles.Document, error) {
	doc, problems := coreprofiles.Parse(raw)
	if len(problems) == 0 {
		problems = coreprofiles.Check(doc)
	}
	if len(problems) > 0 {
		return doc, Invalid(problems)
	}
	return doc, nil
}

func putAuthz(ctx context.Context, tx store.Tx, typ string, p Profile) error {
	return store.PutAuthzResource(ctx, tx, store.AuthzResource{Type: typ, ID: p.ID, TenantID: p.TenantID})
}

func nameTaken(err error, name string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return core.Errorf(core.CodeConflict, "a profile named %q exists in this tenant", name).WithDetails(map[string]any{"field": "name"})
	}
	return err
}

// Create inserts a profile and its version 1 (typ is the profile type's
// full name, for its authorization row). A document with problems is
// INVALID_INPUT; a live profile's name taken in the tenant is CONFLICT.
func Create(ctx context.Context, tx store.Tx, typ, tenantID, createdBy, name string, raw json.RawMessage) (Profile, Version, error) {
	doc, err := CheckDocument(raw)
	if err != nil {
		return Profile{}, Version{}, err
	}
	p, err := scan(tx.QueryRow(ctx, `INSERT INTO profiles (id, tenant_id, name, target, latest_version, created_by)
		VALUES ($1, $2, $3, $4, 1, $5) RETURNING `+columns, core.NewID(IDPrefix), tenantID, name, doc.Target, createdBy))
	if err != nil {
		return Profile{}, Version{}, nameTaken(err, name)
	}
	v, err := insertVersion(ctx, tx, p.ID, 1, createdBy, raw)
	if err != nil {
		return Profile{}, Version{}, err
	}
	return p, v, putAuthz(ctx, tx, typ, p)
}

func insertVersion(ctx context.Context, tx store.Tx, profileID string, version int, by string, raw json.RawMessage) (Version, error) {
	var v Version
	var created time.Time
	if err := tx.QueryRow(ctx, `INSERT INTO profile_versions (profile_id, version, document, created_by)
		VALUES ($1, $2, $3, $4) RETURNING version, created_by, created_at, document`, profileID, version, []byte(raw), by).
		Scan(&v.Version, &v.CreatedBy, &created, &v.Document); err != nil {
		return Version{}, fmt.Errorf("profiles: writing version %d: %w", version, err)
	}
	v.CreatedAt = created.UnixMilli()
	return v, nil
}

// Get reads the tenant's profile (deleted ones too, with deletedAt); lock
// takes its row for a change. Another tenant's is NOT_FOUND.
func Get(ctx context.Context, tx store.Tx, tenantID, id string, lock bool) (Profile, error) {
	q := `SELECT ` + columns + ` FROM profiles WHERE tenant_id = $1 AND id = $2`
	if lock {
		q += ` FOR UPDATE`
	}
	p, err := scan(tx.QueryRow(ctx, q, tenantID, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Profile{}, NotFound(id)
	}
	return p, err
}

// live is Get for a change, locked: a deleted profile is INVALID_STATE.
func live(ctx context.Context, tx store.Tx, tenantID, id string) (Profile, error) {
	p, err := Get(ctx, tx, tenantID, id, true)
	if err == nil && p.DeletedAt != nil {
		err = core.Errorf(core.CodeInvalidState, "profile %s is deleted", id).WithDetails(map[string]any{"reason": "deleted"})
	}
	return p, err
}

// GetVersion reads one version of the tenant's profile (0: the latest). A
// version the profile does not have is NOT_FOUND naming the field version.
func GetVersion(ctx context.Context, tx store.Tx, tenantID, id string, version int) (Profile, Version, error) {
	p, err := Get(ctx, tx, tenantID, id, false)
	if err != nil {
		return Profile{}, Version{}, err
	}
	if version == 0 {
		version = p.LatestVersion
	}
	var v Version
	var created time.Time
	err = tx.QueryRow(ctx, `SELECT version, created_by, created_at, document FROM profile_versions
		WHERE profile_id = $1 AND version = $2`, p.ID, version).Scan(&v.Version, &v.CreatedBy, &created, &v.Document)
	if errors.Is(err, pgx.ErrNoRows) {
		return Profile{}, Version{}, core.Errorf(core.CodeNotFound, "profile %s has no version %d", id, version).
			WithDetails(map[string]any{"field": "version"})
	}
	if err != nil {
		return Profile{}, Version{}, err
	}
	v.CreatedAt = created.UnixMilli()
	return p, v, nil
}

// Versions lists a profile's versions, oldest first (at most
// MaxVersionsListed, the newest of them).
func Versions(ctx context.Context, tx store.Tx, profileID string) ([]VersionInfo, error) {
	rows, err := tx.Query(ctx, `SELECT version, created_by, created_at FROM (
			SELECT version, created_by, created_at FROM profile_versions WHERE profile_id = $1
			ORDER BY version DESC LIMIT $2) v ORDER BY version`, profileID, MaxVersionsListed)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (VersionInfo, error) {
		var v VersionInfo
		var created time.Time
		err := r.Scan(&v.Version, &v.CreatedBy, &created)
		v.CreatedAt = created.UnixMilli()
		return v, err
	})
}

// MaxVersionsListed bounds the versions profiles.get lists.
const MaxVersionsListed = 100

// List reads the tenant's live profiles the projection holds (typ is the
// profile type's full name), oldest first.
func List(ctx context.Context, tx store.Tx, typ, tenantID string, page store.PageQuery) ([]Profile, error) {
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+columns+` FROM profiles p
		WHERE p.tenant_id = $1 AND p.deleted_at IS NULL AND `+store.VisibleIn("p.id", "$1", "$2", false)+`
		  AND (`+store.MsOf("p.created_at")+`, p.id) > ($4, $5)
		ORDER BY `+store.MsOf("p.created_at")+`, p.id LIMIT $3`, tenantID, typ, page.Fetch(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Profile, error) { return scan(r) })
}

// Update writes a new version of the tenant's live profile: always a new
// one, even for the same document, so a workflow's pinned version never
// changes under it. The target is the profile's for good: another is
// INVALID_INPUT.
func Update(ctx context.Context, tx store.Tx, tenantID, id, by string, raw json.RawMessage) (Profile, Version, error) {
	p, err := live(ctx, tx, tenantID, id)
	if err != nil {
		return Profile{}, Version{}, err
	}
	doc, err := CheckDocument(raw)
	if err != nil {
		return Profile{}, Version{}, err
	}
	if doc.Target != p.Target {
		return Profile{}, Version{}, core.Errorf(core.CodeInvalidInput, "profile %s is a %s profile; its target never changes", p.ID, p.Target).
			WithDetails(map[string]any{"field": "document.target", "reason": "immutable"})
	}
	v, err := insertVersion(ctx, tx, p.ID, p.LatestVersion+1, by, raw)
	if err != nil {
		return Profile{}, Version{}, err
	}
	p, err = scan(tx.QueryRow(ctx, `UPDATE profiles SET latest_version = $2, updated_at = now() WHERE id = $1 RETURNING `+columns, p.ID, v.Version))
	return p, v, err
}

// Delete marks the tenant's live profile deleted (its versions stay, for
// the workflows that ran them). A profile that a live workflow runs is
// INVALID_STATE; liveWorkflows nil cannot tell, so it refuses (UNAVAILABLE)
// rather than delete a running profile.
func Delete(ctx context.Context, tx store.Tx, tenantID, id string, liveWorkflows LiveWorkflows) (Profile, error) {
	p, err := live(ctx, tx, tenantID, id)
	if err != nil {
		return Profile{}, err
	}
	if liveWorkflows == nil {
		return Profile{}, core.Errorf(core.CodeUnavailable, "profiles cannot be deleted: the workflow store is not configured")
	}
	n, err := liveWorkflows(ctx, tx, tenantID, p.ID)
	if err != nil {
		return Profile{}, fmt.Errorf("profiles: counting the live workflows of %s: %w", p.ID, err)
	}
	if n > 0 {
		return Profile{}, core.Errorf(core.CodeInvalidState, "profile %s runs in %d live workflows; abort them or let them end first", p.ID, n).
			WithDetails(map[string]any{"reason": "liveWorkflows", "workflows": n})
	}
	return scan(tx.QueryRow(ctx, `UPDATE profiles SET deleted_at = now(), updated_at = now() WHERE id = $1 RETURNING `+columns, p.ID))
}
