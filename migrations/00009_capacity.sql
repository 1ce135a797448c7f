-- +goose Up
-- Bookings: one row per atom per allocation and time range. The exclusion
-- constraint allows one booking per atom (node_id, device_id: devices' key)
-- per instant, so the database, not the scheduler, makes double-booking
-- impossible (SQLSTATE 23P01). Reservations write it; capacity reads it.
CREATE TABLE device_bookings (
    device_node_id text NOT NULL,
    device_id      text NOT NULL,
    allocation_id  text NOT NULL,
    tenant_id      text NOT NULL, -- the booking tenant
    pool_id        text NOT NULL REFERENCES pools (id),
    during         tstzrange NOT NULL CHECK (NOT isempty(during) AND NOT lower_inf(during)),
    kind           text NOT NULL CHECK (kind <> ''),
    created_at     timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (device_node_id, device_id) REFERENCES devices (node_id, device_id),
    EXCLUDE USING gist (device_node_id WITH =, device_id WITH =, during WITH &&)
);
CREATE INDEX device_bookings_pool_during ON device_bookings USING gist (pool_id, during);
CREATE INDEX device_bookings_allocation ON device_bookings (allocation_id);

-- +goose Down
DROP TABLE device_bookings;
