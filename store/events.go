package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

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

// PublishEvent records e in tx. Its number among its tenant's events (the
// listing cursor, store/events) is given when tx commits, in commit order:
// publishers of one tenant wait for each other only during their commits
// (migrations/00023_event_tenant_seq.sql).
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
