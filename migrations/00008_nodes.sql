-- +goose Up
-- Nodes: machines serving one pool (tenant_id is the pool's owner). Each
-- state axis is its own column, so each question has one answer.
CREATE TABLE nodes (
    id                   text PRIMARY KEY,
    tenant_id            text NOT NULL,
    pool_id              text NOT NULL REFERENCES pools (id),
    name                 text NOT NULL,
    provision_state      text NOT NULL DEFAULT 'adopting' CHECK (provision_state IN ('adopting', 'adopted', 'enrolling',
                             'inspecting', 'commissioning', 'ready', 'deploying', 'deployed', 'releasing', 'rescue',
                             'failed', 'retiring', 'retired')),
    maintenance          boolean NOT NULL DEFAULT false,
    cordoned             boolean NOT NULL DEFAULT false,
    power                text NOT NULL DEFAULT 'unknown' CHECK (power IN ('on', 'off', 'unknown')),
    connectivity         text NOT NULL DEFAULT 'disconnected' CHECK (connectivity IN ('connected', 'disconnected', 'unreachable', 'lost')),
    -- [{type, status, reason, message, since}], since in epoch milliseconds.
    conditions           jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(conditions) = 'array'),
    role                 text NOT NULL DEFAULT 'unassigned' CHECK (role IN ('unassigned', 'host', 'dedicated', 'site')),
    trust                text NOT NULL DEFAULT 'platform' CHECK (trust IN ('platform', 'tenant-owned', 'tenant-controlled')),
    adapter              text NOT NULL DEFAULT 'bcd/v1' CHECK (adapter IN ('bcd/v1', 'provider-api/v1')),
    -- Per-concern driver bindings: {"power": "ipmi/v1", ...}.
    driver_bindings      jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(driver_bindings) = 'object'),
    -- The tenant that owns the machine (tenant-owned and tenant-controlled
    -- trust); '' for the platform's own.
    owner_tenant_id      text NOT NULL DEFAULT '',
    dedicated_to         text NOT NULL DEFAULT '',
    generation           bigint NOT NULL DEFAULT 1 CHECK (generation >= 0),
    observed_generation  bigint NOT NULL DEFAULT 0 CHECK (observed_generation >= 0),
    labels               jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),
    -- [{key, value, effect}]
    taints               jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(taints) = 'array'),
    no_schedule_reasons  text[] NOT NULL DEFAULT '{}',
    hardware_key         text NOT NULL DEFAULT '',
    hardware_key_trusted boolean NOT NULL DEFAULT false,
    -- From the latest inventory: the GPU model family (one, 'mixed' or
    -- '') and count, for the node's authorization row and lists.
    gpu_model            text NOT NULL DEFAULT '',
    gpu_count            integer NOT NULL DEFAULT 0,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    deleted_at           timestamptz
);
CREATE UNIQUE INDEX nodes_tenant_name ON nodes (tenant_id, name) WHERE deleted_at IS NULL;
CREATE INDEX nodes_tenant_created ON nodes (tenant_id, created_at, id);
CREATE INDEX nodes_pool ON nodes (pool_id) WHERE deleted_at IS NULL;
CREATE INDEX nodes_hardware_key ON nodes (hardware_key) WHERE hardware_key <> '' AND deleted_at IS NULL;

-- Inventory snapshots: append-only. A snapshot is written only when the
-- document's digest (over the section hashes) changed.
CREATE TABLE node_inventories (
    node_id     text NOT NULL REFERENCES nodes (id),
    seq         bigint NOT NULL CHECK (seq >= 1),
    document    jsonb NOT NULL,
    hashes      jsonb NOT NULL, -- section name → "sha256:<hex>"
    digest      text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node_id, seq)
);

-- +goose StatementBegin
CREATE FUNCTION node_inventories_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'node_inventories is append-only: % refused', TG_OP;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER node_inventories_append_only BEFORE UPDATE OR DELETE ON node_inventories
    FOR EACH ROW EXECUTE FUNCTION node_inventories_append_only();
CREATE TRIGGER node_inventories_no_truncate BEFORE TRUNCATE ON node_inventories
    FOR EACH STATEMENT EXECUTE FUNCTION node_inventories_append_only();

-- Devices: what a node's inventory yields under its pool's partition
-- policy. device_id is the stable id from core/inventory (GPU UUID,
-- <gpuUuid>/gi<g>/ci<c>, <gpuUuid>/s<k>, VF MAC, disk WWN, node/<uuid>),
-- unique per node: the key is (node_id, device_id), so hardware that moves
-- to another node (or a re-joined machine under a new node id) never
-- collides with the rows its old node keeps. Vanished devices keep their
-- row with removed_at set.
CREATE TABLE devices (
    node_id    text NOT NULL REFERENCES nodes (id),
    device_id  text NOT NULL,
    tenant_id  text NOT NULL,
    pool_id    text NOT NULL REFERENCES pools (id),
    class      text NOT NULL CHECK (class IN ('gpu', 'gpu.mig', 'gpu.slot', 'nic.vf', 'disk', 'node')),
    parent     text NOT NULL DEFAULT '',
    bookable   boolean NOT NULL,
    attributes jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(attributes) = 'object'),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    removed_at timestamptz,
    PRIMARY KEY (node_id, device_id)
);
CREATE INDEX devices_pool_atoms ON devices (pool_id, class) WHERE bookable AND removed_at IS NULL;

-- Node events: what changed on a node, for nodes.events (newest first).
CREATE TABLE node_events (
    id      text PRIMARY KEY,
    node_id text NOT NULL REFERENCES nodes (id),
    at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    type    text NOT NULL,
    message text NOT NULL DEFAULT '',
    details jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX node_events_node_at ON node_events (node_id, at DESC, id DESC);

-- +goose Down
DROP TABLE node_events;
DROP TABLE devices;
DROP TABLE node_inventories;
DROP FUNCTION node_inventories_append_only();
DROP TABLE nodes;
