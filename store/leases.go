package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
)

// Leases (spec/domain-model.md "Leases"): a shard, pool or site lease gives
// one worker or agent ownership with a fencing epoch. Expiry is decided by
// the database's clock, never the caller's, so holders on machines whose
// clocks disagree still agree on who holds a lease.

// Lease is a held lease: its name, holder, fencing epoch and when it
// expires unless renewed.
type Lease struct {
	Name      string
	Holder    string
	Epoch     int64
	ExpiresAt time.Time
}

// SiteBootLease is the name of a site's boot lease, held by the one `bcd
// site` agent that serves the site's task queue.
func SiteBootLease(siteID string) string { return "site:" + siteID + ":boot" }

// leaseLostMessage is RenewLease's message when the holder no longer holds the
// lease at that epoch.
const leaseLostMessage = "lease lost"

func checkLease(name, holder string, ttl time.Duration) error {
	switch {
	case name == "":
		return core.Errorf(core.CodeInvalidInput, "a lease name is required").WithDetails(map[string]any{"field": "name"})
	case holder == "":
		return core.Errorf(core.CodeInvalidInput, "a lease holder is required").WithDetails(map[string]any{"field": "holder"})
	case ttl < time.Millisecond:
		return core.Errorf(core.CodeInvalidInput, "a lease's ttl must be at least 1 ms").WithDetails(map[string]any{"field": "ttl"})
	}
	return nil
}

func scanLease(row pgx.Row) (Lease, error) {
	var l Lease
	err := row.Scan(&l.Name, &l.Holder, &l.Epoch, &l.ExpiresAt)
	return l, err
}

// AcquireLease takes the lease name for holder for ttl. A free or expired
// lease is taken with the next epoch (1 for a new one); a live lease of the
// same holder is renewed at its epoch. A live lease of another holder is
// CONFLICT, naming neither the holder nor the epoch. Two holders racing for
// one lease serialize on its row: one wins, the other is CONFLICT.
func AcquireLease(ctx context.Context, tx Tx, name, holder string, ttl time.Duration) (Lease, error) {
	if err := checkLease(name, holder, ttl); err != nil {
		return Lease{}, err
	}
	l, err := scanLease(tx.QueryRow(ctx, `
		INSERT INTO leases AS l (name, holder, epoch, expires_at, acquired_at, renewed_at)
		VALUES ($1, $2, 1, now() + $3::bigint * interval '1 microsecond', now(), now())
		ON CONFLICT (name) DO UPDATE SET
			holder      = EXCLUDED.holder,
			epoch       = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > now() THEN l.epoch ELSE l.epoch + 1 END,
			acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > now() THEN l.acquired_at ELSE now() END,
			expires_at  = EXCLUDED.expires_at,
			renewed_at  = now()
		WHERE l.holder = EXCLUDED.holder OR l.expires_at <= now()
		RETURNING name, holder, epoch, expires_at`, name, holder, ttl.Microseconds()))
	if errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, core.Errorf(core.CodeConflict, "lease %s is held by another holder", name).
			WithDetails(map[string]any{"reason": "held"})
	}
	return l, err
}

// RenewLease extends holder's lease at epoch by ttl from now. When the
// lease expired, or another holder (or a later epoch) holds it, it is
// CONFLICT "lease lost": the caller must stop acting on the lease.
func RenewLease(ctx context.Context, tx Tx, name, holder string, epoch int64, ttl time.Duration) (Lease, error) {
	if err := checkLease(name, holder, ttl); err != nil {
		return Lease{}, err
	}
	l, err := scanLease(tx.QueryRow(ctx, `
		UPDATE leases SET expires_at = now() + $4::bigint * interval '1 microsecond', renewed_at = now()
		WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()
		RETURNING name, holder, epoch, expires_at`, name, holder, epoch, ttl.Microseconds()))
	if errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, core.Errorf(core.CodeConflict, "%s: %s", leaseLostMessage, name).
			WithDetails(map[string]any{"reason": "leaseLost"})
	}
	return l, err
}

// ReleaseLease gives up holder's lease at epoch: it expires now, keeping its
// epoch, so the next holder takes it with a higher one. Releasing a lease
// that is not held at that epoch does nothing.
func ReleaseLease(ctx context.Context, tx Tx, name, holder string, epoch int64) error {
	_, err := tx.Exec(ctx, `UPDATE leases SET expires_at = now(), renewed_at = now()
		WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()`, name, holder, epoch)
	return err
}
