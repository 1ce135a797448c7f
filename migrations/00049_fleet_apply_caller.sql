-- +goose Up
-- Who asked for a fleet apply, as each of its changes' audit rows records
-- it (the identity, session and request of the fleet.apply call).
ALTER TABLE fleet_applies ADD COLUMN caller jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(caller) = 'object');

-- +goose Down
ALTER TABLE fleet_applies DROP COLUMN caller;
