-- +goose Up
-- Draining a node (nodes.drain): drain_state is '' (not draining),
-- 'draining' (cordoned; its reservations are waited for, or released, by
-- the node's drain workflow) or 'drained' (none left). drain_mode is how
-- the drain treats reservations: 'wait' or 'release'. nodes.uncordon ends
-- a drain.
ALTER TABLE nodes
    ADD COLUMN drain_state text NOT NULL DEFAULT '' CHECK (drain_state IN ('', 'draining', 'drained')),
    ADD COLUMN drain_mode text NOT NULL DEFAULT '' CHECK (drain_mode IN ('', 'wait', 'release')),
    ADD COLUMN drain_requested_at timestamptz;
CREATE INDEX nodes_pool_draining ON nodes (pool_id) WHERE drain_state = 'draining' AND deleted_at IS NULL;

-- +goose Down
DROP INDEX nodes_pool_draining;
ALTER TABLE nodes DROP COLUMN drain_requested_at, DROP COLUMN drain_mode, DROP COLUMN drain_state;
