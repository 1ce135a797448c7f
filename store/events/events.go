// Package events is the events domain: reading the outbox that state
// writers fill with store.PublishEvent, a tenant's events by its own
// sequence (tenant_seq), so a cursor tells nothing of other tenants.
// The writer stays in store so that every state writer can reach it.
package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/store"
)

// Event is one domain event as the API returns it.
type Event struct {
	ID           string         `json:"id"`
	Seq          int64          `json:"seq"`
	Type         string         `json:"type"`
	ResourceType string         `json:"resourceType"`
	ResourceID   string         `json:"resourceId"`
	ProjectID    string         `json:"projectId,omitempty"`
	Data         map[string]any `json:"data"`
	CreatedAt    int64          `json:"createdAt"`
}

// Page is one page of a tenant's events. The outbox is a feed with no end,
// so NextCursor follows every page that has items (the position after its
// last event) and is left out of an empty page only: there are no newer
// events yet, and a reader polls again with the cursor it sent.
type Page struct {
	Items      []Event `json:"items"`
	NextCursor string  `json:"nextCursor,omitempty"`
}

// Stored is an event as the outbox holds it.
type Stored struct {
	store.Event
	ID string // evt_<ULID>
	// Seq is the event's number among its tenant's events (tenant_seq):
	// 1, 2, 3… in commit order, with no gaps; the listing cursor.
	Seq       int64
	CreatedAt time.Time
}

// Query selects a tenant's events: those after the cursor, in seq order,
// at most Limit of them.
type Query struct {
	TenantID   string
	After      int64    // cursor: the tenant's events with Seq > After
	Types      []string // exact types; none means all
	ResourceID string   // "" means all
	Limit      int
}

// List is the page of the tenant's events that q selects.
func List(ctx context.Context, tx store.Tx, q Query) (Page, error) {
	got, err := Read(ctx, tx, q)
	if err != nil {
		return Page{}, err
	}
	out := Page{Items: make([]Event, len(got))}
	for i, e := range got {
		out.Items[i] = Event{ID: e.ID, Seq: e.Seq, Type: e.Type, ResourceType: e.ResourceType, ResourceID: e.ResourceID,
			ProjectID: e.ProjectID, Data: e.Data, CreatedAt: e.CreatedAt.UnixMilli()}
	}
	if len(got) > 0 {
		out.NextCursor = store.EncodeCursor(store.Key{Seq: got[len(got)-1].Seq})
	}
	return out, nil
}

// Read returns the tenant's events that q selects, ascending by their
// tenant's sequence. That sequence follows commit order with no gaps
// (migrations/00023_event_tenant_seq.sql), so every event a later page
// could hold commits after this read and numbers above its last item: a
// cursor never skips one, and nothing needs holding back.
func Read(ctx context.Context, tx store.Tx, q Query) ([]Stored, error) {
	if q.TenantID == "" {
		return nil, errors.New("events: a query without a tenant")
	}
	if q.Limit < 1 {
		return nil, fmt.Errorf("events: limit %d", q.Limit)
	}
	types := q.Types
	if types == nil {
		types = []string{}
	}
	rows, err := tx.Query(ctx, `SELECT tenant_seq, id, tenant_id, type, resource_type, resource_id, project_id, data, created_at
		FROM events
		WHERE tenant_id = $1 AND tenant_seq > $2
		  AND (cardinality($3::text[]) = 0 OR type = ANY ($3))
		  AND ($4 = '' OR resource_id = $4)
		ORDER BY tenant_seq LIMIT $5`, q.TenantID, q.After, types, q.ResourceID, q.Limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Stored, error) {
		var e Stored
		var raw []byte
		if err := r.Scan(&e.Seq, &e.ID, &e.TenantID, &e.Type, &e.ResourceType, &e.ResourceID, &e.ProjectID, &raw, &e.CreatedAt); err != nil {
			return e, err
		}
		return e, json.Unmarshal(raw, &e.Data)
	})
}
