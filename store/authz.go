package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/core"
)

// The authorization projection's tables (migrations/00003_authz.sql):
// authz_resources holds one row per application-owned resource IAM can
// decide on, and a trigger appends every change to authz_changes (and sends
// a NOTIFY on AuthzChannel) in the writer's transaction. Every process keeps
// the rows in memory (iam.Projection) and tails the feed.

// AuthzChannel is the NOTIFY channel the trigger signals at commit.
const AuthzChannel = "authz_changes"

// DefaultAuthzChangesKeep is how long PruneAuthzChanges keeps changes by
// default. A tailer further behind than this must reload everything.
const DefaultAuthzChangesKeep = time.Hour

// DBTX is what reads need: a pool, a connection or a transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// AuthzResource is one authz_resources row.
type AuthzResource struct {
	// Type is the type as IAM names it, with the catalog's prefix
	// (catalog.FullName("pool") = "compute-pool").
	Type string
	ID   string
	// TenantID is the owner tenant.
	TenantID string
	// OwnerID is the owning identity; "" when none.
	OwnerID string
	// ParentType (prefixed) and ParentID name the parent; both or neither.
	ParentType string
	ParentID   string
	// Attributes are the type's declared attributes: strings, numbers and
	// booleans only. Read back, numbers are float64.
	Attributes map[string]any
	// SharedWith lists other tenants in whose view the resource resolves
	// (a pool offered to them), or SharedWithAll for every tenant (a public
	// image). Stored sorted and without duplicates.
	SharedWith []string
	// UpdatedAt is set by the database; PutAuthzResource ignores it.
	UpdatedAt time.Time
}

// SharedWithAll in SharedWith makes a resource resolve in every tenant's
// view (no tenant id is "*").
const SharedWithAll = "*"

// Key is the row's primary key as "type/id".
func (r AuthzResource) Key() string { return r.Type + "/" + r.ID }

func (r AuthzResource) check() error {
	if r.Type == "" || r.ID == "" || r.TenantID == "" {
		return fmt.Errorf("store: authz resource %q: type, id and tenant are required", r.Key())
	}
	if (r.ParentType == "") != (r.ParentID == "") {
		return fmt.Errorf("store: authz resource %s: parent type and parent id go together", r.Key())
	}
	for name, v := range r.Attributes {
		switch v.(type) {
		case string, bool, float64, float32, int, int8, int16, int32, int64,
			uint, uint8, uint16, uint32, uint64, json.Number:
		default:
			return fmt.Errorf("store: authz resource %s: attribute %q is %T; want a string, number or boolean", r.Key(), name, v)
		}
	}
	for _, t := range r.SharedWith {
		if t == "" {
			return fmt.Errorf("store: authz resource %s: an empty tenant in sharedWith", r.Key())
		}
	}
	return nil
}

// PutAuthzResource inserts or replaces one row, in the transaction that
// writes the domain row it describes. Writing the same row again changes
// nothing and signals no change.
func PutAuthzResource(ctx context.Context, tx Tx, r AuthzResource) error {
	if err := r.check(); err != nil {
		return err
	}
	attrs := r.Attributes
	if attrs == nil {
		attrs = map[string]any{}
	}
	attrJSON, err := json.Marshal(attrs)
	if err != nil {
		return fmt.Errorf("store: authz resource %s: attributes: %w", r.Key(), err)
	}
	shared := make([]string, 0, len(r.SharedWith))
	for _, t := range r.SharedWith {
		if t != r.TenantID {
			shared = append(shared, t)
		}
	}
	slices.Sort(shared)
	shared = slices.Compact(shared)
	_, err = tx.Exec(ctx, `
		INSERT INTO authz_resources AS a (type, id, tenant_id, owner_id, parent_type, parent_id, attributes, shared_with)
		VALUES ($1, $2, $3, NULLIF($4, ''), NULLIF($5, ''), NULLIF($6, ''), $7::jsonb, $8)
		ON CONFLICT (type, id) DO UPDATE SET
			tenant_id = EXCLUDED.tenant_id, owner_id = EXCLUDED.owner_id,
			parent_type = EXCLUDED.parent_type, parent_id = EXCLUDED.parent_id,
			attributes = EXCLUDED.attributes, shared_with = EXCLUDED.shared_with, updated_at = now()
		WHERE (a.tenant_id, a.owner_id, a.parent_type, a.parent_id, a.attributes, a.shared_with)
			IS DISTINCT FROM
			(EXCLUDED.tenant_id, EXCLUDED.owner_id, EXCLUDED.parent_type, EXCLUDED.parent_id, EXCLUDED.attributes, EXCLUDED.shared_with)`,
		r.Type, r.ID, r.TenantID, r.OwnerID, r.ParentType, r.ParentID, string(attrJSON), shared)
	if err != nil {
		return fmt.Errorf("store: put authz resource %s: %w", r.Key(), err)
	}
	return nil
}

// DeleteAuthzResource deletes one row, in the transaction that deletes the
// domain row. Deleting a row that is not there is not an error.
func DeleteAuthzResource(ctx context.Context, tx Tx, typ, id string) error {
	if _, err := tx.Exec(ctx, `DELETE FROM authz_resources WHERE type = $1 AND id = $2`, typ, id); err != nil {
		return fmt.Errorf("store: delete authz resource %s/%s: %w", typ, id, err)
	}
	return nil
}

const authzColumns = `type, id, tenant_id, owner_id, parent_type, parent_id, attributes, shared_with, updated_at`

// authzRow is a row as scanned; every column but type and id is nullable so
// that a LEFT JOIN's missing row scans too.
type authzRow struct {
	typ, id                                 string
	tenantID, ownerID, parentType, parentID *string
	attributes                              []byte
	sharedWith                              []string
	updatedAt                               *time.Time
}

func (a *authzRow) dest() []any {
	return []any{&a.typ, &a.id, &a.tenantID, &a.ownerID, &a.parentType, &a.parentID, &a.attributes, &a.sharedWith, &a.updatedAt}
}

func (a *authzRow) resource() (AuthzResource, error) {
	deref := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	r := AuthzResource{
		Type: a.typ, ID: a.id, TenantID: deref(a.tenantID), OwnerID: deref(a.ownerID),
		ParentType: deref(a.parentType), ParentID: deref(a.parentID), SharedWith: a.sharedWith,
	}
	if a.updatedAt != nil {
		r.UpdatedAt = *a.updatedAt
	}
	if len(a.attributes) > 0 {
		if err := json.Unmarshal(a.attributes, &r.Attributes); err != nil {
			return AuthzResource{}, fmt.Errorf("store: authz resource %s: attributes: %w", r.Key(), err)
		}
	}
	if r.Attributes == nil {
		r.Attributes = map[string]any{}
	}
	if r.SharedWith == nil {
		r.SharedWith = []string{}
	}
	return r, nil
}

// GetAuthzResource reads one row by its primary key; core NOT_FOUND when
// there is none.
func GetAuthzResource(ctx context.Context, q DBTX, typ, id string) (AuthzResource, error) {
	var a authzRow
	err := q.QueryRow(ctx, `SELECT `+authzColumns+` FROM authz_resources WHERE type = $1 AND id = $2`, typ, id).Scan(a.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return AuthzResource{}, core.Errorf(core.CodeNotFound, "%s/%s not found", typ, id)
	}
	if err != nil {
		return AuthzResource{}, fmt.Errorf("store: read authz resource %s/%s: %w", typ, id, err)
	}
	return a.resource()
}

// GetAuthzResources reads the rows of keys (each "type", "id") in one
// statement; a key with no row is absent from the answer.
func GetAuthzResources(ctx context.Context, q DBTX, keys [][2]string) ([]AuthzResource, error) {
	types, ids := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		types[i], ids[i] = k[0], k[1]
	}
	rows, err := q.Query(ctx, `SELECT `+authzColumns+` FROM authz_resources
		WHERE (type, id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`, types, ids)
	if err != nil {
		return nil, fmt.Errorf("store: read authz resources: %w", err)
	}
	defer rows.Close()
	var out []AuthzResource
	for rows.Next() {
		var a authzRow
		if err := rows.Scan(a.dest()...); err != nil {
			return nil, fmt.Errorf("store: read authz resources: %w", err)
		}
		r, err := a.resource()
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: read authz resources: %w", err)
	}
	return out, nil
}

// AuthzState is every authz_resources row as of Snapshot.
type AuthzState struct {
	// Snapshot is the PostgreSQL snapshot (pg_snapshot, as text) the rows
	// were read in; pass it to ReadAuthzChanges.
	Snapshot  string
	Resources []AuthzResource
	// MaxSeq is the highest authz_changes seq visible then (0 when none).
	MaxSeq int64
}

// AuthzChange is the state of one changed row: Resource is nil when the row
// no longer exists.
type AuthzChange struct {
	Type, ID string
	Seq      int64 // the newest change of the row in this delta
	Resource *AuthzResource
}

// AuthzDelta is what changed between two snapshots.
type AuthzDelta struct {
	Snapshot string // pass it to the next ReadAuthzChanges
	Changes  []AuthzChange
	MaxSeq   int64 // the highest seq in Changes; 0 when there are none
}

// readSnapshot runs fn in a read-only REPEATABLE READ transaction whose
// snapshot it returns: every statement of fn sees exactly that snapshot.
func (s *Store) readSnapshot(ctx context.Context, fn func(tx Tx) error) (string, error) {
	var snap string
	err := s.InTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx Tx) error {
		// The first statement fixes the transaction's snapshot.
		if err := tx.QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&snap); err != nil {
			return fmt.Errorf("store: authz snapshot: %w", err)
		}
		return fn(tx)
	})
	return snap, err
}

// LoadAuthz reads every authz_resources row in one snapshot.
func (s *Store) LoadAuthz(ctx context.Context) (AuthzState, error) {
	var st AuthzState
	snap, err := s.readSnapshot(ctx, func(tx Tx) error {
		rows, err := tx.Query(ctx, `SELECT `+authzColumns+` FROM authz_resources`)
		if err != nil {
			return fmt.Errorf("store: load authz resources: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var a authzRow
			if err := rows.Scan(a.dest()...); err != nil {
				return fmt.Errorf("store: load authz resources: %w", err)
			}
			r, err := a.resource()
			if err != nil {
				return err
			}
			st.Resources = append(st.Resources, r)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("store: load authz resources: %w", err)
		}
		return tx.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM authz_changes`).Scan(&st.MaxSeq)
	})
	if err != nil {
		return AuthzState{}, err
	}
	st.Snapshot = snap
	return st, nil
}

// ReadAuthzChanges returns the rows changed by the transactions that
// committed after the snapshot since was taken and before a new one, with
// their state in the new snapshot.
//
// It selects changes by the writer's transaction id, not by seq: seq values
// are taken in one order and committed in another (a transaction holding
// seq 5 may commit after the one holding seq 6), so a seq cursor would skip
// seq 5 for good. A transaction is visible in a later snapshot once it is
// in any earlier one, so "visible now and not visible in since" names every
// committed writer exactly once, however late it commits. Transactions
// older than since's xmin were all visible in it; the index on xid bounds
// the scan there.
func (s *Store) ReadAuthzChanges(ctx context.Context, since string) (AuthzDelta, error) {
	var d AuthzDelta
	snap, err := s.readSnapshot(ctx, func(tx Tx) error {
		rows, err := tx.Query(ctx, `
			WITH ch AS (
				SELECT type, id, max(seq) AS seq FROM authz_changes
				WHERE xid >= pg_snapshot_xmin($1::pg_snapshot) AND NOT pg_visible_in_snapshot(xid, $1::pg_snapshot)
				GROUP BY type, id
			)
			SELECT ch.seq, ch.type, ch.id, r.tenant_id, r.owner_id, r.parent_type, r.parent_id, r.attributes, r.shared_with, r.updated_at
			FROM ch LEFT JOIN authz_resources r ON r.type = ch.type AND r.id = ch.id
			ORDER BY ch.seq`, since)
		if err != nil {
			return fmt.Errorf("store: read authz changes: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var (
				seq int64
				a   authzRow
			)
			if err := rows.Scan(append([]any{&seq}, a.dest()...)...); err != nil {
				return fmt.Errorf("store: read authz changes: %w", err)
			}
			ch := AuthzChange{Type: a.typ, ID: a.id, Seq: seq}
			if a.tenantID != nil {
				r, err := a.resource()
				if err != nil {
					return err
				}
				ch.Resource = &r
			}
			d.Changes = append(d.Changes, ch)
			d.MaxSeq = max(d.MaxSeq, seq)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("store: read authz changes: %w", err)
		}
		return nil
	})
	if err != nil {
		return AuthzDelta{}, err
	}
	d.Snapshot = snap
	return d, nil
}

// PruneAuthzChanges deletes changes older than keep (DefaultAuthzChangesKeep
// when keep <= 0) and returns how many it deleted. Several processes may
// prune at once.
func PruneAuthzChanges(ctx context.Context, q DBTX, keep time.Duration) (int64, error) {
	if keep <= 0 {
		keep = DefaultAuthzChangesKeep
	}
	tag, err := q.Exec(ctx, `DELETE FROM authz_changes WHERE changed_at < now() - make_interval(secs => $1)`, keep.Seconds())
	if err != nil {
		return 0, fmt.Errorf("store: prune authz changes: %w", err)
	}
	return tag.RowsAffected(), nil
}

// ListenAuthzChanges opens a dedicated connection (not one of the pool's),
// LISTENs on AuthzChannel and calls notify once listening (changes may have
// committed before) and then on every notification, until ctx ends or the
// connection fails; it returns the reason. The caller reconnects.
func (s *Store) ListenAuthzChanges(ctx context.Context, notify func()) error {
	return s.Listen(ctx, AuthzChannel, notify, func(string) { notify() })
}

// VisibleIn is the list pre-filter, as one SQL condition: the row whose id
// is idColumn has an authorization row of the type in parameter typeParam,
// in the tenant's view (its own, or shared with it when shared is set) of
// the tenant in parameter tenantParam. A list selects with it, then decides
// on each item it kept.
func VisibleIn(idColumn, tenantParam, typeParam string, shared bool) string {
	view := `a.tenant_id = ` + tenantParam
	if shared {
		view = `(a.tenant_id = ` + tenantParam + ` OR ` + tenantParam + ` = ANY (a.shared_with) OR '` + SharedWithAll + `' = ANY (a.shared_with))`
	}
	return `EXISTS (SELECT 1 FROM authz_resources a WHERE a.type = ` + typeParam + ` AND a.id = ` + idColumn + ` AND ` + view + `)`
}
