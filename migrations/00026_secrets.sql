-- +goose Up
-- Secrets, sealed: a row holds the current version's value encrypted with a
-- fresh data key (AES-256-GCM), the data key wrapped by the key-encryption
-- key named by kek_id, and the ciphertext bound to (tenant, name, version)
-- as associated data. Nothing here is the value in clear, and nothing here
-- opens without the key-encryption key, which is never in the database.
CREATE TABLE secrets (
    tenant_id   text NOT NULL,
    name        text NOT NULL CHECK (name ~ '^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$'),
    scope       text NOT NULL CHECK (scope IN ('tenant', 'fleet')),
    description text NOT NULL DEFAULT '',
    version     bigint NOT NULL CHECK (version > 0),
    kek_id      text NOT NULL,
    sealed      bytea NOT NULL,
    created_by  text NOT NULL,
    updated_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);
CREATE INDEX secrets_kek ON secrets (kek_id);

-- The idempotency keys of secrets.put: a retry with a key answers the put
-- it made. The request is kept only as its SHA-256 sealed like a value (a
-- bare digest of a short password could be guessed offline); the answer
-- holds the reference, never the value. A key lives as long as its secret.
CREATE TABLE secret_put_keys (
    tenant_id       text NOT NULL,
    identity_id     text NOT NULL,
    idempotency_key text NOT NULL,
    name            text NOT NULL,
    kek_id          text NOT NULL,
    sealed_request  bytea NOT NULL,
    answer          jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, identity_id, idempotency_key),
    FOREIGN KEY (tenant_id, name) REFERENCES secrets (tenant_id, name) ON DELETE CASCADE
);
CREATE INDEX secret_put_keys_secret ON secret_put_keys (tenant_id, name);

-- Every resolution of a secret's value (secret.resolved): who received it,
-- for what and when; never the value. Append-only.
CREATE TABLE secret_resolutions (
    id            text PRIMARY KEY,
    tenant_id     text NOT NULL,
    name          text NOT NULL,
    version       bigint NOT NULL,
    purpose       text NOT NULL,
    identity_kind text NOT NULL,
    identity_id   text NOT NULL,
    resource_type text NOT NULL DEFAULT '',
    resource_id   text NOT NULL DEFAULT '',
    request_id    text NOT NULL DEFAULT '',
    at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX secret_resolutions_tenant_at ON secret_resolutions (tenant_id, at);

-- +goose StatementBegin
CREATE FUNCTION secret_resolutions_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'secret_resolutions is append-only';
END $$;
-- +goose StatementEnd
CREATE TRIGGER secret_resolutions_append_only BEFORE UPDATE OR DELETE ON secret_resolutions
    FOR EACH ROW EXECUTE FUNCTION secret_resolutions_append_only();

-- +goose Down
DROP TABLE secret_resolutions;
DROP FUNCTION secret_resolutions_append_only();
DROP TABLE secret_put_keys;
DROP TABLE secrets;
