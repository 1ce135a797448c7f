-- +goose Up
-- btree_gist lets device bookings exclude overlapping ranges per device
-- (EXCLUDE USING gist (device_id WITH =, during WITH &&)).
CREATE EXTENSION IF NOT EXISTS btree_gist;

-- +goose Down
DROP EXTENSION IF EXISTS btree_gist;
