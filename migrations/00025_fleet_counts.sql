-- +goose Up
-- The fleet gauges count node commands by state on every scrape (cached
-- 10 s). Commands are never deleted and carry their output, so the count
-- read the whole table; from this index it reads only the states.
CREATE INDEX node_commands_state ON node_commands (state);

-- +goose Down
DROP INDEX node_commands_state;
