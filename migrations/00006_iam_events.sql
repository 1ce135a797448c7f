-- +goose Up
-- IAM changes that must reach every process's caches at once, not after
-- their lifetimes: a revoked session, a disabled (or regrouped, or
-- re-authorised) identity, a relation granted or taken away, a policy
-- changed. Each process LISTENs on iam_events and drops what it cached.
-- +goose StatementBegin
CREATE FUNCTION iam_notify_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'iam_sessions' THEN
        IF NEW.revoked_at IS DISTINCT FROM OLD.revoked_at THEN
            PERFORM pg_notify('iam_events', 'session:' || NEW.id);
        END IF;
    ELSIF TG_TABLE_NAME = 'iam_identities' THEN
        IF NEW.disabled_at IS DISTINCT FROM OLD.disabled_at OR NEW.groups IS DISTINCT FROM OLD.groups
           OR NEW.root_authority IS DISTINCT FROM OLD.root_authority THEN
            PERFORM pg_notify('iam_events', 'identity:' || NEW.id);
        END IF;
    ELSIF TG_TABLE_NAME = 'iam_relations' THEN
        PERFORM pg_notify('iam_events', 'identity:' || COALESCE(NEW.subject_id, OLD.subject_id));
    ELSIF TG_TABLE_NAME = 'iam_policies' THEN
        PERFORM pg_notify('iam_events', 'decisions');
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER iam_sessions_events AFTER UPDATE ON iam_sessions FOR EACH ROW EXECUTE FUNCTION iam_notify_event();
CREATE TRIGGER iam_identities_events AFTER UPDATE ON iam_identities FOR EACH ROW EXECUTE FUNCTION iam_notify_event();
CREATE TRIGGER iam_relations_events AFTER INSERT OR UPDATE OR DELETE ON iam_relations FOR EACH ROW EXECUTE FUNCTION iam_notify_event();
CREATE TRIGGER iam_policies_events AFTER INSERT OR UPDATE OR DELETE ON iam_policies FOR EACH ROW EXECUTE FUNCTION iam_notify_event();

-- +goose Down
DROP TRIGGER iam_policies_events ON iam_policies;
DROP TRIGGER iam_relations_events ON iam_relations;
DROP TRIGGER iam_identities_events ON iam_identities;
DROP TRIGGER iam_sessions_events ON iam_sessions;
DROP FUNCTION iam_notify_event();
