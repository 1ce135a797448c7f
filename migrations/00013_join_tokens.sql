-- +goose Up
-- Join tokens: what `bcd node join` presents to join a pool. Pool-scoped,
-- expiring and use-limited. Only the SHA-256 of the token is stored; the
-- token itself is shown once, in joinTokens.create's answer. A row is never
-- deleted: list shows revoked, expired and exhausted tokens too.
CREATE TABLE join_tokens (
    id          text PRIMARY KEY,
    tenant_id   text NOT NULL,
    pool_id     text NOT NULL REFERENCES pools (id),
    name        text NOT NULL DEFAULT '',
    token_hash  bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    expires_at  timestamptz NOT NULL,
    max_uses    integer NOT NULL CHECK (max_uses BETWEEN 1 AND 10000),
    uses        integer NOT NULL DEFAULT 0 CHECK (uses >= 0 AND uses <= max_uses),
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX join_tokens_tenant_pool ON join_tokens (tenant_id, pool_id, created_at, id);

-- +goose Down
DROP TABLE join_tokens;
