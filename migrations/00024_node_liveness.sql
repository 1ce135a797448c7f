-- +goose Up
-- Node liveness leaves the wide nodes row: a heartbeat is the most frequent
-- write of the fleet, and on nodes it rewrote a row of every axis and
-- touched the liveness index, so no update was HOT. node_liveness holds
-- only what a heartbeat writes. session_epoch is a copy of
-- nodes.session_epoch, written with it at hello, so a heartbeat is fenced
-- without reading the wide row. expires_at is the liveness lease.
-- No index but the key: the sweeper's scan of a narrow table is cheap, and
-- an index on expires_at would make every heartbeat a non-HOT update.
-- fillfactor 50 leaves room on each page for the new row versions.
CREATE TABLE node_liveness (
    node_id           text PRIMARY KEY REFERENCES nodes (id) ON DELETE CASCADE,
    session_epoch     bigint NOT NULL DEFAULT 0 CHECK (session_epoch >= 0),
    expires_at        timestamptz NOT NULL,
    last_heartbeat_at timestamptz NOT NULL,
    clock_skew_ms     bigint
) WITH (fillfactor = 50);

INSERT INTO node_liveness (node_id, session_epoch, expires_at, last_heartbeat_at, clock_skew_ms)
SELECT id, session_epoch, liveness_expires_at, coalesce(last_heartbeat_at, liveness_expires_at), clock_skew_ms
FROM nodes WHERE liveness_expires_at IS NOT NULL;

DROP INDEX nodes_liveness;
ALTER TABLE nodes
    DROP COLUMN liveness_expires_at,
    DROP COLUMN last_heartbeat_at,
    DROP COLUMN clock_skew_ms;

-- +goose Down
ALTER TABLE nodes
    ADD COLUMN liveness_expires_at timestamptz,
    ADD COLUMN last_heartbeat_at   timestamptz,
    ADD COLUMN clock_skew_ms       bigint;
UPDATE nodes n SET liveness_expires_at = l.expires_at, last_heartbeat_at = l.last_heartbeat_at,
    clock_skew_ms = l.clock_skew_ms
FROM node_liveness l WHERE l.node_id = n.id;
CREATE INDEX nodes_liveness ON nodes (liveness_expires_at)
    WHERE deleted_at IS NULL AND liveness_expires_at IS NOT NULL AND connectivity <> 'lost';
DROP TABLE node_liveness;
