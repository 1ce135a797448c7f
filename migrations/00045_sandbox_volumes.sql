-- +goose Up
-- Sandbox volumes (docs/sandboxes.md, "Volumes"): a tenant's persistent
-- disk on one host of a vps-host pool, chosen when it is created, that
-- its templates' sandboxes (and warm workloads) mount. The node's agent
-- keeps each as a sized ext4 image under its state directory; the
-- NodeSpec lists the node's volumes. spec_generation is the node's
-- generation that carries the volume's last change (its size, or its
-- removal): creating, resizing and deleting read as done once the node
-- observed it.
CREATE TABLE sandbox_volumes (
    id                text PRIMARY KEY,
    tenant_id         text NOT NULL,
    owner_identity_id text NOT NULL,
    pool_id           text NOT NULL REFERENCES pools (id),
    node_id           text REFERENCES nodes (id),
    size_gib          integer NOT NULL CHECK (size_gib BETWEEN 1 AND 1024),
    -- draft, denied and failed are the admission's
    state             text NOT NULL CHECK (state IN ('draft', 'denied', 'failed', 'creating', 'resizing', 'ready', 'deleting')),
    spec_generation   bigint NOT NULL DEFAULT 0,
    failure           jsonb,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    deleted_at        timestamptz,
    CHECK (state IN ('draft', 'denied', 'failed') OR node_id IS NOT NULL)
);
CREATE INDEX sandbox_volumes_tenant_created ON sandbox_volumes (tenant_id, created_at, id);
CREATE INDEX sandbox_volumes_node ON sandbox_volumes (node_id) WHERE state IN ('creating', 'resizing', 'ready');

-- The volumes a template mounts, in its order; a template update replaces them.
CREATE TABLE sandbox_template_volumes (
    template_id text NOT NULL REFERENCES sandbox_templates (id),
    volume_id   text NOT NULL REFERENCES sandbox_volumes (id),
    ord         integer NOT NULL,
    mount_path  text NOT NULL,
    read_only   boolean NOT NULL DEFAULT false,
    PRIMARY KEY (template_id, volume_id)
);
CREATE INDEX sandbox_template_volumes_volume ON sandbox_template_volumes (volume_id);

-- A workload's mounts ([{volumeId, path, readOnly}]), copied from its
-- template when it is placed: what the NodeSpec hands the runtime.
ALTER TABLE instances ADD COLUMN mounts jsonb NOT NULL DEFAULT '[]';

-- +goose Down
ALTER TABLE instances DROP COLUMN mounts;
DROP TABLE sandbox_template_volumes;
DROP TABLE sandbox_volumes;
