-- +goose Up
-- Profiles: versioned provisioning templates of a tenant. A live profile's
-- name is unique in its tenant; deleted ones free it. The target (metal or
-- vps) is the first version's and never changes.
CREATE TABLE profiles (
    id             text PRIMARY KEY,
    tenant_id      text NOT NULL,
    name           text NOT NULL,
    target         text NOT NULL CHECK (target IN ('metal', 'vps')),
    latest_version integer NOT NULL CHECK (latest_version >= 1),
    created_by     text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    deleted_at     timestamptz
);
CREATE UNIQUE INDEX profiles_tenant_name ON profiles (tenant_id, name) WHERE deleted_at IS NULL;
CREATE INDEX profiles_tenant_created ON profiles (tenant_id, created_at, id);

-- Versions: append-only. profiles.update writes a new one; a workflow pins
-- the version it runs, so no version ever changes once written.
CREATE TABLE profile_versions (
    profile_id text NOT NULL REFERENCES profiles (id),
    version    integer NOT NULL CHECK (version >= 1),
    document   jsonb NOT NULL,
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (profile_id, version)
);

-- +goose StatementBegin
CREATE FUNCTION profile_versions_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'profile_versions is append-only: % refused', TG_OP;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER profile_versions_append_only BEFORE UPDATE OR DELETE ON profile_versions
    FOR EACH ROW EXECUTE FUNCTION profile_versions_append_only();
CREATE TRIGGER profile_versions_no_truncate BEFORE TRUNCATE ON profile_versions
    FOR EACH STATEMENT EXECUTE FUNCTION profile_versions_append_only();

-- +goose Down
DROP TABLE profile_versions;
DROP FUNCTION profile_versions_append_only();
DROP TABLE profiles;
