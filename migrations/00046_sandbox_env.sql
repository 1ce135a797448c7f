-- +goose Up
-- A sandbox template's environment (docs/sandboxes.md, "Environment"):
-- names to plain values or secret:// references, copied onto each of its
-- workloads, whose node fetches them resolved when it creates the
-- container (never in the NodeSpec).
ALTER TABLE sandbox_templates ADD COLUMN env jsonb NOT NULL DEFAULT '{}';
ALTER TABLE instances ADD COLUMN env jsonb NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE instances DROP COLUMN env;
ALTER TABLE sandbox_templates DROP COLUMN env;
