-- +goose Up
-- A change of a node's NodeSpec generation notifies node_spec with the node
-- id at commit, so the agent gateway holding the node's session sends the
-- new spec at once instead of at the next heartbeat (up to 10 s later).
-- +goose StatementBegin
CREATE FUNCTION notify_node_spec() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('node_spec', NEW.id);
    RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER nodes_spec_notify AFTER UPDATE OF generation ON nodes
    FOR EACH ROW WHEN (NEW.generation IS DISTINCT FROM OLD.generation) EXECUTE FUNCTION notify_node_spec();

-- +goose Down
DROP TRIGGER nodes_spec_notify ON nodes;
DROP FUNCTION notify_node_spec();
