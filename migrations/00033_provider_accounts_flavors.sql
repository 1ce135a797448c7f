-- +goose Up
-- Provider accounts: one capacity provider's credential (a secret://
-- reference, never the token), owned by the root tenant (a fleet account
-- backing provider pools) or by a tenant (its own account). A provider pool
-- names one (pools.provider_account_id).
CREATE TABLE provider_accounts (
    id             text PRIMARY KEY,
    tenant_id      text NOT NULL,
    provider       text NOT NULL CHECK (provider IN ('digitalocean')),
    name           text NOT NULL,
    credential_ref text NOT NULL CHECK (credential_ref LIKE 'secret://%'),
    -- base_url overrides the provider's API address (the dev stack's and
    -- the tests' fake provider); empty is the provider's own.
    base_url       text NOT NULL DEFAULT '',
    regions        text[] NOT NULL DEFAULT '{}',
    previews       boolean NOT NULL DEFAULT false,
    created_by     text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    deleted_at     timestamptz
);
CREATE UNIQUE INDEX provider_accounts_tenant_name ON provider_accounts (tenant_id, name) WHERE deleted_at IS NULL;
CREATE INDEX provider_accounts_tenant_created ON provider_accounts (tenant_id, created_at, id);

-- Flavors: a pool's instance shapes. On vps-host pools vCPU, memory, GPUs,
-- disk and the runtime; on provider pools a provider size (with the
-- size's shape copied for admission attributes). A deleted flavor keeps
-- its row for the instances that name it.
CREATE TABLE flavors (
    id            text PRIMARY KEY,
    tenant_id     text NOT NULL, -- the pool's owner
    pool_id       text NOT NULL REFERENCES pools (id),
    name          text NOT NULL,
    vcpu          integer NOT NULL CHECK (vcpu >= 1),
    memory_mib    bigint NOT NULL CHECK (memory_mib >= 64),
    disk_gib      integer NOT NULL DEFAULT 0 CHECK (disk_gib >= 0),
    gpus          integer NOT NULL DEFAULT 0 CHECK (gpus >= 0),
    gpu_class     text NOT NULL DEFAULT '',
    runtime       text NOT NULL DEFAULT '' CHECK (runtime IN ('', 'container', 'vm')),
    provider_size text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    deleted_at    timestamptz,
    CHECK ((runtime = '') <> (provider_size = ''))
);
CREATE UNIQUE INDEX flavors_pool_name ON flavors (pool_id, name) WHERE deleted_at IS NULL;
CREATE INDEX flavors_pool_created ON flavors (pool_id, created_at, id);

-- +goose Down
DROP TABLE flavors;
DROP TABLE provider_accounts;
