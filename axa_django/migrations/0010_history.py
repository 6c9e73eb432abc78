"""Finished jobs live in history tables that inherit ``axa_queue``; retention drops whole tables.

``axa_queue`` itself keeps the rows still to run (waiting, queued, running); a job that
finishes moves into ``axa_history``, a table that ``INHERITS (axa_queue)``, so that every
reader of ``axa_queue`` (the ORM, the admin, the seed's statements) still sees it. The
worker's FINISH moves its rows itself (a DELETE and an INSERT, fewer index entries than
the update it replaces); any other statement that finishes a row (the seed's finish, a
cancel, a rescue that gives up) is caught by ``axa_history_keep``. A history row given a
live status again (a retry) moves back by ``axa_history_revive``.

With RETENTION set, housekeeping closes ``axa_history`` every RETENTION / 4 (renamed
``axa_history_<number>``, a fresh one prepared beforehand taking its name) and drops a
closed table once its close is older than RETENTION: old history goes in O(1), leaving
no dead rows behind. ``axa_history_part`` records each table's number and times.
"""

from django.db import migrations, models

HISTORY = """
CREATE SEQUENCE axa_history_number;
CREATE TABLE axa_history_part (
    number bigint PRIMARY KEY,
    opened_at timestamptz,
    closed_at timestamptz
);

-- A new history table: inherits axa_queue with its indexes (those on live statuses stay
-- empty: they cost no write, and let a statement on axa_queue that reads through the
-- children plan each child as it does the parent), named after its number.
CREATE FUNCTION axa_history_make(target text, number bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    index record;
BEGIN
    EXECUTE format('CREATE TABLE %I () INHERITS (axa_queue)', target);
    FOR index IN
        SELECT i.indexrelid, c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = 'axa_queue'::regclass
    LOOP
        EXECUTE regexp_replace(
            pg_get_indexdef(index.indexrelid),
            '^CREATE (UNIQUE )?INDEX \\S+ ON .+? USING ',
            'CREATE \\1INDEX ' || quote_ident('axa_history_' || number || substr(index.relname, 10))
                || ' ON ' || quote_ident(target) || ' USING ');
    END LOOP;
    EXECUTE format(
        'CREATE TRIGGER axa_history_revive AFTER UPDATE OF status ON %I FOR EACH ROW '
        'WHEN (NEW.status NOT IN (''completed'', ''failed'', ''cancelled'')) '
        'EXECUTE FUNCTION axa_history_revive()', target);
END
$$;

-- A row finished in axa_queue by any statement but the worker's FINISH moves to the history.
CREATE FUNCTION axa_history_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM ONLY axa_queue WHERE id = NEW.id;
    INSERT INTO axa_history SELECT NEW.*;
    RETURN NULL;
END
$$;
-- A history row given a live status again (retried, revived) moves back to axa_queue.
CREATE FUNCTION axa_history_revive() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DELETE FROM %s WHERE id = $1', TG_RELID::regclass) USING NEW.id;
    INSERT INTO axa_queue SELECT NEW.*;
    RETURN NULL;
END
$$;

SELECT axa_history_make('axa_history', nextval('axa_history_number'));
INSERT INTO axa_history_part (number, opened_at) VALUES (currval('axa_history_number'), now());
CREATE TRIGGER axa_history_keep AFTER UPDATE OF status ON axa_queue FOR EACH ROW
    WHEN (NEW.status IN ('completed', 'failed', 'cancelled')) EXECUTE FUNCTION axa_history_keep();
"""

# Back to one table: the history's rows return to axa_queue.
DROP_HISTORY = """
DROP TRIGGER IF EXISTS axa_history_keep ON axa_queue;
DO $$
DECLARE
    child regclass;
BEGIN
    FOR child IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'axa_queue'::regclass LOOP
        EXECUTE format('ALTER TABLE %s NO INHERIT axa_queue', child);
        EXECUTE format('INSERT INTO axa_queue SELECT * FROM %s', child);
        EXECUTE format('DROP TABLE %s', child);
    END LOOP;
END
$$;
DROP FUNCTION IF EXISTS axa_history_keep();
DROP FUNCTION IF EXISTS axa_history_make(text, bigint);
DROP FUNCTION IF EXISTS axa_history_revive();
DROP TABLE IF EXISTS axa_history_part;
DROP SEQUENCE IF EXISTS axa_history_number;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("axa_django", "0009_status_index_rare"),
    ]

    operations = [
        # Made before the first history table, which copies axa_queue's indexes.
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("has_children", True), ("on_parent_failure__isnull", False), _connector="OR"),
                fields=["id"],
                name="axa_queue_linked",
            ),
        ),
        migrations.RunSQL(HISTORY, DROP_HISTORY),
    ]
