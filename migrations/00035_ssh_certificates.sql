-- +goose Up
-- SSH user certificate authorities: one live CA per tenant (the root
-- tenant's is the fleet CA of platform nodes), made on first use. The
-- private key is sealed by the secret store's key-encryption key (tink's
-- envelope AEAD, bound to the tenant and the CA id); it has no secret://
-- name, so no method can resolve, replace or delete it.
CREATE TABLE ssh_cas (
    id           text PRIMARY KEY,
    tenant_id    text NOT NULL,
    public_key   text NOT NULL UNIQUE, -- authorized_keys format
    fingerprint  text NOT NULL UNIQUE, -- SHA256:…
    kek_id       text NOT NULL,
    sealed       bytea NOT NULL,
    -- The next certificate's serial: serials are unique per CA.
    next_serial  bigint NOT NULL DEFAULT 1 CHECK (next_serial >= 1),
    created_at   timestamptz NOT NULL DEFAULT now(),
    retired_at   timestamptz
);
CREATE UNIQUE INDEX ssh_cas_tenant_live ON ssh_cas (tenant_id) WHERE retired_at IS NULL;

-- Issued certificates, each bound to one node (its principals are
-- <user>@<nodeId>). The user's private key is never seen.
CREATE TABLE ssh_certificates (
    id                 text PRIMARY KEY,
    tenant_id          text NOT NULL,
    node_id            text NOT NULL REFERENCES nodes (id),
    ca_id              text NOT NULL REFERENCES ssh_cas (id),
    serial             bigint NOT NULL CHECK (serial >= 1),
    key_id             text NOT NULL,
    users              text[] NOT NULL,
    principals         text[] NOT NULL,
    public_key         text NOT NULL,
    key_fingerprint    text NOT NULL,
    certificate        text NOT NULL,
    comment            text NOT NULL DEFAULT '',
    valid_after        timestamptz NOT NULL,
    valid_before       timestamptz NOT NULL CHECK (valid_before > valid_after),
    issued_by          text NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    revoked_at         timestamptz,
    revoked_by         text NOT NULL DEFAULT '',
    UNIQUE (ca_id, serial)
);
CREATE INDEX ssh_certificates_node_created ON ssh_certificates (node_id, created_at, id);
-- What a node's NodeSpec lists: its revoked certificates not yet expired.
CREATE INDEX ssh_certificates_node_revoked ON ssh_certificates (node_id, valid_before) WHERE revoked_at IS NOT NULL;

-- +goose Down
DROP TABLE ssh_certificates;
DROP TABLE ssh_cas;
