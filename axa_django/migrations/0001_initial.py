"""The app's tables as one initial migration (0.1.0 was never installed, so the history is squashed).

Creates the tables (axa_queue with every claim and admin index and its unique-key
constraint, axa_worker, axa_schedule, the flow, workflow and queue tables, the admin's
proxy models), then in SQL: the insert NOTIFY trigger, the storage parameters, the
triggers announcing rows queued behind the claims' floors, the per-key counts of
concurrency-limited jobs, and the history tables finished jobs move into.
"""

import uuid

import django.db.models.functions.datetime
from django.db import migrations, models

import axa_django.ids
import axa_django.models.names

# An insert from any producer (this app, a Rust service, psql) wakes idle workers.
# FOR EACH STATEMENT sends one notification per INSERT however many rows it wrote,
# and PostgreSQL delivers it at commit, so a rolled-back enqueue wakes nobody.
NOTIFY_TRIGGER = """
CREATE FUNCTION axa_queue_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('axa_queue', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER axa_queue_notify AFTER INSERT ON axa_queue
    FOR EACH STATEMENT EXECUTE FUNCTION axa_queue_notify();
"""
DROP_NOTIFY_TRIGGER = """
DROP TRIGGER IF EXISTS axa_queue_notify ON axa_queue;
DROP FUNCTION IF EXISTS axa_queue_notify();
"""

# A queue's limit set, changed or lifted, or a queue resumed, by any means (queues.limit
# and queues.resume, the ORM, psql) wakes idle workers, which read the limits again on
# news (worker/queuelimits.py). A limit lifted, or a queue resumed, hands rows back to
# the plain claim, which may have walked past them (worker/lanes.py): 'rescan', which
# makes every worker's next claim walk from the start, so not for a limit set or changed
# (an upsert fires the UPDATE trigger too), nor for a pause, which makes nothing claimable.
QUEUE_CONTROL_NOTIFY = """
CREATE FUNCTION axa_queue_control_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        PERFORM pg_notify('axa_queue', 'rescan');
    ELSE
        PERFORM pg_notify('axa_queue', '');
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER axa_queue_limit_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON axa_queue_limit
    FOR EACH STATEMENT EXECUTE FUNCTION axa_queue_control_notify();
CREATE TRIGGER axa_paused_queue_notify AFTER DELETE OR TRUNCATE ON axa_paused_queue
    FOR EACH STATEMENT EXECUTE FUNCTION axa_queue_control_notify();
"""
DROP_QUEUE_CONTROL_NOTIFY = """
DROP TRIGGER IF EXISTS axa_paused_queue_notify ON axa_paused_queue;
DROP TRIGGER IF EXISTS axa_queue_limit_notify ON axa_queue_limit;
DROP FUNCTION IF EXISTS axa_queue_control_notify();
"""

# Every claim and finish rewrites the row: leave room on each page for HOT updates,
# and vacuum this small, hot table far sooner than the 20% default.
STORAGE = """
ALTER TABLE axa_queue SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE axa_worker SET (fillfactor = 50);
"""
RESET_STORAGE = """
ALTER TABLE axa_queue RESET (fillfactor, autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
    autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_delay);
ALTER TABLE axa_worker RESET (fillfactor);
"""

# A row queued with a run_at before its statement's time may lie behind the workers'
# claim floors: say so (worker/lanes.py, Lanes.heard), whoever wrote it: an INSERT, an
# UPDATE that queues it again (a rescue, a retry from the admin or the Rust service) or
# moves it earlier (a job rescheduled to now by the ORM or psql). Rows enqueued by
# perform_later or the seed's ENQUEUE have run_at at or after that time and send nothing
# more. The time is whole seconds, earlier or equal: the workers walk from there, and
# PostgreSQL sends a payload once per transaction, so a statement over many rows sends
# one per second of their run_at, not one per row.
BEHIND = """
CREATE FUNCTION axa_queue_behind() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('axa_queue', 'ready:' || floor(extract(epoch FROM NEW.run_at))::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER axa_queue_behind_insert AFTER INSERT ON axa_queue FOR EACH ROW
    WHEN (NEW.status = 'queued' AND NEW.run_at < statement_timestamp())
    EXECUTE FUNCTION axa_queue_behind();
CREATE TRIGGER axa_queue_behind_update AFTER UPDATE OF status, run_at ON axa_queue FOR EACH ROW
    WHEN (NEW.status = 'queued' AND (OLD.status <> 'queued' OR NEW.run_at < OLD.run_at)
          AND NEW.run_at < statement_timestamp())
    EXECUTE FUNCTION axa_queue_behind();
"""
NOT_BEHIND = """
DROP TRIGGER IF EXISTS axa_queue_behind_update ON axa_queue;
DROP TRIGGER IF EXISTS axa_queue_behind_insert ON axa_queue;
DROP FUNCTION IF EXISTS axa_queue_behind();
"""

# Per-key counts of concurrency-limited jobs, so that the limited claim walks only keys with a free slot.
#
# axa_flow_key holds, per (name, concurrency_key) pair, how many of its rows are queued
# and running; its index (name, running, key) WHERE queued > 0 lists the pairs with work
# and room in order, so a claim never walks the keys held at their limit (issue 21: 40
# such keys sorting first hid every other key from the claim). Triggers on axa_queue
# write each change of a keyed row as a delta into axa_flow_delta (insert-only: an
# enqueue or a finish never waits on another's row lock, and no two statements lock
# counters in opposite orders); every limited claim first folds the deltas into the
# counts (sqlflow.FOLD). The counts only steer the walk: the claim still counts running
# rows from axa_queue, so a limit is exact even while deltas wait to be folded. TRUNCATE
# of axa_queue empties both tables (by DELETE). Rows already queued or running are counted here.
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
-- A statement with no keyed row returns at the look: the INSERT's start-up alone took
-- 12 us of a one-row enqueue's 117-125 (benchmarks/results/pg15-flow-insert-guard-ab.txt).
CREATE FUNCTION axa_flow_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM inserted WHERE concurrency_key IS NOT NULL) THEN
        RETURN NULL;
    END IF;
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

# Finished jobs live in history tables that inherit ``axa_queue``; retention drops whole tables.
#
# ``axa_queue`` itself keeps the rows still to run (waiting, queued, running); a job that
# finishes moves into ``axa_history``, a table that ``INHERITS (axa_queue)``, so that every
# reader of ``axa_queue`` (the ORM, the admin, the seed's statements) still sees it. The
# worker's FINISH moves its rows itself (a DELETE and an INSERT, fewer index entries than
# the update it replaces); any other statement that finishes a row (the seed's finish, a
# cancel, a rescue that gives up) is caught by ``axa_history_keep``. A history row given a
# live status again (a retry) moves back by ``axa_history_revive``.
#
# With RETENTION set, housekeeping closes ``axa_history`` every RETENTION / 4 (renamed
# ``axa_history_<number>``, a fresh one prepared beforehand taking its name) and drops a
# closed table once its close is older than RETENTION: old history goes in O(1), leaving
# no dead rows behind. ``axa_history_part`` records each table's number and times.

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

-- A row finished in axa_queue by any statement but the worker's FINISH moves to the history,
-- unless the setting axa.in_place names it (or is 'all', in a transaction of the worker's
-- own): set for a row whose move a user's foreign key or trigger refused (sql/refused.py),
-- so that row is finished where it is instead of being left running.
CREATE FUNCTION axa_history_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('axa.in_place', true) IN ('all', NEW.id::text) THEN
        RETURN NULL;
    END IF;
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

# A running row queued again, by any statement (the worker's retry, release or rescue, the
# seed's REQUEUE_STALE, a user's update), passes this guard:
# - a mixed fleet: the seed's REQUEUE_STALE, which a Rust service sharing the table runs
#   at its start, queues again every row running for longer than its stale_minutes,
#   keeping the worker id and clearing the start. That update is skipped for a row whose
#   worker's heartbeat is fresh (within the lease it registered), so a job whose worker
#   is alive is never requeued, however long it runs (the lease held within 0 and 1e9 s, as
#   sql.LIVE holds it: a lease of 1e12 or Infinity written by hand put now() minus it out of
#   range and failed the whole REQUEUE_STALE). The worker's own statements clear
#   the worker id, so the guard never holds for them; a seed-claimed row has none.
# - a job whose cancel was asked while it ran ends cancelled instead (axa_history_keep then
#   moves it): queued again, its next claim cleared the flag and ran it.
# Claims (queued -> running) never call it: the WHEN is the whole cost on the hot path.
REQUEUE = """
CREATE FUNCTION axa_queue_requeue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.worker_id = OLD.worker_id AND OLD.started_at IS NOT NULL AND NEW.started_at IS NULL
       AND EXISTS (SELECT 1 FROM axa_worker w WHERE w.id = OLD.worker_id
                   AND w.heartbeat_at > now() - LEAST(GREATEST(w.lease_seconds, 0), 1e9) * interval '1 second') THEN
        RETURN NULL;
    END IF;
    IF NEW.cancel_requested THEN
        NEW.status := 'cancelled';
        NEW.finished_at := now();
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER axa_queue_requeue BEFORE UPDATE OF status ON axa_queue FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status = 'queued')
    EXECUTE FUNCTION axa_queue_requeue();
"""
NO_REQUEUE = """
DROP TRIGGER IF EXISTS axa_queue_requeue ON axa_queue;
DROP FUNCTION IF EXISTS axa_queue_requeue();
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
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="FinishedHour",
            fields=[
                ("hour", models.DateTimeField(primary_key=True, serialize=False)),
                ("completed", models.BigIntegerField()),
                ("failed", models.BigIntegerField()),
            ],
            options={
                "db_table": "axa_finished_hour",
                "ordering": ["hour"],
                "default_permissions": (),
            },
        ),
        migrations.CreateModel(
            name="QueuePause",
            fields=[
                ("queue", models.TextField(primary_key=True, serialize=False)),
                ("reason", models.TextField(blank=True, db_default="")),
                ("paused_by", models.TextField(blank=True, db_default="")),
                ("paused_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                "verbose_name": "paused queue",
                "verbose_name_plural": "paused queues",
                "db_table": "axa_paused_queue",
                "ordering": ["queue"],
                "permissions": [("pause_queue", "Can pause and resume queues")],
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="RateBucket",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "name", "key", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("name", models.TextField()),
                ("key", models.TextField()),
                ("tat", models.DateTimeField()),
            ],
            options={
                "db_table": "axa_rate_bucket",
                "default_permissions": (),
            },
        ),
        migrations.CreateModel(
            name="Schedule",
            fields=[
                ("name", models.TextField(primary_key=True, serialize=False)),
                ("last_run", models.DateTimeField()),
            ],
            options={
                "db_table": "axa_schedule",
                "ordering": ["name"],
            },
        ),
        migrations.CreateModel(
            name="Worker",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ("hostname", models.TextField()),
                ("pid", models.IntegerField()),
                ("concurrency", models.IntegerField()),
                ("queues", models.JSONField(default=list)),
                ("names", models.JSONField(db_default=models.Value([], models.JSONField()))),
                ("backends", models.JSONField(db_default=models.Value([], models.JSONField()))),
                ("started_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("heartbeat_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("lease_seconds", models.FloatField(db_default=30.0)),
            ],
            options={
                "db_table": "axa_worker",
                "ordering": ["started_at"],
            },
        ),
        migrations.CreateModel(
            name="Workflow",
            fields=[
                (
                    "id",
                    models.UUIDField(default=axa_django.ids.uuid7, editable=False, primary_key=True, serialize=False),
                ),
                ("kind", models.TextField(choices=[("workflow", "Workflow"), ("batch", "Batch")], default="workflow")),
                ("name", models.TextField(blank=True, default="")),
                ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                "db_table": "axa_workflow",
                "ordering": ["-created_at"],
            },
        ),
        migrations.CreateModel(
            name="Dependency",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("parent_id", models.UUIDField()),
                ("child_id", models.UUIDField()),
                ("done", models.BooleanField(db_default=False)),
            ],
            options={
                "db_table": "axa_dependency",
                "indexes": [
                    models.Index(fields=["child_id", "parent_id"], name="axa_dependency_child"),
                    models.Index(
                        condition=models.Q(("done", False)), fields=["parent_id"], name="axa_dependency_pending"
                    ),
                ],
                "constraints": [models.UniqueConstraint(fields=("parent_id", "child_id"), name="axa_dependency_edge")],
            },
        ),
        migrations.CreateModel(
            name="Job",
            fields=[
                (
                    "id",
                    models.UUIDField(default=axa_django.ids.uuid7, editable=False, primary_key=True, serialize=False),
                ),
                ("name", models.TextField()),
                ("args", models.JSONField(default=dict)),
                (
                    "status",
                    models.TextField(
                        choices=[
                            ("waiting", "Waiting"),
                            ("queued", "Queued"),
                            ("running", "Running"),
                            ("completed", "Completed"),
                            ("failed", "Failed"),
                            ("cancelled", "Cancelled"),
                        ],
                        db_default="queued",
                        default="queued",
                    ),
                ),
                ("error", models.TextField(blank=True, null=True)),
                ("run_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("updated_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("queue", models.TextField(db_default="default")),
                ("priority", models.IntegerField(db_default=0)),
                ("attempts", models.IntegerField(db_default=0)),
                ("max_attempts", models.IntegerField(blank=True, null=True)),
                ("losses", models.IntegerField(db_default=0)),
                ("max_losses", models.IntegerField(blank=True, null=True)),
                ("worker_id", models.UUIDField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("errors", models.JSONField(db_default=models.Value([], models.JSONField()))),
                ("result", models.JSONField(blank=True, null=True)),
                ("unique_key", models.TextField(blank=True, null=True)),
                ("cancel_requested", models.BooleanField(db_default=False)),
                ("backend", models.TextField(blank=True, null=True)),
                ("timeout", models.FloatField(blank=True, null=True)),
                ("concurrency_key", models.TextField(blank=True, null=True)),
                ("rate_key", models.TextField(blank=True, null=True)),
                ("pending_parents", models.IntegerField(db_default=0)),
                ("has_children", models.BooleanField(db_default=False)),
                ("on_parent_failure", models.TextField(blank=True, null=True)),
                ("workflow_id", models.UUIDField(blank=True, null=True)),
                ("trace_context", models.JSONField(blank=True, editable=False, null=True)),
            ],
            options={
                "db_table": "axa_queue",
                "ordering": ["-created_at"],
                "permissions": [("retry_job", "Can retry job"), ("cancel_job", "Can cancel job")],
            },
        ),
        # Made one by one, not deferred to the migration's end: the history table made
        # below copies axa_queue's indexes.
        migrations.AddIndex(
            model_name="job",
            index=models.Index(condition=models.Q(("status", "queued")), fields=["run_at"], name="axa_queue_ready"),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("name"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                condition=models.Q(("status__gte", "queued"), ("status__lte", "queued"), ("name__isnull", False)),
                name="axa_queue_claim",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                condition=models.Q(("status__gte", "queued"), ("status__lte", "queued")),
                name="axa_queue_claim_all",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                condition=models.Q(("status__gte", "queued"), ("status__lte", "queued"), ("queue__isnull", False)),
                name="axa_queue_claim_all_queue",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("backend"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                condition=models.Q(("status__gte", "queued"), ("status__lte", "queued"), ("backend__isnull", False)),
                name="axa_queue_claim_task",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                models.F("name"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                condition=models.Q(("status__gte", "queued"), ("status__lte", "queued"), ("name__isnull", False)),
                name="axa_queue_claim_queue",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                models.F("backend"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                condition=models.Q(("status__gte", "queued"), ("status__lte", "queued"), ("backend__isnull", False)),
                name="axa_queue_claim_task_queue",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "running")), fields=["worker_id"], name="axa_queue_running"
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status__in", ["queued", "running", "completed"]), _negated=True),
                fields=["status", "-created_at"],
                name="axa_queue_status",
            ),
        ),
        migrations.AddIndex(model_name="job", index=models.Index(fields=["-created_at"], name="axa_queue_created")),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.OrderBy(models.F("finished_at"), descending=True),
                models.OrderBy(models.F("id"), descending=True),
                condition=models.Q(("status", "failed")),
                name="axa_queue_failed",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("name"),
                models.F("concurrency_key"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                condition=models.Q(("concurrency_key__isnull", False), ("status", "queued")),
                name="axa_queue_claim_limited",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("concurrency_key__isnull", False), ("status", "running")),
                fields=["name", "concurrency_key"],
                name="axa_queue_limited_running",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("name"),
                models.F("rate_key"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                condition=models.Q(("rate_key__isnull", False), ("status", "queued")),
                name="axa_queue_claim_rated",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("workflow_id__isnull", False)), fields=["workflow_id"], name="axa_queue_workflow"
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("has_children", True), ("on_parent_failure__isnull", False), _connector="OR"),
                fields=["id"],
                name="axa_queue_linked",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("attempts__gte", 0), ("status", "queued")),
                fields=["queue", "run_at"],
                name="axa_queue_ready_queue",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)), fields=["finished_at"], name="axa_queue_finished"
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(("status__in", ["queued", "running"]), ("unique_key__isnull", False)),
                fields=("name", "unique_key"),
                name="axa_queue_unique",
            ),
        ),
        migrations.CreateModel(
            name="FailedJob",
            fields=[],
            options={
                "verbose_name": "failed job",
                "verbose_name_plural": "failed jobs",
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("axa_django.job",),
        ),
        migrations.CreateModel(
            name="QueueDashboard",
            fields=[],
            options={
                "verbose_name": "dashboard",
                "verbose_name_plural": "dashboard",
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("axa_django.job",),
        ),
        migrations.CreateModel(
            name="QueueLimit",
            fields=[
                ("queue", models.TextField(primary_key=True, serialize=False)),
                ("max_running", models.IntegerField()),
                ("set_by", models.TextField(blank=True, db_default="")),
                ("set_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                "verbose_name": "queue limit",
                "verbose_name_plural": "queue limits",
                "db_table": "axa_queue_limit",
                "ordering": ["queue"],
                "default_permissions": ("view",),
                "constraints": [
                    models.CheckConstraint(condition=models.Q(("max_running__gt", 0)), name="axa_queue_limit_positive")
                ],
            },
        ),
        migrations.RunSQL(NOTIFY_TRIGGER, DROP_NOTIFY_TRIGGER),
        migrations.RunSQL(STORAGE, RESET_STORAGE),
        migrations.RunSQL(BEHIND, NOT_BEHIND),
        migrations.RunSQL(FLOW_KEYS, DROP_FLOW_KEYS),
        migrations.RunSQL(HISTORY, DROP_HISTORY),
        migrations.RunSQL(REQUEUE, NO_REQUEUE),
        migrations.RunSQL(QUEUE_CONTROL_NOTIFY, DROP_QUEUE_CONTROL_NOTIFY),
        # The Job names page: per (span, name) figures kept once a span has settled.
        migrations.CreateModel(
            name="NameSpan",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "minutes", "start", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("minutes", models.SmallIntegerField()),
                ("start", models.DateTimeField()),
            ],
            options={
                "db_table": "axa_name_span",
                "default_permissions": (),
            },
        ),
        migrations.CreateModel(
            name="NameStat",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "minutes", "start", "name", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("minutes", models.SmallIntegerField()),
                ("start", models.DateTimeField()),
                ("name", models.TextField()),
                ("completed", models.BigIntegerField()),
                ("failed", models.BigIntegerField()),
                ("retried", models.BigIntegerField()),
                ("max_seconds", models.FloatField(null=True)),
                ("bins", axa_django.models.names.IntArrayField(element="smallint")),
                ("counts", axa_django.models.names.IntArrayField(element="bigint")),
            ],
            options={
                "db_table": "axa_name_stat",
                "default_permissions": (),
            },
        ),
        migrations.CreateModel(
            name="JobNames",
            fields=[],
            options={
                "verbose_name": "job names",
                "verbose_name_plural": "job names",
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("axa_django.job",),
        ),
        # The periodic jobs page: an entry switched off, and the job of its last occurrence.
        migrations.AddField(model_name="schedule", name="enabled", field=models.BooleanField(db_default=True)),
        migrations.AddField(model_name="schedule", name="last_job_id", field=models.UUIDField(blank=True, null=True)),
        migrations.CreateModel(
            name="PeriodicJob",
            fields=[],
            options={
                "verbose_name": "periodic job",
                "verbose_name_plural": "periodic jobs",
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("axa_django.schedule",),
        ),
        # The Workers page's graceful stop (read back by the heartbeat), and the Queues and
        # Workers pages' admin entries.
        migrations.AddField(
            model_name="worker",
            name="stop_requested_by",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="stop_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="Queue",
            fields=[],
            options={
                "verbose_name": "queue",
                "verbose_name_plural": "queues",
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("axa_django.queuepause",),
        ),
        migrations.CreateModel(
            name="LiveWorker",
            fields=[],
            options={
                "verbose_name": "worker",
                "verbose_name_plural": "workers",
                "permissions": [("stop_worker", "Can ask a worker to stop")],
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("axa_django.worker",),
        ),
        migrations.CreateModel(
            name="BulkOperation",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("kind", models.TextField(choices=[("retry", "Retry"), ("cancel", "Cancel"), ("delete", "Delete")])),
                ("site", models.TextField(db_default="admin")),
                ("list_name", models.TextField()),
                ("query", models.TextField(blank=True, db_default="")),
                ("user_pk", models.TextField(blank=True, db_default="")),
                ("started_by", models.TextField(blank=True, db_default="")),
                (
                    "status",
                    models.TextField(
                        choices=[
                            ("queued", "Queued"),
                            ("running", "Running"),
                            ("done", "Done"),
                            ("cancelled", "Cancelled"),
                            ("failed", "Failed"),
                        ],
                        db_default="queued",
                    ),
                ),
                ("estimate", models.BigIntegerField(db_default=0)),
                ("estimated", models.BooleanField(db_default=False)),
                ("batch_size", models.IntegerField(db_default=1000)),
                ("pause_ms", models.IntegerField(db_default=500)),
                ("bound", models.UUIDField(blank=True, null=True)),
                ("position", models.UUIDField(blank=True, null=True)),
                ("matched", models.BigIntegerField(db_default=0)),
                ("changed", models.BigIntegerField(db_default=0)),
                ("skipped_gone", models.BigIntegerField(db_default=0)),
                ("skipped_key", models.BigIntegerField(db_default=0)),
                ("skipped_refused", models.BigIntegerField(db_default=0)),
                ("skipped_busy", models.BigIntegerField(db_default=0)),
                ("busy", models.JSONField(db_default=models.Value([], models.JSONField()))),
                ("batches", models.IntegerField(db_default=0)),
                ("job_id", models.UUIDField(blank=True, null=True)),
                ("cancel_requested", models.BooleanField(db_default=False)),
                ("cancelled_by", models.TextField(blank=True, db_default="")),
                ("error", models.TextField(blank=True, db_default="")),
                ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("updated_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                "verbose_name": "bulk operation",
                "verbose_name_plural": "bulk operations",
                "db_table": "axa_bulk_operation",
                "ordering": ["-id"],
                "default_permissions": (),
            },
        ),
    ]
