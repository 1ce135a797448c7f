-- +goose Up
-- An instance on a binding-instance reservation's allocation: the
-- instance's own allocation names the reservation's atoms (not booked a
-- second time) and books only its vCPU and memory. One placed instance
-- (node_id set, not yet deleted) per reservation: a draft or an admission
-- that failed has no node and holds nothing, an instance being deleted
-- still runs on the atoms.
ALTER TABLE instances ADD COLUMN reservation_id text REFERENCES reservations (id);
CREATE UNIQUE INDEX instances_reservation_live ON instances (reservation_id)
    WHERE reservation_id IS NOT NULL AND node_id IS NOT NULL AND state <> 'deleted';

-- +goose Down
DROP INDEX instances_reservation_live;
ALTER TABLE instances DROP COLUMN reservation_id;
