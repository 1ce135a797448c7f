-- +goose Up
-- Approver keys (docs/command-batches.md): SSH public keys the platform's IAM
-- admin registers for people who may approve command batches. A key belongs
-- to one live identity at a time (one person cannot count twice with one key).
CREATE TABLE iam_approver_keys (
    id             text PRIMARY KEY,
    tenant_id      text NOT NULL,
    identity_id    text NOT NULL,
    fingerprint    text NOT NULL,
    authorized_key text NOT NULL,
    comment        text NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now(),
    removed_at     timestamptz,
    FOREIGN KEY (tenant_id, identity_id) REFERENCES iam_identities (tenant_id, id)
);
CREATE UNIQUE INDEX iam_approver_keys_fingerprint ON iam_approver_keys (fingerprint) WHERE removed_at IS NULL;
CREATE INDEX iam_approver_keys_identity ON iam_approver_keys (tenant_id, identity_id) WHERE removed_at IS NULL;

-- A batch of commands over an exact node list, frozen at create with its
-- digest: approvers sign the digest, and the batch runs only while the
-- selection still resolves to the same list. creator is the create call's
-- admission context (each command's audit row names it).
CREATE TABLE command_batches (
    id                text PRIMARY KEY,
    tenant_id         text NOT NULL,
    state             text NOT NULL CHECK (state IN ('awaitingApproval', 'running', 'succeeded', 'failed', 'cancelled')),
    state_reason      text NOT NULL DEFAULT '',
    description       text NOT NULL DEFAULT '',
    commands          jsonb NOT NULL,
    selection         jsonb NOT NULL,
    nodes             text[] NOT NULL,
    digest            text NOT NULL,
    quorum            integer NOT NULL,
    concurrency       integer NOT NULL,
    max_failures      integer NOT NULL,
    node_timeout_s    integer NOT NULL,
    approval_ttl_s    integer NOT NULL,
    wave              integer NOT NULL DEFAULT 0,
    created_by        text NOT NULL,
    creator           jsonb NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    ended_at          timestamptz
);
CREATE INDEX command_batches_tenant ON command_batches (tenant_id, created_at, id);
CREATE INDEX command_batches_running ON command_batches (id) WHERE state = 'running';

CREATE TABLE command_batch_approvals (
    batch_id        text NOT NULL REFERENCES command_batches (id),
    approver        text NOT NULL,
    digest          text NOT NULL,
    key_fingerprint text NOT NULL,
    signature       text NOT NULL,
    approved_at     timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (batch_id, approver)
);

-- One node of a batch: its wave, the command it is at and each command's
-- result, in order.
CREATE TABLE command_batch_nodes (
    batch_id    text NOT NULL REFERENCES command_batches (id),
    node_id     text NOT NULL,
    wave        integer NOT NULL,
    state       text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'skipped', 'cancelled')),
    step        integer NOT NULL DEFAULT 0,
    command_seq bigint,
    results     jsonb NOT NULL DEFAULT '[]',
    error       text NOT NULL DEFAULT '',
    step_at     timestamptz,
    PRIMARY KEY (batch_id, node_id)
);
CREATE INDEX command_batch_nodes_wave ON command_batch_nodes (batch_id, wave, node_id);

-- +goose Down
DROP TABLE command_batch_nodes;
DROP TABLE command_batch_approvals;
DROP TABLE command_batches;
DROP TABLE iam_approver_keys;
