-- +goose Up
-- The authorization projection's source: one row per application-owned
-- resource IAM can decide on. Domain code writes its row in the same
-- transaction as the domain row (store.PutAuthzResource and
-- store.DeleteAuthzResource). Types are stored as IAM sees them, with the
-- catalog's prefix (compute-pool); the scope types compute-fleet and
-- compute-tenant have no rows, compute-project has one per project.
CREATE TABLE authz_resources (
    type        text NOT NULL,
    id          text NOT NULL,
    tenant_id   text NOT NULL,               -- the owner tenant
    owner_id    text,                        -- the owning identity
    parent_type text,
    parent_id   text,
    attributes  jsonb NOT NULL DEFAULT '{}', -- the declared attributes
    shared_with text[] NOT NULL DEFAULT '{}', -- other tenants in whose view it resolves
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (type, id),
    CONSTRAINT authz_resources_parent CHECK ((parent_type IS NULL) = (parent_id IS NULL)),
    CONSTRAINT authz_resources_attributes CHECK (jsonb_typeof(attributes) = 'object')
);
-- The list pre-filter: "rows the projection holds in the tenant's view".
CREATE INDEX authz_resources_tenant ON authz_resources (tenant_id, type);
CREATE INDEX authz_resources_shared ON authz_resources USING gin (shared_with);

-- The change feed every process tails. seq orders changes for humans and
-- stats only: seq values commit out of order, so tailers select by the
-- writer's transaction id (xid) against the snapshot of their previous
-- read, which misses no commit however late it lands (see iam/projection.go).
CREATE TABLE authz_changes (
    seq        bigserial PRIMARY KEY,
    type       text NOT NULL,
    id         text NOT NULL,
    xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
    changed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX authz_changes_xid ON authz_changes (xid);
CREATE INDEX authz_changes_changed_at ON authz_changes (changed_at);

-- +goose StatementBegin
CREATE FUNCTION authz_resources_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO authz_changes (type, id) VALUES (OLD.type, OLD.id);
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND (NEW.type, NEW.id) IS DISTINCT FROM (OLD.type, OLD.id)) THEN
        INSERT INTO authz_changes (type, id) VALUES (NEW.type, NEW.id);
    END IF;
    -- Delivered at commit; equal notifications of one transaction fold into one.
    PERFORM pg_notify('authz_changes', '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER authz_resources_changed
    AFTER INSERT OR UPDATE OR DELETE ON authz_resources
    FOR EACH ROW EXECUTE FUNCTION authz_resources_changed();

-- +goose Down
DROP TRIGGER authz_resources_changed ON authz_resources;
DROP FUNCTION authz_resources_changed();
DROP TABLE authz_changes;
DROP TABLE authz_resources;
