-- +goose Up
-- Node commands: durable, idempotent one-shot messages to one node's agent
-- (docs/agent-protocol.md, "Commands"). Each node numbers its commands with
-- one increasing seq (nodes.command_seq, taken in the insert's transaction),
-- which the agent records before running a command, so a command delivered
-- again is never run twice. A row is never deleted.
ALTER TABLE nodes ADD COLUMN command_seq bigint NOT NULL DEFAULT 0 CHECK (command_seq >= 0);

CREATE TABLE node_commands (
    node_id             text NOT NULL REFERENCES nodes (id),
    seq                 bigint NOT NULL CHECK (seq >= 1),
    id                  text NOT NULL UNIQUE,
    tenant_id           text NOT NULL,
    kind                text NOT NULL CHECK (kind IN ('exec', 'cdi.expose', 'cdi.withdraw', 'inventory.refresh', 'reboot')),
    args                jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(args) = 'object'),
    -- The window the command may run in, and the node spec generation the
    -- agent must have observed first; NULL when none.
    not_before          timestamptz,
    not_after           timestamptz,
    min_generation      bigint CHECK (min_generation >= 0),
    -- queued → delivered (sent on a session; again on reconnect) → running →
    -- succeeded | failed | skipped (the agent's result); cancelled by
    -- commands.cancel; expired when not_after passed before delivery.
    state               text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'delivered', 'running', 'succeeded',
                            'failed', 'skipped', 'cancelled', 'expired')),
    exit_code           integer,
    stdout              text NOT NULL DEFAULT '' CHECK (octet_length(stdout) <= 65536),
    stderr              text NOT NULL DEFAULT '' CHECK (octet_length(stderr) <= 65536),
    truncated           boolean NOT NULL DEFAULT false,
    error               text NOT NULL DEFAULT '' CHECK (octet_length(error) <= 4096),
    created_by          text NOT NULL,
    idempotency_key     text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    delivered_at        timestamptz,
    -- commands.cancel of a delivered or running command: the session sends
    -- the agent a cancel frame; the agent's result is still recorded.
    cancel_requested_at timestamptz,
    -- When the agent's result was recorded (NULL: none yet); the first wins.
    result_at           timestamptz,
    finished_at         timestamptz,
    PRIMARY KEY (node_id, seq),
    CHECK (not_after IS NULL OR not_before IS NULL OR not_after > not_before)
);
CREATE UNIQUE INDEX node_commands_idempotency ON node_commands (node_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX node_commands_pending ON node_commands (node_id, seq) WHERE state IN ('queued', 'delivered');

-- Sessions LISTEN on node_commands: a new command, or the cancellation of
-- one, wakes the node's session (the payload is the node id).
-- +goose StatementBegin
CREATE FUNCTION node_commands_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('node_commands', NEW.node_id);
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER node_commands_queued AFTER INSERT ON node_commands
    FOR EACH ROW EXECUTE FUNCTION node_commands_notify();
CREATE TRIGGER node_commands_cancelled AFTER UPDATE OF state ON node_commands
    FOR EACH ROW WHEN (NEW.state = 'cancelled' AND OLD.state <> 'cancelled') EXECUTE FUNCTION node_commands_notify();

-- +goose Down
DROP TABLE node_commands;
DROP FUNCTION node_commands_notify();
ALTER TABLE nodes DROP COLUMN command_seq;
