-- +goose Up
-- Cloud resources (cloud-resources-api.md): a provider's managed services,
-- one row each, in one provider pool and so one provider account. spec is
-- what the tenant wants (version numbers its changes; applied_version is
-- the one the provider last applied); state is where the resource's
-- workflow (id = the resource id) last found it. desired is 'present',
-- 'deleted' or 'released': delete and release set it, the workflow
-- converges on it. The row is its own outbox (workflow_started_at).
--
-- Nothing secret is stored here: secret_outputs maps an output's name to
-- the secret:// reference it was sealed under, and secrets_sent_hash is a
-- keyed hash of the resolved SecretRefs last sent, so a rotation is seen
-- without keeping a value.
CREATE TABLE cloud_resources (
    id                  text PRIMARY KEY,
    tenant_id           text NOT NULL,
    owner_identity_id   text NOT NULL,
    project_id          text NOT NULL DEFAULT '',
    pool_id             text NOT NULL REFERENCES pools (id),
    provider_account_id text NOT NULL REFERENCES provider_accounts (id),
    provider            text NOT NULL,
    kind                text NOT NULL,
    family              text NOT NULL,
    name                text NOT NULL,
    description         text NOT NULL DEFAULT '',
    parent_id           text REFERENCES cloud_resources (id),
    -- the identity value within the parent (a user's name; '' for a
    -- kind with one per parent); NULL for a kind without an identity
    identity            text,
    region              text NOT NULL DEFAULT '',
    spec                jsonb NOT NULL DEFAULT '{}',
    version             bigint NOT NULL DEFAULT 1 CHECK (version >= 1),
    applied_version     bigint NOT NULL DEFAULT 0,
    desired             text NOT NULL DEFAULT 'present' CHECK (desired IN ('present', 'deleted', 'released')),
    state               text NOT NULL CHECK (state IN ('draft', 'denied', 'pending', 'provisioning', 'ready', 'updating',
                            'deleting', 'deleted', 'released', 'error')),
    message             text NOT NULL DEFAULT '',
    reason              text NOT NULL DEFAULT '',
    provider_id         text NOT NULL DEFAULT '',
    provider_status     text NOT NULL DEFAULT '',
    outputs             jsonb NOT NULL DEFAULT '{}',
    secret_outputs      jsonb NOT NULL DEFAULT '{}',
    secrets_sent_hash   text NOT NULL DEFAULT '',
    -- adopt: adopted rows start with an empty spec; taken_over_at is when
    -- the reconciler wrote the ownership labels and recorded the spec the
    -- provider reports; observe_only until the tenant first changes it.
    adopted             boolean NOT NULL DEFAULT false,
    taken_over_at       timestamptz,
    observe_only        boolean NOT NULL DEFAULT false,
    -- the capacity quota the spec books on the pool (a kind that books)
    booked_quota        text NOT NULL DEFAULT '',
    booked_amount       integer NOT NULL DEFAULT 0 CHECK (booked_amount >= 0),
    -- the drift-loop breaker: the field the last in-place update fixed
    -- and how many updates in a row fixed it again
    drift_field         text NOT NULL DEFAULT '',
    drift_count         integer NOT NULL DEFAULT 0,
    -- the type of its authorization row (the catalog's prefixed name),
    -- removed when it ends
    authz_type          text NOT NULL,
    create_sent_at      timestamptz,
    accepted_at         timestamptz,
    ready_at            timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    ended_at            timestamptz,
    workflow_started_at timestamptz,
    CHECK ((state IN ('deleted', 'released', 'denied')) = (ended_at IS NOT NULL))
);
CREATE INDEX cloud_resources_tenant_created ON cloud_resources (tenant_id, created_at, id);
CREATE INDEX cloud_resources_parent ON cloud_resources (parent_id) WHERE parent_id IS NOT NULL;
-- name is unique per kind among a tenant's resources that are not ended
CREATE UNIQUE INDEX cloud_resources_live_name ON cloud_resources (tenant_id, kind, name)
    WHERE state NOT IN ('draft', 'denied', 'deleted', 'released');
-- one live resource per parent and identity
CREATE UNIQUE INDEX cloud_resources_live_identity ON cloud_resources (parent_id, kind, identity)
    WHERE identity IS NOT NULL AND state NOT IN ('draft', 'denied', 'deleted', 'released');
-- a provider resource is recorded once (adopt's CONFLICT)
CREATE UNIQUE INDEX cloud_resources_live_provider_id ON cloud_resources (provider_account_id, kind, provider_id)
    WHERE provider_id <> '' AND state NOT IN ('draft', 'denied', 'deleted', 'released');
CREATE INDEX cloud_resources_unstarted ON cloud_resources (updated_at)
    WHERE workflow_started_at IS NULL AND state NOT IN ('draft', 'denied', 'deleted', 'released');

-- Tenant budgets (docs/budgets.md): a cap on a meter's units per calendar
-- month (UTC). What is checked is the month's use so far: a tenant at or
-- over its cap gets nothing new that bills the meter.
CREATE TABLE tenant_budgets (
    tenant_id   text NOT NULL,
    meter       text NOT NULL CHECK (meter <> ''),
    monthly_cap numeric NOT NULL CHECK (monthly_cap >= 0),
    updated_by  text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, meter)
);

-- +goose Down
DROP TABLE tenant_budgets;
DROP TABLE cloud_resources;
