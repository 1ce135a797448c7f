package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// UsageClassGPU is the atom class whose unit-hours are GPU-hours (whole
// GPUs; core/placement.ClassGPU).
const UsageClassGPU = "gpu"

// UsageInterval opens metering when a reservation becomes active.
type UsageInterval struct {
	ReservationID, TenantID, ProjectID, PoolID, GPUModel, Class string
	Units                                                       int // atoms held (for class "gpu": GPUs)
}

// OpenUsage starts u's interval at the transaction's time. A reservation
// that already has an open interval keeps it: the second open does nothing.
func OpenUsage(ctx context.Context, tx Tx, u UsageInterval) error {
	switch {
	case u.ReservationID == "" || u.TenantID == "" || u.PoolID == "":
		return errors.New("store: usage interval without its reservation, tenant or pool")
	case u.Class == "":
		return fmt.Errorf("store: usage of %s without a class", u.ReservationID)
	case u.Units < 1:
		return fmt.Errorf("store: usage of %s with %d units", u.ReservationID, u.Units)
	}
	_, err := tx.Exec(ctx, `INSERT INTO usage_intervals (reservation_id, tenant_id, project_id, pool_id, gpu_model, class, units)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (reservation_id) WHERE ended_at IS NULL DO NOTHING`,
		u.ReservationID, u.TenantID, u.ProjectID, u.PoolID, u.GPUModel, u.Class, u.Units)
	return err
}

// CloseUsage ends the reservation's open interval at the transaction's
// time; with none open it does nothing. Should the database's clock have
// stepped back since the open, the interval ends where it started.
func CloseUsage(ctx context.Context, tx Tx, reservationID string) error {
	_, err := tx.Exec(ctx, `UPDATE usage_intervals SET ended_at = greatest(now(), started_at)
		WHERE reservation_id = $1 AND ended_at IS NULL`, reservationID)
	return err
}

// Usage groupings: what a UsageRow's key holds besides the tenant.
const (
	UsageByTenant      = "tenant"
	UsageByProject     = "project"
	UsageByReservation = "reservation"
)

// UsageQuery sums a tenant's usage over [From, To).
type UsageQuery struct {
	TenantID  string
	ProjectID string // "" means every project (and none)
	From, To  time.Time
	GroupBy   string // UsageByTenant (default), UsageByProject or UsageByReservation
}

// UsageRow is one group's usage of one (class, gpuModel).
type UsageRow struct {
	TenantID      string
	ProjectID     string // set when grouped by project or reservation
	ReservationID string // set when grouped by reservation
	Class         string
	GPUModel      string
	UnitHours     float64 // units × hours, clipped to [From, To)
	GPUHours      float64 // UnitHours for class "gpu", 0 otherwise
}

// SumUsage clips every interval of the tenant, [started_at, ended_at or
// now()), to [q.From, q.To) and sums units × hours per group and per
// (class, gpuModel), in the groups' order.
func SumUsage(ctx context.Context, tx Tx, q UsageQuery) ([]UsageRow, error) {
	if q.TenantID == "" {
		return nil, errors.New("store: usage without a tenant")
	}
	if !q.To.After(q.From) {
		return nil, fmt.Errorf("store: usage window [%s, %s) is empty", q.From, q.To)
	}
	var project, reservation string
	switch q.GroupBy {
	case "", UsageByTenant:
		project, reservation = `''`, `''`
	case UsageByProject:
		project, reservation = `project_id`, `''`
	case UsageByReservation:
		project, reservation = `project_id`, `reservation_id`
	default:
		return nil, fmt.Errorf("store: usage grouped by %q", q.GroupBy)
	}
	// [$3, $4) is the window. An interval counts for the part of it inside
	// the window; intervals that miss the window (or, open and started after
	// now(), have no length yet) are left out, so every span summed is
	// positive. The sum stays numeric until the division.
	rows, err := tx.Query(ctx, `SELECT `+project+`, `+reservation+`, class, gpu_model,
			(sum(units * extract(epoch FROM least(coalesce(ended_at, now()), $4) - greatest(started_at, $3))) / 3600)::float8
		FROM usage_intervals
		WHERE tenant_id = $1 AND ($2 = '' OR project_id = $2)
		  AND started_at < $4 AND (ended_at IS NULL OR ended_at > $3)
		  AND least(coalesce(ended_at, now()), $4) > greatest(started_at, $3)
		GROUP BY 1, 2, 3, 4
		ORDER BY 1, 2, 3, 4`, q.TenantID, q.ProjectID, q.From, q.To)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []UsageRow
	for rows.Next() {
		r := UsageRow{TenantID: q.TenantID}
		if err := rows.Scan(&r.ProjectID, &r.ReservationID, &r.Class, &r.GPUModel, &r.UnitHours); err != nil {
			return nil, err
		}
		if r.Class == UsageClassGPU {
			r.GPUHours = r.UnitHours
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
