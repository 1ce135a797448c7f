-- +goose Up
-- Fleet as code (docs/fleet-as-code.md): a plan is a fleet document's
-- changes against the live state whose digest it names; an apply runs a
-- plan's changes in order, one row each, so a resumed workflow starts at
-- the first one not done.
CREATE TABLE fleet_plans (
    id         text PRIMARY KEY,
    tenant_id  text NOT NULL,
    digest     text NOT NULL,
    document   jsonb NOT NULL,
    changes    jsonb NOT NULL,
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE fleet_applies (
    id          text PRIMARY KEY,
    tenant_id   text NOT NULL,
    plan_id     text NOT NULL REFERENCES fleet_plans (id),
    state       text NOT NULL CHECK (state IN ('running', 'succeeded', 'failed')),
    error       text NOT NULL DEFAULT '',
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX fleet_applies_tenant ON fleet_applies (tenant_id, created_at DESC);

CREATE TABLE fleet_apply_changes (
    apply_id text NOT NULL REFERENCES fleet_applies (id),
    seq      int NOT NULL,
    change   jsonb NOT NULL,
    state    text NOT NULL CHECK (state IN ('pending', 'done', 'failed')),
    error    text NOT NULL DEFAULT '',
    done_at  timestamptz,
    PRIMARY KEY (apply_id, seq)
);

-- +goose Down
DROP TABLE fleet_apply_changes;
DROP TABLE fleet_applies;
DROP TABLE fleet_plans;
