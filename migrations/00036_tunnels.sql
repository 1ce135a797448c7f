-- +goose Up
-- Tunnels (tunnels.open): one caller's single-use way through the node's
-- agent session to a TCP port on the node or an instance. Only the
-- token's SHA-256 is stored; connected_at spends it (the first connect),
-- closed_at ends the tunnel. Rows stay as the record of who reached what.
CREATE TABLE tunnels (
    id           text PRIMARY KEY,
    tenant_id    text NOT NULL,
    node_id      text NOT NULL REFERENCES nodes (id),
    instance_id  text, -- set for an instance's tunnel
    target       text NOT NULL CHECK (target IN ('tcp')),
    address      text NOT NULL, -- host:port as the node dials it
    token_hash   bytea NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
    opened_by    text NOT NULL, -- the identity that opened it
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL, -- an unopened tunnel is refused after it
    connected_at timestamptz,
    closed_at    timestamptz,
    close_reason text NOT NULL DEFAULT '',
    CHECK (expires_at > created_at),
    CHECK (closed_at IS NULL OR connected_at IS NOT NULL)
);
CREATE INDEX tunnels_tenant_created ON tunnels (tenant_id, created_at, id);
CREATE INDEX tunnels_node_open ON tunnels (node_id) WHERE connected_at IS NOT NULL AND closed_at IS NULL;

-- +goose Down
DROP TABLE tunnels;
