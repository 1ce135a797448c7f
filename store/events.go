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

// PublishEvent records e in tx. Publishers never wait for each other: the
// row carries its transaction's id, and readers (store/events) see only
// events whose transaction is older than every transaction still running,
// so a reader paging by seq never skips an event that took its seq before a
// later one but committed after it.
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
