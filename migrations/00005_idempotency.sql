-- +goose Up
-- Admissions are idempotent per caller: the row ties (tenant, identity,
-- method, key) to the request's hash, the draft it prepared, and once done
-- the stored result a replay returns without a new decision.
CREATE TABLE idempotency_keys (
    tenant_id     text NOT NULL,
    identity_id   text NOT NULL,
    method        text NOT NULL,
    key           text NOT NULL,
    request_hash  bytea NOT NULL,
    resource_type text NOT NULL,
    resource_id   text NOT NULL,
    result        jsonb, -- NULL until the admission completed
    created_at    timestamptz NOT NULL DEFAULT now(),
    completed_at  timestamptz,
    PRIMARY KEY (tenant_id, identity_id, method, key)
);

-- +goose Down
DROP TABLE idempotency_keys;
