-- +goose Up
-- Node sessions (docs/agent-protocol.md, "The session"). session_epoch is
-- the fencing epoch: each hello increments it, and every later write of a
-- session is conditional on it, so of two sessions for one node only the
-- newer writes. liveness_expires_at is the liveness lease a heartbeat
-- renews; the liveness sweeper turns a lapsed one into unreachable, then
-- lost. clock_skew_ms is the agent's clock minus the server's at the last
-- hello or heartbeat.
ALTER TABLE nodes
    ADD COLUMN session_epoch       bigint NOT NULL DEFAULT 0 CHECK (session_epoch >= 0),
    ADD COLUMN liveness_expires_at timestamptz,
    ADD COLUMN last_heartbeat_at   timestamptz,
    ADD COLUMN agent_version       text NOT NULL DEFAULT '',
    ADD COLUMN clock_skew_ms       bigint;
-- The liveness sweeper's scan: live nodes holding a lease, not yet lost.
CREATE INDEX nodes_liveness ON nodes (liveness_expires_at)
    WHERE deleted_at IS NULL AND liveness_expires_at IS NOT NULL AND connectivity <> 'lost';

-- +goose Down
DROP INDEX nodes_liveness;
ALTER TABLE nodes
    DROP COLUMN clock_skew_ms,
    DROP COLUMN agent_version,
    DROP COLUMN last_heartbeat_at,
    DROP COLUMN liveness_expires_at,
    DROP COLUMN session_epoch;
