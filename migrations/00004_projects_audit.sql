-- +goose Up
-- Projects: an application-owned grouping inside a tenant.
CREATE TABLE projects (
    id          text PRIMARY KEY,
    tenant_id   text NOT NULL,
    name        text NOT NULL,
    description text NOT NULL DEFAULT '',
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    archived_at timestamptz
);
-- A live project's name is unique in its tenant; archived ones free it.
CREATE UNIQUE INDEX projects_tenant_name ON projects (tenant_id, name) WHERE archived_at IS NULL;
CREATE INDEX projects_tenant_created ON projects (tenant_id, created_at, id);

-- The admission context of every allowed mutation, written in the same
-- transaction as the change (IAM audits denials, not allows).
CREATE TABLE audit_events (
    id            text PRIMARY KEY,
    tenant_id     text NOT NULL,
    at            timestamptz NOT NULL DEFAULT now(),
    method        text NOT NULL,
    action        text NOT NULL,
    resource_type text NOT NULL,
    resource_id   text NOT NULL,
    identity_id   text NOT NULL,
    identity_kind text NOT NULL,
    session_id    text NOT NULL,
    session_kind  text NOT NULL,
    mfa           boolean NOT NULL,
    agent_id      text,
    delegated_by  text,
    request_id    text NOT NULL,
    source_ip     text,
    override      boolean NOT NULL DEFAULT false
);
CREATE INDEX audit_events_tenant_at ON audit_events (tenant_id, at);

-- +goose Down
DROP TABLE audit_events;
DROP TABLE projects;
