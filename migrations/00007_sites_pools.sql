-- +goose Up
-- Sites: boot and failure domains. kind shared and dedicated are the
-- platform's own (root tenant); custom is a tenant's own hardware.
CREATE TABLE sites (
    id          text PRIMARY KEY,
    tenant_id   text NOT NULL,
    name        text NOT NULL,
    region      text NOT NULL,
    iam_region  text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('shared', 'dedicated', 'custom')),
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz
);
-- A live site's name is unique in its tenant; deleted ones free it.
CREATE UNIQUE INDEX sites_tenant_name ON sites (tenant_id, name) WHERE deleted_at IS NULL;
CREATE INDEX sites_tenant_created ON sites (tenant_id, created_at, id);

-- Site tokens: what a `bcd site` agent authenticates with. Only the SHA-256
-- of the token is stored; the token itself is shown once, at creation.
CREATE TABLE site_tokens (
    id          text PRIMARY KEY,
    site_id     text NOT NULL REFERENCES sites (id),
    tenant_id   text NOT NULL,
    name        text NOT NULL DEFAULT '',
    token_hash  bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX site_tokens_site ON site_tokens (site_id, created_at, id);

-- Pools: scheduling and policy domains in one site, owned by one tenant.
CREATE TABLE pools (
    id                  text PRIMARY KEY,
    tenant_id           text NOT NULL,
    site_id             text NOT NULL REFERENCES sites (id),
    name                text NOT NULL,
    class               text NOT NULL CHECK (class IN ('metal-host', 'metal-dedicated', 'vps-host', 'provider')),
    gpu_model           text NOT NULL,
    gpu_memory_gb       integer NOT NULL CHECK (gpu_memory_gb > 0),
    sharing             text NOT NULL DEFAULT 'exclusive' CHECK (sharing IN ('exclusive', 'mig', 'timeslice', 'mps')),
    agent               text NOT NULL CHECK (agent IN ('bcd', 'none')),
    policy              jsonb NOT NULL DEFAULT '{}',
    provider_account_id text,
    created_by          text NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    archived_at         timestamptz,
    -- providerAccountId is required for provider pools, and only for them.
    CHECK ((class = 'provider') = (provider_account_id IS NOT NULL))
);
CREATE UNIQUE INDEX pools_tenant_name ON pools (tenant_id, name) WHERE archived_at IS NULL;
CREATE INDEX pools_tenant_created ON pools (tenant_id, created_at, id);
CREATE INDEX pools_site ON pools (site_id) WHERE archived_at IS NULL;

-- Offers: a pool in another tenant's view, with that tenant's quota (the
-- one source of quotas.get and quotas.set). A resource missing from quota
-- grants zero.
CREATE TABLE pool_offers (
    pool_id             text NOT NULL REFERENCES pools (id),
    tenant_id           text NOT NULL, -- the receiving tenant
    quota               jsonb NOT NULL DEFAULT '{}',
    priority            integer,
    include_descendants boolean NOT NULL DEFAULT false,
    created_by          text NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool_id, tenant_id),
    CHECK (jsonb_typeof(quota) = 'object')
);
CREATE INDEX pool_offers_tenant ON pool_offers (tenant_id, pool_id);

-- +goose Down
DROP TABLE pool_offers;
DROP TABLE pools;
DROP TABLE site_tokens;
DROP TABLE sites;
