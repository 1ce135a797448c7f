-- +goose Up
-- Webhooks (docs/webhooks.md): a tenant's subscriptions to its events, fed
-- from the events outbox. A webhook's cursor is the tenant_seq of the last
-- event it has taken; its workflow moves the events after it that match
-- into webhook_deliveries (one row per webhook and event, in order) and
-- sends them one at a time, oldest first. The signing secret is sealed by
-- the secret store's keyring (store/secrets.Vault.Seal), never kept in
-- clear; while a rotation overlaps, the previous one signs too.
CREATE TABLE webhooks (
    id              text PRIMARY KEY,
    tenant_id       text NOT NULL,
    url             text NOT NULL,
    description     text NOT NULL DEFAULT '',
    event_types     text[] NOT NULL,
    state           text NOT NULL CHECK (state IN ('active', 'failing', 'disabled')),
    secret_kek      text NOT NULL,
    secret_sealed   bytea NOT NULL,
    secret_version  integer NOT NULL DEFAULT 1,
    previous_kek    text,
    previous_sealed bytea,
    previous_until  timestamptz,
    cursor          bigint NOT NULL,
    last_error      text NOT NULL DEFAULT '',
    failing_since   timestamptz,
    created_by      text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    deleted_at      timestamptz
);
CREATE INDEX webhooks_tenant ON webhooks (tenant_id, created_at, id) WHERE deleted_at IS NULL;

-- One message to one webhook: its id is the webhook-id header on every
-- attempt (receivers deduplicate by it). ordinal orders a webhook's
-- messages; event_id is unique per webhook ('' for pings).
CREATE TABLE webhook_deliveries (
    id              text PRIMARY KEY,
    ordinal         bigint GENERATED ALWAYS AS IDENTITY,
    webhook_id      text NOT NULL REFERENCES webhooks (id),
    tenant_id       text NOT NULL,
    event_id        text NOT NULL DEFAULT '',
    event_type      text NOT NULL,
    payload         jsonb NOT NULL,
    state           text NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        integer NOT NULL DEFAULT 0,
    first_attempt_at timestamptz,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz
);
CREATE UNIQUE INDEX webhook_deliveries_event ON webhook_deliveries (webhook_id, event_id) WHERE event_id <> '';
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (webhook_id, ordinal) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_list ON webhook_deliveries (webhook_id, ordinal DESC);

-- Each attempt: the receiver's status (0: no answer), latency, the start of
-- its answer (at most 1 KiB) or the error.
CREATE TABLE webhook_attempts (
    delivery_id text NOT NULL REFERENCES webhook_deliveries (id),
    n           integer NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    status_code integer NOT NULL,
    latency_ms  integer NOT NULL,
    response    text NOT NULL DEFAULT '',
    error       text NOT NULL DEFAULT '',
    PRIMARY KEY (delivery_id, n)
);

-- +goose Down
DROP TABLE webhook_attempts;
DROP TABLE webhook_deliveries;
DROP TABLE webhooks;
