-- +goose Up
-- Events: the transactional outbox. Every domain fact (a reservation's state
-- change, first of all) is inserted here by store.PublishEvent in the
-- transaction that makes it true, so an event exists exactly when its fact
-- committed. seq is global and increasing: it is events.list's cursor. xid
-- is the writing transaction's: readers return only events whose
-- transaction is older than every one still running (pg_snapshot_xmin), so
-- a reader paging by seq never skips an event that committed after a
-- later-numbered one. type is <resource kind>.<what happened>
-- (reservation.placed); data is the fact's details.
--
-- published_at is the outbox's delivery marker: NULL until the webhook relay
-- (a later issue) has delivered the event, then when it did. Nothing sets it
-- yet; events_unpublished is the relay's work queue.
CREATE TABLE events (
    seq           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id            text NOT NULL UNIQUE,
    tenant_id     text NOT NULL CHECK (tenant_id <> ''),
    type          text NOT NULL CHECK (type <> ''),
    resource_type text NOT NULL CHECK (resource_type <> ''),
    resource_id   text NOT NULL CHECK (resource_id <> ''),
    project_id    text NOT NULL DEFAULT '',
    data          jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(data) = 'object'),
    created_at    timestamptz NOT NULL DEFAULT now(),
    xid           xid8 NOT NULL DEFAULT pg_current_xact_id(),
    published_at  timestamptz
);
CREATE INDEX events_tenant_seq ON events (tenant_id, seq);
CREATE INDEX events_unpublished ON events (seq) WHERE published_at IS NULL;

-- Usage: GPU-hour metering. One row per interval during which a reservation
-- was active and held units atoms of class in a pool of gpuModel:
-- store.OpenUsage starts it when the reservation becomes active,
-- store.CloseUsage ends it when the reservation leaves active. An open
-- interval (ended_at NULL) counts up to now. At most one interval of a
-- reservation is open. Rows carry their own tenant, project, pool and model
-- and have no foreign key: they are a metering record that outlives any
-- change to the reservation row.
CREATE TABLE usage_intervals (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reservation_id text NOT NULL CHECK (reservation_id <> ''),
    tenant_id      text NOT NULL CHECK (tenant_id <> ''),
    project_id     text NOT NULL DEFAULT '',
    pool_id        text NOT NULL CHECK (pool_id <> ''),
    gpu_model      text NOT NULL,
    class          text NOT NULL CHECK (class <> ''),
    units          integer NOT NULL CHECK (units > 0),
    started_at     timestamptz NOT NULL DEFAULT now(),
    ended_at       timestamptz,
    CHECK (ended_at >= started_at)
);
CREATE UNIQUE INDEX usage_intervals_open ON usage_intervals (reservation_id) WHERE ended_at IS NULL;
CREATE INDEX usage_intervals_tenant ON usage_intervals (tenant_id, started_at);

-- +goose Down
DROP TABLE usage_intervals;
DROP TABLE events;
