-- +goose Up
-- The reservation lifecycle after placement.
-- workflow_started_at: when the API (or the reconciler) had Temporal start
-- the reservation's workflow; a placed reservation without it is one whose
-- start was lost to a crash between the commit and the start, which the
-- reconciler finishes.
-- pending_ends_at: the end an extension in flight asks for, written with the
-- authorization row in the extension's first transaction and cleared when
-- it is applied, denied or refused.
-- lease_expires_at: when an allocation lease lapses unless renewed, as of
-- the last activation or renewal (the workflow's timer is what acts on it).
ALTER TABLE reservations
    ADD COLUMN workflow_started_at timestamptz,
    ADD COLUMN pending_ends_at timestamptz,
    ADD COLUMN lease_expires_at timestamptz;
CREATE INDEX reservations_unstarted ON reservations (updated_at)
    WHERE workflow_started_at IS NULL AND state IN ('placed', 'binding', 'active', 'expired', 'releasing');

-- +goose Down
DROP INDEX reservations_unstarted;
ALTER TABLE reservations DROP COLUMN lease_expires_at, DROP COLUMN pending_ends_at, DROP COLUMN workflow_started_at;
