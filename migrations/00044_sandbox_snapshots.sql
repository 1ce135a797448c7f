-- +goose Up
-- Sandbox snapshots (docs/sandboxes.md, "Snapshots"): a sandbox's disk
-- and, with include_memory, its processes (a gVisor checkpoint), taken by
-- the node that runs its workload and kept in the blob store under the
-- tenant (sha256). Owned by the sandbox's owner, whoever took it; it
-- outlives the sandbox. A restore is a workload made from one
-- (instances.restore_snapshot_id).
CREATE TABLE sandbox_snapshots (
    id                text PRIMARY KEY,
    tenant_id         text NOT NULL,
    owner_identity_id text NOT NULL,
    sandbox_id        text NOT NULL REFERENCES sandboxes (id),
    template_id       text NOT NULL REFERENCES sandbox_templates (id),
    instance_id       text NOT NULL REFERENCES instances (id),
    node_id           text NOT NULL,
    -- what a restore needs again: the template's runtime and image when
    -- it was taken
    runtime           text NOT NULL CHECK (runtime IN ('gvisor', 'runc')),
    image_id          text NOT NULL,
    include_memory    boolean NOT NULL,
    -- requested: sandboxes.snapshot; ttl: the template's ttlAction
    reason            text NOT NULL CHECK (reason IN ('requested', 'ttl')),
    state             text NOT NULL CHECK (state IN ('creating', 'ready', 'failed', 'deleted')),
    sha256            text,
    size_bytes        bigint,
    failure           text NOT NULL DEFAULT '',
    -- the blob is gone (a deleted snapshot's bytes are removed after the commit)
    blob_removed      boolean NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    ready_at          timestamptz,
    deleted_at        timestamptz,
    CHECK (state <> 'ready' OR (sha256 IS NOT NULL AND size_bytes IS NOT NULL))
);
CREATE INDEX sandbox_snapshots_tenant_created ON sandbox_snapshots (tenant_id, created_at, id);
CREATE INDEX sandbox_snapshots_creating ON sandbox_snapshots (instance_id) WHERE state = 'creating';
CREATE INDEX sandbox_snapshots_sandbox ON sandbox_snapshots (sandbox_id);
CREATE INDEX sandbox_snapshots_unremoved ON sandbox_snapshots (id) WHERE state IN ('deleted', 'failed') AND NOT blob_removed AND sha256 IS NOT NULL;

ALTER TABLE instances ADD COLUMN restore_snapshot_id text REFERENCES sandbox_snapshots (id);

-- +goose Down
ALTER TABLE instances DROP COLUMN restore_snapshot_id;
DROP TABLE sandbox_snapshots;
