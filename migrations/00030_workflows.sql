-- +goose Up
-- Provisioning workflows: a profile version expanded for one node into
-- persisted steps, run one at a time by the node's lifecycle workflow
-- (<nodeId>/metal) under the operation op_seq (a deploy's, then a
-- retry's). Written by store/workflows and, when the operation ends, by
-- store/metal in the same transaction.
CREATE TABLE workflows (
    id                 text PRIMARY KEY,
    tenant_id          text NOT NULL,
    node_id            text NOT NULL REFERENCES nodes (id),
    profile_id         text NOT NULL,
    profile_version    integer NOT NULL CHECK (profile_version > 0),
    -- The operation it runs under; a retry moves it to the retry's.
    op_seq             bigint NOT NULL,
    state              text NOT NULL DEFAULT 'pending'
                       CHECK (state IN ('pending', 'running', 'paused', 'succeeded', 'failed', 'aborted')),
    -- The step it is at (the one running, paused before, or failed).
    step_index         integer NOT NULL DEFAULT 0 CHECK (step_index >= 0),
    pause_requested_at timestamptz,
    paused_at          timestamptz,
    -- core/provisioning.Context: the image, user data (inline, or only a
    -- secret reference), host configuration and acceptance checks.
    context            jsonb NOT NULL CHECK (jsonb_typeof(context) = 'object'),
    -- The ramdisk boot its ramdisk steps run in ('' until it boots one).
    boot_id            text NOT NULL DEFAULT '',
    error              text NOT NULL DEFAULT '',
    created_by         text NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    started_at         timestamptz,
    finished_at        timestamptz
);
CREATE INDEX workflows_node ON workflows (node_id, created_at DESC, id DESC);
-- One live workflow per machine.
CREATE UNIQUE INDEX workflows_node_live ON workflows (node_id) WHERE state IN ('pending', 'running', 'paused');
-- profiles.delete refuses a profile a live workflow runs.
CREATE INDEX workflows_profile_live ON workflows (tenant_id, profile_id) WHERE state IN ('pending', 'running', 'paused');

-- A workflow's rendered steps (core/provisioning.Step as step), how far
-- each got, and its attempts. The attempts are a bounded jsonb array on
-- the step ({attempt, error, reason, startedAt, finishedAt, durationMs}):
-- they are only ever read with their step, at most MaxAttempts per run of
-- it (the newest kept across retries), so a table of their own would only
-- add a join.
CREATE TABLE workflow_steps (
    workflow_id text NOT NULL REFERENCES workflows (id),
    idx         integer NOT NULL CHECK (idx >= 0),
    name        text NOT NULL,
    step        jsonb NOT NULL CHECK (jsonb_typeof(step) = 'object'),
    state       text NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'aborted')),
    attempts    integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    output      text NOT NULL DEFAULT '' CHECK (octet_length(output) <= 65536),
    error       text NOT NULL DEFAULT '',
    reason      text NOT NULL DEFAULT '',
    attempt_log jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(attempt_log) = 'array'),
    -- When the attempt in flight started (its duration's start).
    attempt_started_at timestamptz,
    started_at  timestamptz,
    finished_at timestamptz,
    PRIMARY KEY (workflow_id, idx),
    UNIQUE (workflow_id, name)
);

-- +goose Down
DROP TABLE workflow_steps;
DROP TABLE workflows;
