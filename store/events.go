package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
)

// Event is one domain fact, written in the transaction that makes it true
// (the transactional outbox: see migrations/00011_events_usage.sql).
type Event struct {
	TenantID     string
	Type         string // <resource kind>.<what happened>, e.g. "reservation.placed"
	ResourceType string // the catalog's short name, e.g. "reservation"
	ResourceID   string
	ProjectID    string         // "" when none
	Data         map[string]any // e.g. {"from":"pending","to":"placed","poolId":...}
}

// StoredEvent is an event as the outbox holds it.
type StoredEvent struct {
	Event
	ID        string // evt_<ULID>
	Seq       int64  // global, increasing; the listing cursor
	CreatedAt time.Time
}

// PublishEvent records e in tx. Publishers never wait for each other: the
// row carries its transaction's id, and ListEvents returns only events whose
// transaction is older than every transaction still running, so a reader
// paging by seq never skips an event that took its seq before a later one
// but committed after it.
func PublishEvent(ctx context.Context, tx Tx, e Event) error {
	switch {
	case e.TenantID == "":
		return errors.New("store: event without a tenant")
	case e.Type == "":
		return errors.New("store: event without a type")
	case e.ResourceType == "" || e.ResourceID == "":
		return fmt.Errorf("store: event %s without its resource", e.Type)
	}
	data := e.Data
	if data == nil {
		data = map[string]any{}
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("store: event %s data: %w", e.Type, err)
	}
	_, err = tx.Exec(ctx, `INSERT INTO events (id, tenant_id, type, resource_type, resource_id, project_id, data)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		core.NewID("evt"), e.TenantID, e.Type, e.ResourceType, e.ResourceID, e.ProjectID, raw)
	return err
}

// EventQuery selects a tenant's events: those after the cursor, in seq
// order, at most Limit of them.
type EventQuery struct {
	TenantID   string
	After      int64    // seq cursor: events with seq > After
	Types      []string // exact types; none means all
	ResourceID string   // "" means all
	Limit      int
}

// ListEvents returns the tenant's events that q selects, ascending by seq.
// Events of transactions not yet known to be older than every running one
// are held back until they are (see PublishEvent).
func ListEvents(ctx context.Context, tx Tx, q EventQuery) ([]StoredEvent, error) {
	if q.TenantID == "" {
		return nil, errors.New("store: events without a tenant")
	}
	if q.Limit < 1 {
		return nil, fmt.Errorf("store: event limit %d", q.Limit)
	}
	types := q.Types
	if types == nil {
		types = []string{}
	}
	rows, err := tx.Query(ctx, `SELECT seq, id, tenant_id, type, resource_type, resource_id, project_id, data, created_at
		FROM events
		WHERE tenant_id = $1 AND seq > $2 AND xid < pg_snapshot_xmin(pg_current_snapshot())
		  AND (cardinality($3::text[]) = 0 OR type = ANY ($3))
		  AND ($4 = '' OR resource_id = $4)
		ORDER BY seq LIMIT $5`, q.TenantID, q.After, types, q.ResourceID, q.Limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (StoredEvent, error) {
		var e StoredEvent
		var raw []byte
		if err := r.Scan(&e.Seq, &e.ID, &e.TenantID, &e.Type, &e.ResourceType, &e.ResourceID, &e.ProjectID, &raw, &e.CreatedAt); err != nil {
			return e, err
		}
		return e, json.Unmarshal(raw, &e.Data)
	})
}
