-- +goose Up
-- Exec tunnels (sandboxes.exec): the tunnel runs a command in an instance
-- instead of dialing an address; exec holds the command (agent/protocol's
-- ExecSpec) and the output limit, sent in the tunnel frame.
ALTER TABLE tunnels DROP CONSTRAINT tunnels_target_check;
ALTER TABLE tunnels ADD CONSTRAINT tunnels_target_check CHECK (target IN ('tcp', 'exec'));
ALTER TABLE tunnels ADD COLUMN exec jsonb;
ALTER TABLE tunnels ADD COLUMN exec_output_limit bigint NOT NULL DEFAULT 0 CHECK (exec_output_limit >= 0);
ALTER TABLE tunnels ADD CONSTRAINT tunnels_exec_iff_target CHECK ((target = 'exec') = (exec IS NOT NULL));

-- +goose Down
DELETE FROM tunnels WHERE target = 'exec';
ALTER TABLE tunnels DROP CONSTRAINT tunnels_exec_iff_target;
ALTER TABLE tunnels DROP COLUMN exec_output_limit;
ALTER TABLE tunnels DROP COLUMN exec;
ALTER TABLE tunnels DROP CONSTRAINT tunnels_target_check;
ALTER TABLE tunnels ADD CONSTRAINT tunnels_target_check CHECK (target IN ('tcp'));
