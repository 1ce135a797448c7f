-- +goose Up
-- What is wrong with a live reservation right now, as a list of
-- conditions ({type, nodeId, since}); today only NodeUnreachable, kept
-- while a node one of its allocations is on is unreachable. The liveness
-- sweep keeps the list in step with the nodes' connectivity.
ALTER TABLE reservations
    ADD COLUMN conditions jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(conditions) = 'array');
-- The sweep finds the reservations on a dead node through their
-- allocations, and those still carrying a condition through this.
CREATE INDEX allocations_node ON allocations (node_id);
CREATE INDEX reservations_with_conditions ON reservations (id) WHERE conditions <> '[]';

-- +goose Down
DROP INDEX reservations_with_conditions;
DROP INDEX allocations_node;
ALTER TABLE reservations DROP COLUMN conditions;
