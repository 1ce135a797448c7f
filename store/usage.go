package store

import (
	"context"
	"errors"
	"fmt"
)

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
