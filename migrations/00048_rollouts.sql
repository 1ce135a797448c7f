-- +goose Up
-- Releases and rollouts (docs/rollouts.md). A release names fleet images
-- (the artifacts) under name@version; a rollout moves a resolved list of
-- nodes (rollout_nodes, fixed at create) onto a release, wave by wave. The
-- rows are the rollout's state and its outbox: the workflow (id = the
-- rollout id) acts only by what they say, and the reconciler restarts the
-- workflow of a rollout that is owed one.
ALTER TABLE images DROP CONSTRAINT images_format_check;
ALTER TABLE images ADD CONSTRAINT images_format_check CHECK (format IN ('raw', 'qcow2', 'iso', 'binary'));
ALTER TABLE node_commands DROP CONSTRAINT node_commands_kind_check;
ALTER TABLE node_commands ADD CONSTRAINT node_commands_kind_check
    CHECK (kind IN ('exec', 'cdi.expose', 'cdi.withdraw', 'inventory.refresh', 'reboot', 'agent.update'));

CREATE TABLE releases (
    id            text PRIMARY KEY,
    tenant_id     text NOT NULL,
    name          text NOT NULL CHECK (name ~ '^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$'),
    version       text NOT NULL CHECK (version ~ '^[A-Za-z0-9]([A-Za-z0-9._+-]{0,62}[A-Za-z0-9])?$'),
    kind          text NOT NULL CHECK (kind IN ('bcd')),
    -- [{name, imageId}], each a fleet image available and verified at
    -- register.
    artifacts     jsonb NOT NULL,
    agent_version text NOT NULL DEFAULT '',
    created_by    text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (name, version)
);
CREATE INDEX releases_created ON releases (created_at, id);

CREATE TABLE rollouts (
    id                 text PRIMARY KEY,
    tenant_id          text NOT NULL,
    release_id         text NOT NULL REFERENCES releases (id),
    pool_id            text NOT NULL,
    labels             jsonb NOT NULL DEFAULT '{}',
    state              text NOT NULL CHECK (state IN ('running', 'paused', 'pausedOnFailure', 'aborting', 'aborted', 'succeeded')),
    wave               integer NOT NULL DEFAULT 0,
    waves              integer NOT NULL CHECK (waves >= 1),
    failure_threshold  double precision NOT NULL DEFAULT 0 CHECK (failure_threshold >= 0 AND failure_threshold <= 1),
    acceptance_command jsonb,
    node_timeout_s     integer NOT NULL CHECK (node_timeout_s > 0),
    rollback           boolean NOT NULL DEFAULT false,
    -- The current wave's failed nodes a resume went past: they no longer
    -- count against failure_threshold.
    resumed_failed     integer NOT NULL DEFAULT 0,
    reason             text NOT NULL DEFAULT '',
    created_by         text NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    finished_at        timestamptz
);
CREATE INDEX rollouts_created ON rollouts (created_at, id);
CREATE INDEX rollouts_owed ON rollouts (id) WHERE state IN ('running', 'aborting');

CREATE TABLE rollout_nodes (
    rollout_id    text NOT NULL REFERENCES rollouts (id) ON DELETE CASCADE,
    node_id       text NOT NULL,
    wave          integer NOT NULL,
    state         text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'draining', 'updating', 'checking',
                      'succeeded', 'failed', 'skipped', 'rolledBack')),
    -- The seq of the node command this row enqueued (agent.update, then
    -- the acceptance exec); the command's idempotency key is
    -- <rolloutId>/<step>, so a retried step finds it instead of enqueuing again.
    command_seq   bigint,
    error         text NOT NULL DEFAULT '',
    was_cordoned  boolean NOT NULL DEFAULT false,
    step_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (rollout_id, node_id)
);
CREATE INDEX rollout_nodes_wave ON rollout_nodes (rollout_id, wave, state);

-- +goose Down
DROP TABLE rollout_nodes;
DROP TABLE rollouts;
DROP TABLE releases;
DELETE FROM node_commands WHERE kind = 'agent.update';
ALTER TABLE node_commands DROP CONSTRAINT node_commands_kind_check;
ALTER TABLE node_commands ADD CONSTRAINT node_commands_kind_check
    CHECK (kind IN ('exec', 'cdi.expose', 'cdi.withdraw', 'inventory.refresh', 'reboot'));
ALTER TABLE images DROP CONSTRAINT images_format_check;
ALTER TABLE images ADD CONSTRAINT images_format_check CHECK (format IN ('raw', 'qcow2', 'iso'));
