-- +goose Up
-- Sandboxes (docs/sandboxes.md): templates, sandboxes and their
-- snapshots. A sandbox's workload is an instances row (sandbox_id set, no
-- authorization row of its own: IAM decides on the sandbox), converged by
-- the instance machinery; the sandbox row holds the lifetime. expires_at
-- is the one deadline: only sandboxes.extend moves it.
CREATE TABLE sandbox_templates (
    id                  text PRIMARY KEY,
    tenant_id           text NOT NULL,
    owner_identity_id   text NOT NULL,
    name                text NOT NULL,
    pool_id             text NOT NULL REFERENCES pools (id),
    flavor_id           text NOT NULL REFERENCES flavors (id),
    image_id            text NOT NULL,
    runtime             text NOT NULL CHECK (runtime IN ('gvisor', 'runc', 'vm')),
    command             text[] NOT NULL DEFAULT '{}',
    default_ttl_seconds integer NOT NULL CHECK (default_ttl_seconds >= 1),
    max_ttl_seconds     integer NOT NULL CHECK (max_ttl_seconds >= default_ttl_seconds),
    ttl_action          text NOT NULL CHECK (ttl_action IN ('delete', 'snapshot')),
    warm_pool_size      integer NOT NULL DEFAULT 0 CHECK (warm_pool_size >= 0),
    version             bigint NOT NULL DEFAULT 1,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    deleted_at          timestamptz
);
CREATE UNIQUE INDEX sandbox_templates_name ON sandbox_templates (tenant_id, name) WHERE deleted_at IS NULL;
CREATE INDEX sandbox_templates_tenant_created ON sandbox_templates (tenant_id, created_at, id);

CREATE TABLE sandboxes (
    id                  text PRIMARY KEY,
    tenant_id           text NOT NULL,
    owner_identity_id   text NOT NULL,
    template_id         text NOT NULL REFERENCES sandbox_templates (id),
    -- draft and denied are the admission's; live has a workload; failed
    -- is a refused admission or a workload that ended by itself.
    state               text NOT NULL CHECK (state IN ('draft', 'denied', 'failed', 'live', 'deleting', 'deleted')),
    ttl_seconds         integer NOT NULL CHECK (ttl_seconds >= 1),
    expires_at          timestamptz,
    instance_id         text REFERENCES instances (id),
    from_snapshot_id    text,
    end_reason          text NOT NULL DEFAULT '',
    failure             jsonb,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    ended_at            timestamptz,
    workflow_started_at timestamptz,
    CHECK (state IN ('draft', 'denied', 'failed') OR (expires_at IS NOT NULL AND instance_id IS NOT NULL))
);
CREATE INDEX sandboxes_tenant_created ON sandboxes (tenant_id, created_at, id);
CREATE INDEX sandboxes_unstarted ON sandboxes (updated_at) WHERE workflow_started_at IS NULL AND state IN ('live', 'deleting');

ALTER TABLE instances
    ADD COLUMN sandbox_id text,
    -- a warm workload of a template's pool (at that template version),
    -- until a sandbox claims it
    ADD COLUMN warm_template_id text,
    ADD COLUMN warm_version bigint,
    -- '' runs the flavor's runtime; gvisor runs a container flavor under runsc
    ADD COLUMN runtime text NOT NULL DEFAULT '' CHECK (runtime IN ('', 'gvisor'));
CREATE UNIQUE INDEX instances_sandbox ON instances (sandbox_id) WHERE sandbox_id IS NOT NULL;
CREATE INDEX instances_warm ON instances (warm_template_id, created_at) WHERE warm_template_id IS NOT NULL AND sandbox_id IS NULL;

-- +goose Down
DROP INDEX instances_warm;
DROP INDEX instances_sandbox;
ALTER TABLE instances DROP COLUMN sandbox_id, DROP COLUMN warm_template_id, DROP COLUMN warm_version, DROP COLUMN runtime;
DROP TABLE sandboxes;
DROP TABLE sandbox_templates;
