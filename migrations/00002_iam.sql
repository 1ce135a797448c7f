-- +goose Up
-- The embedded IAM (iam/embedded.go, iam/admin.go, iam/audit.go): tenants,
-- identities, bearer-token sessions, Cedar policies, relations and the
-- per-tenant hash-chained audit log. Only the iam package reads or writes
-- these tables (DESIGN.md §2: reachable only through the IamPort).

CREATE TABLE iam_tenants (
    id             text PRIMARY KEY,
    name           text NOT NULL,
    -- Bumped in the same transaction as every policy change; each decision
    -- reads it, so a process's parsed-policy cache is never stale.
    policy_version bigint NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT iam_tenants_id CHECK (id ~ '^[A-Za-z0-9._:-]{1,128}$'),
    CONSTRAINT iam_tenants_name CHECK (length(name) BETWEEN 1 AND 200)
);

CREATE TABLE iam_identities (
    id             text PRIMARY KEY,
    tenant_id      text NOT NULL REFERENCES iam_tenants (id),
    kind           text NOT NULL,
    name           text NOT NULL,
    root_authority boolean NOT NULL DEFAULT false,
    -- Cedar parents of the principal: Group::"<name>".
    groups         text[] NOT NULL DEFAULT '{}',
    created_at     timestamptz NOT NULL DEFAULT now(),
    disabled_at    timestamptz,
    CONSTRAINT iam_identities_id CHECK (id ~ '^idn_[0-9a-hjkmnp-tv-z]{26}$'),
    CONSTRAINT iam_identities_kind CHECK (kind IN ('person', 'service', 'agent')),
    CONSTRAINT iam_identities_tenant_id UNIQUE (tenant_id, id),
    CONSTRAINT iam_identities_tenant_name UNIQUE (tenant_id, name)
);

-- A bearer API token is a session. Only the token's SHA-256 is stored; the
-- plaintext is returned once, at creation.
CREATE TABLE iam_sessions (
    id           text PRIMARY KEY,
    tenant_id    text NOT NULL,
    identity_id  text NOT NULL,
    token_sha256 bytea NOT NULL,
    session_kind text NOT NULL,
    mfa          boolean NOT NULL DEFAULT false,
    delegated_by text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    revoked_at   timestamptz,
    CONSTRAINT iam_sessions_id CHECK (id ~ '^ses_[0-9a-hjkmnp-tv-z]{26}$'),
    CONSTRAINT iam_sessions_token_sha256 UNIQUE (token_sha256),
    CONSTRAINT iam_sessions_token_length CHECK (length(token_sha256) = 32),
    CONSTRAINT iam_sessions_kind CHECK (session_kind IN ('user', 'service', 'agent')),
    CONSTRAINT iam_sessions_mfa CHECK (NOT mfa OR session_kind = 'user'),
    CONSTRAINT iam_sessions_identity FOREIGN KEY (tenant_id, identity_id) REFERENCES iam_identities (tenant_id, id),
    CONSTRAINT iam_sessions_delegated_by FOREIGN KEY (tenant_id, delegated_by) REFERENCES iam_identities (tenant_id, id)
);
CREATE INDEX iam_sessions_identity ON iam_sessions (identity_id);

CREATE TABLE iam_policies (
    id         text PRIMARY KEY,
    tenant_id  text NOT NULL REFERENCES iam_tenants (id),
    name       text NOT NULL,
    cedar      text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT iam_policies_tenant_name UNIQUE (tenant_id, name)
);

-- The caller's relations on a resource (compute-pool user, …). Types are
-- stored as policies see them, with the catalog's prefix.
CREATE TABLE iam_relations (
    tenant_id     text NOT NULL,
    subject_id    text NOT NULL,
    resource_type text NOT NULL,
    resource_id   text NOT NULL,
    relation      text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, subject_id, resource_type, resource_id, relation),
    CONSTRAINT iam_relations_subject FOREIGN KEY (tenant_id, subject_id) REFERENCES iam_identities (tenant_id, id)
);
CREATE INDEX iam_relations_resource ON iam_relations (tenant_id, resource_type, resource_id);

-- The audit chain: per tenant, append-only, hash-chained. hash =
-- SHA-256(prev_hash || canonical JSON of the entry); the first entry's
-- prev_hash is 32 zero bytes. The head row is locked FOR UPDATE by every
-- append, which serialises appends per tenant. No foreign key to
-- iam_tenants: a ROOT_OVERRIDE may be audited on a tenant IAM has no row for.
CREATE TABLE iam_audit_heads (
    tenant_id text PRIMARY KEY,
    seq       bigint NOT NULL,
    hash      bytea NOT NULL,
    CONSTRAINT iam_audit_heads_hash CHECK (length(hash) = 32)
);

CREATE TABLE iam_audit_entries (
    tenant_id        text NOT NULL,
    seq              bigint NOT NULL,
    id               text NOT NULL,
    at               timestamptz NOT NULL,
    kind             text NOT NULL,
    identity_id      text NOT NULL,
    session_id       text NOT NULL,
    action           text NOT NULL,
    resource_type    text NOT NULL,
    resource_id      text NOT NULL,
    allowed          boolean NOT NULL,
    reason           text NOT NULL,
    request_id       text NOT NULL,
    target_tenant_id text NOT NULL,
    details          jsonb NOT NULL,
    prev_hash        bytea NOT NULL,
    hash             bytea NOT NULL,
    PRIMARY KEY (tenant_id, seq),
    CONSTRAINT iam_audit_entries_id UNIQUE (id),
    CONSTRAINT iam_audit_entries_seq CHECK (seq >= 1),
    CONSTRAINT iam_audit_entries_hashes CHECK (length(prev_hash) = 32 AND length(hash) = 32)
);

-- +goose StatementBegin
CREATE FUNCTION iam_audit_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'iam_audit_entries is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER iam_audit_entries_no_update
    BEFORE UPDATE OR DELETE ON iam_audit_entries
    FOR EACH ROW EXECUTE FUNCTION iam_audit_append_only();
CREATE TRIGGER iam_audit_entries_no_truncate
    BEFORE TRUNCATE ON iam_audit_entries
    FOR EACH STATEMENT EXECUTE FUNCTION iam_audit_append_only();

-- +goose Down
DROP TABLE iam_audit_entries;
DROP FUNCTION iam_audit_append_only();
DROP TABLE iam_audit_heads;
DROP TABLE iam_relations;
DROP TABLE iam_policies;
DROP TABLE iam_sessions;
DROP TABLE iam_identities;
DROP TABLE iam_tenants;
