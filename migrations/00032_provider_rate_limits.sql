-- +goose Up
-- Provider rate limits: one token bucket per (credential, window), shared by
-- every process and workflow that calls a provider with that credential.
-- key is the hex SHA-256 of the token, never the token. A Wait refills the
-- credential's buckets on the database's clock and takes one token of each
-- in one statement; blocked_until is a 429's penalty, or the provider's
-- RateLimit-Reset when nothing remains.
CREATE TABLE provider_rate_limits (
    key           text NOT NULL CHECK (key ~ '^[0-9a-f]{64}$'),
    window_name   text NOT NULL,
    capacity      integer NOT NULL CHECK (capacity >= 1),
    period_ms     bigint NOT NULL CHECK (period_ms >= 1),
    tokens        double precision NOT NULL,
    refilled_at   timestamptz NOT NULL,
    blocked_until timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (key, window_name)
);

-- +goose Down
DROP TABLE provider_rate_limits;
