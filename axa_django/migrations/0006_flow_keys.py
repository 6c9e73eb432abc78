"""Per-key counts of concurrency-limited jobs, so that the limited claim walks only keys with a free slot.

axa_flow_key holds, per (name, concurrency_key) pair, how many of its rows are queued
and running; its index (name, running, key) WHERE queued > 0 lists the pairs with work
and room in order, so a claim never walks the keys held at their limit (issue 21: 40
such keys sorting first hid every other key from the claim). Triggers on axa_queue
write each change of a keyed row as a delta into axa_flow_delta (insert-only: an
enqueue or a finish never waits on another's row lock, and no two statements lock
counters in opposite orders); every limited claim first folds the deltas into the
counts (sqlflow.FOLD). The counts only steer the walk: the claim still counts running
rows from axa_queue, so a limit is exact even while deltas wait to be folded. TRUNCATE
of axa_queue empties both tables (by DELETE). Rows already queued or running are counted here.
"""

from django.db import migrations

FLOW_KEYS = """
CREATE TABLE axa_flow_key (
    name text NOT NULL,
    key text NOT NULL,
    queued integer NOT NULL DEFAULT 0,
    running integer NOT NULL DEFAULT 0,
    PRIMARY KEY (name, key)
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
        autovacuum_vacuum_cost_delay = 0);
CREATE INDEX axa_flow_key_free ON axa_flow_key (name, running, key) WHERE queued > 0;
CREATE TABLE axa_flow_delta (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL,
    key text NOT NULL,
    queued integer NOT NULL,
    running integer NOT NULL,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id()
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
        autovacuum_vacuum_cost_delay = 0);
-- A fold reads the deltas of transactions that may have been running at the last one
-- only: it never steps over the dead rows of deltas folded before (sqlflow.FOLD).
CREATE INDEX axa_flow_delta_xid ON axa_flow_delta (xid);

CREATE FUNCTION axa_flow_count() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    old_queued integer := 0;
    old_running integer := 0;
    new_queued integer := 0;
    new_running integer := 0;
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.concurrency_key IS NOT NULL THEN
        old_queued := (OLD.status = 'queued')::integer;
        old_running := (OLD.status = 'running')::integer;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.concurrency_key IS NOT NULL THEN
        new_queued := (NEW.status = 'queued')::integer;
        new_running := (NEW.status = 'running')::integer;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.name = NEW.name AND OLD.concurrency_key = NEW.concurrency_key THEN
        INSERT INTO axa_flow_delta (name, key, queued, running)
        VALUES (NEW.name, NEW.concurrency_key, new_queued - old_queued, new_running - old_running);
    ELSE
        IF old_queued + old_running > 0 THEN
            INSERT INTO axa_flow_delta (name, key, queued, running)
            VALUES (OLD.name, OLD.concurrency_key, -old_queued, -old_running);
        END IF;
        IF new_queued + new_running > 0 THEN
            INSERT INTO axa_flow_delta (name, key, queued, running)
            VALUES (NEW.name, NEW.concurrency_key, new_queued, new_running);
        END IF;
    END IF;
    RETURN NULL;
END
$$;
-- Inserts are counted per statement: a bulk enqueue writes one delta per pair, not per row.
CREATE FUNCTION axa_flow_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO axa_flow_delta (name, key, queued, running)
    SELECT name, concurrency_key, count(*) FILTER (WHERE status = 'queued'), count(*) FILTER (WHERE status = 'running')
    FROM inserted WHERE concurrency_key IS NOT NULL AND status IN ('queued', 'running')
    GROUP BY name, concurrency_key;
    RETURN NULL;
END
$$;
CREATE TRIGGER axa_flow_insert AFTER INSERT ON axa_queue REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION axa_flow_count_inserted();
CREATE TRIGGER axa_flow_update AFTER UPDATE OF status, concurrency_key, name ON axa_queue FOR EACH ROW
    WHEN ((OLD.status IS DISTINCT FROM NEW.status OR OLD.concurrency_key IS DISTINCT FROM NEW.concurrency_key
           OR OLD.name IS DISTINCT FROM NEW.name)
          AND ((OLD.concurrency_key IS NOT NULL AND OLD.status IN ('queued', 'running'))
               OR (NEW.concurrency_key IS NOT NULL AND NEW.status IN ('queued', 'running'))))
    EXECUTE FUNCTION axa_flow_count();
CREATE TRIGGER axa_flow_delete AFTER DELETE ON axa_queue FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL AND OLD.status IN ('queued', 'running'))
    EXECUTE FUNCTION axa_flow_count();

-- DELETE, not TRUNCATE: a claim reading axa_flow_key and then waiting for axa_queue
-- would deadlock with a TRUNCATE holding axa_queue and waiting for axa_flow_key. The
-- deltas go first: a fold holding some is waited for, and the counts it wrote go next.
CREATE FUNCTION axa_flow_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM axa_flow_delta;
    DELETE FROM axa_flow_key;
    RETURN NULL;
END
$$;
CREATE TRIGGER axa_flow_truncate AFTER TRUNCATE ON axa_queue FOR EACH STATEMENT
    EXECUTE FUNCTION axa_flow_truncate();

-- The triggers above hold axa_queue against writes until this migration commits.
INSERT INTO axa_flow_key (name, key, queued, running)
SELECT name, concurrency_key, count(*) FILTER (WHERE status = 'queued'), count(*) FILTER (WHERE status = 'running')
FROM axa_queue WHERE concurrency_key IS NOT NULL AND status IN ('queued', 'running')
GROUP BY name, concurrency_key;
"""

DROP_FLOW_KEYS = """
DROP TRIGGER IF EXISTS axa_flow_truncate ON axa_queue;
DROP TRIGGER IF EXISTS axa_flow_delete ON axa_queue;
DROP TRIGGER IF EXISTS axa_flow_update ON axa_queue;
DROP TRIGGER IF EXISTS axa_flow_insert ON axa_queue;
DROP FUNCTION IF EXISTS axa_flow_truncate();
DROP FUNCTION IF EXISTS axa_flow_count_inserted();
DROP FUNCTION IF EXISTS axa_flow_count();
DROP TABLE IF EXISTS axa_flow_delta;
DROP TABLE IF EXISTS axa_flow_key;
"""


class Migration(migrations.Migration):
    dependencies = [("axa_django", "0005_losses")]

    operations = [migrations.RunSQL(FLOW_KEYS, DROP_FLOW_KEYS)]
