package api

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// Quotas are the offers' quotas: pool_offers is their one source.
// quotas.get reads the offers a tenant received; quotas.set (the fleet's
// operators) changes one offer's quota.

// QuotaList is quotas.get's answer: the tenant's quota on each live pool
// offered to it. A resource missing from a quota grants zero.
type QuotaList struct {
	Items []PoolOffer `json:"items"`
}

func (s *Server) quotasGet(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		PoolID string `json:"poolId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	if in.PoolID != "" {
		// A pool outside the tenant's view is NOT_FOUND; its own pool has
		// no offer, so no quota items.
		if _, err := s.viewPool(ctx, tx, c.TenantID, in.PoolID); err != nil {
			return nil, err
		}
	}
	rows, err := tx.Query(ctx, `SELECT o.pool_id, o.tenant_id, o.quota, o.priority, o.include_descendants, o.created_by, o.created_at, o.updated_at
		FROM pool_offers o JOIN pools p ON p.id = o.pool_id
		WHERE o.tenant_id = $1 AND p.archived_at IS NULL AND ($2 = '' OR o.pool_id = $2)
		ORDER BY o.pool_id LIMIT $3`, c.TenantID, in.PoolID, listLimit)
	if err != nil {
		return nil, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PoolOffer, error) { return scanOffer(r) })
	if err != nil {
		return nil, err
	}
	return QuotaList{Items: items}, nil
}

// quotasSet sets tenantId's quota on a pool offered to it: the offer's
// quota, replaced whole. It is decided on compute-fleet (root tenant only),
// so it reaches any pool; a pool not offered to the tenant is NOT_FOUND.
func (s *Server) quotasSet(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		PoolID string          `json:"poolId"`
		Quota  json.RawMessage `json:"quota"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	quota, err := parseQuota(in.Quota)
	if err != nil {
		return nil, err
	}
	p, err := s.loadPoolByID(ctx, tx, in.PoolID)
	if err != nil {
		return nil, err
	}
	if p.ArchivedAt != nil {
		return nil, core.Errorf(core.CodeInvalidState, "pool %s is archived", p.ID)
	}
	quotaJSON, err := json.Marshal(quota)
	if err != nil {
		return nil, err
	}
	o, err := scanOffer(tx.QueryRow(ctx, `UPDATE pool_offers SET quota = $3, updated_at = now()
		WHERE pool_id = $1 AND tenant_id = $2 RETURNING `+offerColumns, p.ID, c.TenantID, string(quotaJSON)))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, core.Errorf(core.CodeNotFound, "pool %s is not offered to %s", p.ID, c.TenantID)
	}
	return o, err
}
