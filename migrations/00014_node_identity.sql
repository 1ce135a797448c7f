-- +goose Up
-- Join requests: a join to a pool whose policy.acceptance lists "approval"
-- waits here for joinRequests.approve or .reject. The join token was spent
-- when the request was recorded; the agent polls with the request secret,
-- of which only the SHA-256 is stored. The CSR and, once approved, the
-- certificate are public material (no private key is ever sent). A pending
-- request past expires_at reads as expired; its state is never rewritten.
CREATE TABLE join_requests (
    id                  text PRIMARY KEY,
    tenant_id           text NOT NULL,
    pool_id             text NOT NULL REFERENCES pools (id),
    join_token_id       text NOT NULL REFERENCES join_tokens (id),
    name                text NOT NULL,
    hardware_key        text NOT NULL DEFAULT '',
    inventory           jsonb NOT NULL,
    csr                 text NOT NULL,
    request_secret_hash bytea NOT NULL UNIQUE CHECK (length(request_secret_hash) = 32),
    state               text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'approved', 'rejected', 'expired')),
    node_id             text REFERENCES nodes (id),
    certificate         text NOT NULL DEFAULT '',
    decided_by          text NOT NULL DEFAULT '',
    decided_at          timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    expires_at          timestamptz NOT NULL DEFAULT now() + interval '24 hours',
    CHECK ((state = 'approved') = (node_id IS NOT NULL))
);
CREATE INDEX join_requests_tenant_pool ON join_requests (tenant_id, pool_id, created_at, id);

-- Node identities: every client certificate the node CA issued to a node.
-- A session is accepted only for a serial recorded here, not revoked and
-- not expired; revoking one notifies node_identity_revoked (payload: the
-- node id) so the session holding it is closed at once.
CREATE TABLE node_identities (
    serial      text PRIMARY KEY,
    node_id     text NOT NULL REFERENCES nodes (id),
    certificate text NOT NULL,
    issued_at   timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    revoked_at  timestamptz,
    revoked_by  text NOT NULL DEFAULT ''
);
CREATE INDEX node_identities_node ON node_identities (node_id) WHERE revoked_at IS NULL;

-- +goose Down
DROP TABLE node_identities;
DROP TABLE join_requests;
