-- +goose Up
-- A per-tenant event sequence: events.list's cursor is tenant_seq, so a
-- tenant's cursor counts its own events only and reveals nothing of other
-- tenants' volume (the global seq stays the outbox's key and the relay's
-- order).
--
-- tenant_seq is assigned when the publishing transaction commits, by a
-- deferred constraint trigger that locks the tenant's row of
-- event_sequences: the lock is held only from the commit's trigger to the
-- commit's end, so publishers of one tenant serialise on their commits
-- alone, never on the rest of their transactions. The next publisher of the
-- tenant takes the row only once the previous one has committed (and is
-- visible to new snapshots), so tenant_seq follows commit order with no
-- gaps: a reader paging by tenant_seq never skips an event that commits
-- late, and needs no hold-back. A transaction publishing for several
-- tenants numbers them in tenant order, so two such commits cannot
-- deadlock. A rolled-back transaction takes no number. Publishers run at
-- READ COMMITTED (the store's default): under REPEATABLE READ a publisher
-- that waited for the row would fail its commit with a serialization error.
CREATE TABLE event_sequences (
    tenant_id text PRIMARY KEY,
    last      bigint NOT NULL CHECK (last >= 0)
);

ALTER TABLE events ADD COLUMN tenant_seq bigint;
UPDATE events e SET tenant_seq = n.rn
  FROM (SELECT seq, row_number() OVER (PARTITION BY tenant_id ORDER BY seq) AS rn FROM events) n
 WHERE e.seq = n.seq;
INSERT INTO event_sequences (tenant_id, last)
SELECT tenant_id, max(tenant_seq) FROM events GROUP BY tenant_id;
CREATE UNIQUE INDEX events_tenant_order ON events (tenant_id, tenant_seq);
-- This transaction's events still to number (the trigger's lookup).
CREATE INDEX events_unnumbered ON events (xid) WHERE tenant_seq IS NULL;

-- +goose StatementBegin
CREATE FUNCTION events_number_by_tenant() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    t    text;
    n    bigint;
    base bigint;
BEGIN
    -- The first firing in a transaction numbers all its events; the
    -- others find theirs numbered.
    FOR t IN SELECT DISTINCT tenant_id FROM events
              WHERE xid = NEW.xid AND tenant_seq IS NULL ORDER BY tenant_id LOOP
        SELECT count(*) INTO n FROM events WHERE xid = NEW.xid AND tenant_id = t AND tenant_seq IS NULL;
        INSERT INTO event_sequences (tenant_id, last) VALUES (t, 0) ON CONFLICT (tenant_id) DO NOTHING;
        UPDATE event_sequences SET last = last + n WHERE tenant_id = t RETURNING last - n INTO base;
        UPDATE events e SET tenant_seq = base + o.rn
          FROM (SELECT seq, row_number() OVER (ORDER BY seq) AS rn FROM events
                 WHERE xid = NEW.xid AND tenant_id = t AND tenant_seq IS NULL) o
         WHERE e.seq = o.seq;
    END LOOP;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE CONSTRAINT TRIGGER events_number_by_tenant AFTER INSERT ON events
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION events_number_by_tenant();

-- +goose Down
DROP TRIGGER events_number_by_tenant ON events;
DROP FUNCTION events_number_by_tenant();
DROP INDEX events_unnumbered;
DROP INDEX events_tenant_order;
ALTER TABLE events DROP COLUMN tenant_seq;
DROP TABLE event_sequences;
