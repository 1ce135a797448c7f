-- +goose Up
-- Leases: ownership of a shard, pool or site by one worker or agent, with a
-- fencing epoch (spec/domain-model.md "Leases"): shard:<n>, pool:<id>,
-- site:<id>:boot, singleton:<job>, gateway:<id>. A lease is live while
-- expires_at is after the database's now(); a new holder (or the same one
-- after expiry) takes it with epoch + 1, so every write fenced by an epoch
-- refuses a holder that lost it. Releasing deletes nothing: it expires the
-- row, so the epoch only grows.
CREATE TABLE leases (
    name        text PRIMARY KEY,
    holder      text NOT NULL CHECK (holder <> ''),
    epoch       bigint NOT NULL CHECK (epoch >= 1),
    expires_at  timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    renewed_at  timestamptz NOT NULL DEFAULT now()
);

-- Site agents: every `bcd site` instance (holder) that registered for a
-- site with a site token. A site agent is not a `nodes` row: nodes.pool_id
-- is NOT NULL and a node's tenant is its pool's owner, while a site agent
-- serves the whole site (any or no pool), so it is recorded here, keyed by
-- the site and the holder.
CREATE TABLE site_agents (
    site_id         text NOT NULL REFERENCES sites (id),
    holder          text NOT NULL CHECK (holder <> ''),
    tenant_id       text NOT NULL,
    site_token_id   text NOT NULL REFERENCES site_tokens (id),
    first_seen_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at    timestamptz NOT NULL DEFAULT now(),
    -- The latest epoch of the site's boot lease this holder took.
    lease_epoch     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (site_id, holder)
);

-- +goose Down
DROP TABLE site_agents;
DROP TABLE leases;
