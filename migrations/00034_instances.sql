-- +goose Up
-- Instances: a tenant's VPS machines. desired_state is what the owner
-- asked, state what the instance's workflow last recorded of the runtime
-- (core/instances). generation numbers the desired state and limits the
-- node's NodeSpec carries; observed_* is the node's latest report of it.
-- The row is its own outbox: workflow_started_at records the start of
-- its workflow (id = the instance id).
CREATE TABLE instances (
    id                  text PRIMARY KEY,
    tenant_id           text NOT NULL,
    owner_identity_id   text NOT NULL,
    project_id          text NOT NULL DEFAULT '',
    pool_id             text NOT NULL REFERENCES pools (id),
    flavor_id           text NOT NULL REFERENCES flavors (id),
    image_id            text NOT NULL,
    name                text NOT NULL,
    desired_state       text NOT NULL CHECK (desired_state IN ('running', 'stopped', 'deleted')),
    state               text NOT NULL CHECK (state IN ('draft', 'denied', 'pending', 'creating', 'running', 'stopping',
                            'stopped', 'starting', 'resizing', 'deleting', 'deleted', 'failed')),
    generation          bigint NOT NULL DEFAULT 1 CHECK (generation >= 1),
    node_id             text REFERENCES nodes (id),
    address             text NOT NULL DEFAULT '',
    -- user data: plain text, or a secret:// reference resolved only when
    -- the node's runtime (or the provider) takes it.
    user_data           text,
    user_data_ref       text CHECK (user_data_ref LIKE 'secret://%'),
    command             text[] NOT NULL DEFAULT '{}',
    failure             jsonb,
    -- what the node last reported (protocol.InstanceStatus)
    observed_state      text NOT NULL DEFAULT '',
    observed_generation bigint NOT NULL DEFAULT 0,
    observed_error      text NOT NULL DEFAULT '',
    applied_vcpu        integer NOT NULL DEFAULT 0,
    applied_memory_mib  bigint NOT NULL DEFAULT 0,
    observed_at         timestamptz,
    -- provider pools: the server the provider made, and when its create
    -- was sent (set before the call, so an unknown outcome is looked up)
    provider_server_id  text NOT NULL DEFAULT '',
    create_sent_at      timestamptz,
    -- since when the state has differed from the desired one
    converging_since    timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    deleted_at          timestamptz,
    workflow_started_at timestamptz,
    CHECK (user_data IS NULL OR user_data_ref IS NULL)
);
CREATE INDEX instances_tenant_created ON instances (tenant_id, created_at, id);
CREATE INDEX instances_node ON instances (node_id) WHERE state <> 'deleted';
CREATE INDEX instances_unstarted ON instances (updated_at) WHERE workflow_started_at IS NULL AND state NOT IN ('draft', 'denied', 'deleted');

-- Allocations owned by an instance: no reservation, the instance's scalar
-- amounts (counted against the node's capacity times the pool's
-- overcommit until released_at) and its GPU atoms (booked from the
-- placement on with no end, cut at release).
ALTER TABLE allocations ALTER COLUMN reservation_id DROP NOT NULL;
ALTER TABLE allocations DROP CONSTRAINT allocations_atoms_check;
ALTER TABLE allocations
    ADD COLUMN instance_id text REFERENCES instances (id),
    ADD COLUMN vcpu integer NOT NULL DEFAULT 0 CHECK (vcpu >= 0),
    ADD COLUMN memory_mib bigint NOT NULL DEFAULT 0 CHECK (memory_mib >= 0),
    ADD COLUMN released_at timestamptz,
    ADD CONSTRAINT allocations_one_owner CHECK ((reservation_id IS NULL) <> (instance_id IS NULL)),
    ADD CONSTRAINT allocations_atoms_check CHECK (instance_id IS NOT NULL OR cardinality(atoms) > 0);
CREATE UNIQUE INDEX allocations_instance ON allocations (instance_id) WHERE instance_id IS NOT NULL;
CREATE INDEX allocations_node_live_instances ON allocations (node_id) WHERE instance_id IS NOT NULL AND released_at IS NULL;

-- +goose Down
DELETE FROM device_bookings b USING allocations a WHERE b.allocation_id = a.id AND a.instance_id IS NOT NULL;
DELETE FROM allocations WHERE instance_id IS NOT NULL;
ALTER TABLE allocations DROP CONSTRAINT allocations_one_owner, DROP CONSTRAINT allocations_atoms_check;
DROP INDEX allocations_node_live_instances;
DROP INDEX allocations_instance;
ALTER TABLE allocations DROP COLUMN instance_id, DROP COLUMN vcpu, DROP COLUMN memory_mib, DROP COLUMN released_at;
ALTER TABLE allocations ADD CONSTRAINT allocations_atoms_check CHECK (cardinality(atoms) > 0);
ALTER TABLE allocations ALTER COLUMN reservation_id SET NOT NULL;
DROP TABLE instances;
