-- +goose Up
-- A deploy boot's token also joins the installed system's agent to the
-- boot's node (and only while the boot is open): joined_at is its first
-- join, join_error why a join with it was refused (another hardware key),
-- so the workflow awaiting the re-join fails at once instead of waiting.
ALTER TABLE metal_boots
    ADD COLUMN joined_at  timestamptz,
    ADD COLUMN join_error text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE metal_boots DROP COLUMN joined_at, DROP COLUMN join_error;
