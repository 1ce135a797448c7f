// Package budgets is the tenant budgets' store (docs/budgets.md): a cap
// on one meter's units per calendar month (UTC), set by the operator.
// What is checked is the month's use so far, summed from the metering
// intervals (usage_intervals): a tenant at or over its cap is refused
// anything new that bills the meter. A meter without a budget is not
// capped.
package budgets

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// meterClasses maps a meter to the usage class its intervals carry.
var meterClasses = map[string]string{
	"cloud.resource.hours": "cloud.resource",
	"gpu.hours":            "gpu",
}

// Meters are the meters a budget may cap.
func Meters() []string { return []string{"cloud.resource.hours", "gpu.hours"} }

// Budget is one tenant's cap of a meter.
type Budget struct {
	TenantID   string  `json:"tenantId"`
	Meter      string  `json:"meter"`
	MonthlyCap float64 `json:"monthlyCap"`
	UpdatedBy  string  `json:"updatedBy"`
}

// Set writes the tenant's cap of meter (units per month).
func Set(ctx context.Context, tx store.Tx, b Budget) error {
	if _, ok := meterClasses[b.Meter]; !ok {
		return core.Errorf(core.CodeInvalidInput, "meter %q has no budget; one of %v", b.Meter, Meters()).
			WithDetails(map[string]any{"field": "meter", "reason": "enum"})
	}
	if b.MonthlyCap < 0 {
		return core.Errorf(core.CodeInvalidInput, "a budget's cap is not negative").
			WithDetails(map[string]any{"field": "monthlyCap", "reason": "minimum"})
	}
	_, err := tx.Exec(ctx, `INSERT INTO tenant_budgets (tenant_id, meter, monthly_cap, updated_by) VALUES ($1, $2, $3, $4)
		ON CONFLICT (tenant_id, meter) DO UPDATE SET monthly_cap = EXCLUDED.monthly_cap, updated_by = EXCLUDED.updated_by, updated_at = now()`,
		b.TenantID, b.Meter, b.MonthlyCap, b.UpdatedBy)
	return err
}

// Remove drops the tenant's cap of meter (none is not an error).
func Remove(ctx context.Context, tx store.Tx, tenantID, meter string) error {
	_, err := tx.Exec(ctx, `DELETE FROM tenant_budgets WHERE tenant_id = $1 AND meter = $2`, tenantID, meter)
	return err
}

// List reads the tenant's budgets.
func List(ctx context.Context, tx store.Tx, tenantID string) ([]Budget, error) {
	rows, err := tx.Query(ctx, `SELECT tenant_id, meter, monthly_cap::float8, updated_by FROM tenant_budgets WHERE tenant_id = $1 ORDER BY meter`, tenantID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Budget])
}

// Check refuses when the tenant's use of meter this month has reached its
// cap: QUOTA_EXCEEDED with reason budget, the meter, limit and used.
func Check(ctx context.Context, tx store.Tx, tenantID, meter string) error {
	class, ok := meterClasses[meter]
	if !ok {
		return fmt.Errorf("budgets: unknown meter %q", meter)
	}
	var limit float64
	err := tx.QueryRow(ctx, `SELECT monthly_cap::float8 FROM tenant_budgets WHERE tenant_id = $1 AND meter = $2`, tenantID, meter).Scan(&limit)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	} else if err != nil {
		return err
	}
	used, err := MonthToDate(ctx, tx, tenantID, class)
	if err != nil {
		return err
	}
	if used >= limit {
		return core.Errorf(core.CodeQuotaExceeded, "the tenant used %.2f of its %.2f %s budget this month", used, limit, meter).
			WithDetails(map[string]any{"reason": "budget", "meter": meter, "limit": limit, "used": used})
	}
	return nil
}

// MonthToDate sums the units × hours of the tenant's intervals of class
// since the start of the current month (UTC, by the database's clock).
func MonthToDate(ctx context.Context, tx store.Tx, tenantID, class string) (float64, error) {
	var used float64
	err := tx.QueryRow(ctx, `SELECT COALESCE(sum(units * extract(epoch FROM coalesce(ended_at, now()) - greatest(started_at, m.start)) / 3600), 0)::float8
		FROM usage_intervals, (SELECT date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS start) m
		WHERE tenant_id = $1 AND class = $2 AND (ended_at IS NULL OR ended_at > m.start)
			AND coalesce(ended_at, now()) > greatest(started_at, m.start)`, tenantID, class).Scan(&used)
	return used, err
}
