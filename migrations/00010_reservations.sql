-- +goose Up
-- Reservations: a tenant's claim on a pool. id is the draft's id, derived
-- from (tenant, caller, idempotency key); state changes only through
-- core/reservations.Transition. devices is the normalized
-- core/placement request; [starts_at, ends_at) the window.
CREATE TABLE reservations (
    id                text PRIMARY KEY,
    tenant_id         text NOT NULL,
    owner_identity_id text NOT NULL,
    pool_id           text NOT NULL REFERENCES pools (id),
    project_id        text NOT NULL DEFAULT '',
    state             text NOT NULL CHECK (state IN ('draft', 'denied', 'awaiting-confirmation', 'pending', 'placed',
                          'binding', 'active', 'releasing', 'released', 'failed', 'cancelled', 'expired')),
    devices           jsonb NOT NULL CHECK (jsonb_typeof(devices) = 'object'),
    starts_at         timestamptz NOT NULL,
    ends_at           timestamptz NOT NULL CHECK (ends_at > starts_at),
    binding           text NOT NULL DEFAULT 'hold' CHECK (binding IN ('hold', 'instance', 'node')),
    lease_seconds     bigint CHECK (lease_seconds IS NULL OR lease_seconds > 0),
    spot              boolean NOT NULL DEFAULT false,
    -- Why it failed: {code, reasons}; null otherwise.
    failure           jsonb,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX reservations_tenant ON reservations (tenant_id, created_at);
CREATE INDEX reservations_pool_state ON reservations (pool_id, state);

-- Allocations: a placement on one node (a gang has one per node). Its
-- bookings are device_bookings rows with allocation_id = id.
CREATE TABLE allocations (
    id             text PRIMARY KEY,
    tenant_id      text NOT NULL,
    reservation_id text NOT NULL REFERENCES reservations (id),
    node_id        text NOT NULL REFERENCES nodes (id),
    atoms          text[] NOT NULL CHECK (cardinality(atoms) > 0),
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX allocations_reservation ON allocations (reservation_id);

-- +goose Down
DROP TABLE allocations;
DROP TABLE reservations;
