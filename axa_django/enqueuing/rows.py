"""Writing job rows: one INSERT per call, one per batch, in the caller's transaction."""

from __future__ import annotations

import contextlib
import datetime
import functools
import itertools
import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import psycopg
from django.db import OperationalError, ProgrammingError, connections, transaction
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

from .. import conf, dependencies
from ..arguments import arguments_of, encode, task_arguments_of
from ..exceptions import DuplicateJob, QueueTableMissing
from ..ids import uuid7, uuid7s
from ..models import Job
from ..signals import job_enqueued
from .options import Options

# The job_enqueued signal's sender: the JobFunction enqueueing, or None for enqueue by name.
# Typed loosely so this module need not import registry, which sits above it.
Sender = Callable[..., Any] | None
# A row to write: the job's name, its args object, its options.
Item = tuple[str, dict[str, Any], Options]

# A Job's fields, in model order. An INSERT reads back only what the database chose
# (the times); the rest is what was sent or a column default of a fresh row.
_FIELDS = [f.attname for f in Job._meta.concrete_fields]
_READ_BACK = ["run_at", "created_at", "updated_at"]
_FRESH: dict[str, Any] = {
    "status": "queued",
    "error": None,
    "started_at": None,
    "attempts": 0,
    "losses": 0,
    "worker_id": None,
    "finished_at": None,
    "errors": [],
    "result": None,
    "cancel_requested": False,
    "pending_parents": 0,
    "has_children": False,
    "on_parent_failure": None,
    "workflow_id": None,
}
_COLUMNS = (
    "id, name, args, queue, priority, run_at, max_attempts, unique_key, backend, timeout, concurrency_key, rate_key, "
    "max_losses"
)
# run_at: the given time, else the enqueue time + delay, else the enqueue time, from the
# database clock. The enqueue time is statement_timestamp(), the created_at default
# (Django's Now()), so run_at - created_at is exactly the delay even inside a long
# transaction. GREATEST ignores NULL, so the floor applies only when asked.
_RUN_AT = (
    "GREATEST(COALESCE({run_at}, statement_timestamp() + {delay}, statement_timestamp()), "
    "CASE WHEN {floor} THEN statement_timestamp() END)"
)
_ON_UNIQUE = (
    "ON CONFLICT (name, unique_key) WHERE unique_key IS NOT NULL AND status IN ('queued', 'running') DO NOTHING"
)


# One row leaves out each value that its column's default says already (position in
# _params, value), so the common enqueue sends three values and reads back one time:
# created_at, which is also updated_at and, with neither run_at nor delay, run_at (all
# statement_timestamp()). A perform_later then takes a quarter less client CPU
# (benchmarks/results/pg15-enqueue-lean-ab.txt).
_RUN_AT_AT = 5
_LEAVE_OUT = ((3, "default"), (4, 0), (_RUN_AT_AT, None), *((index, None) for index in range(8, 15)))
_COLUMN_AT = dict(zip((0, 1, 2, 3, 4, _RUN_AT_AT, *range(8, 15)), _COLUMNS.split(", "), strict=True))


@functools.lru_cache(maxsize=128)
def _insert(present: tuple[int, ...], unique: bool) -> str:
    """The INSERT of one row with the values at ``present`` (positions in _params) besides id, name and args."""
    columns = ["id", "name", "args"]
    values = ["%s", "%s", "%s::jsonb"]
    for index in present:
        columns.append(_COLUMN_AT[index])
        values.append(_RUN_AT.format(run_at="%s", delay="%s::interval", floor="%s") if index == _RUN_AT_AT else "%s")
    returning = "created_at, run_at" if _RUN_AT_AT in present else "created_at"
    return (
        f"INSERT INTO axa_queue ({', '.join(columns)}) VALUES ({', '.join(values)}) "
        f"{_ON_UNIQUE if unique else ''} RETURNING {returning}"
    )


def _present(params: list[Any]) -> tuple[int, ...]:
    """The positions in a row of _params whose values _insert sends (run_at's, when a time or a delay is given)."""
    timed = params[_RUN_AT_AT] is not None or params[_RUN_AT_AT + 1] is not None
    return tuple(index for index, default in _LEAVE_OUT if (timed if index == _RUN_AT_AT else params[index] != default))


def _sent(params: list[Any], present: tuple[int, ...]) -> list[Any]:
    """The values _insert(present, ...) takes, from a row of _params."""
    sent = params[:3]
    for index in present:
        if index == _RUN_AT_AT:
            sent += params[_RUN_AT_AT : _RUN_AT_AT + 3]
        else:
            sent.append(params[index])
    return sent


def _args_text(name: str, args: dict[str, Any], options: Options, limit: int) -> str:
    """A row's args as JSON text, at most ``limit`` bytes."""
    # Every writer's args passed check_json already: bind, check_kwargs, the task
    # backend's _arguments, or built here from strings (cron's {}, batch callbacks).
    if options.backend is not None:
        return encode(args, task_arguments_of(name), limit, levels=2, checked=True)
    return encode(args, arguments_of(name), limit, levels=1, checked=True)


def _params(name: str, args: dict[str, Any], options: Options, job_id: uuid.UUID | None = None) -> list[Any]:
    return [
        job_id or uuid7(),
        name,
        _args_text(name, args, options, conf.get("MAX_ARGS_BYTES")),
        options.queue,
        options.priority,
        options.run_at,
        options.delay,
        # django.tasks keeps a past run_after as given, so past-due tasks are claimed in
        # run_after order; a background job's past run_at means now (documented).
        options.backend is None,
        options.max_attempts,
        options.unique_key,
        options.backend,
        options.timeout,
        options.concurrency_key,
        options.rate_key,
        options.max_losses,
    ]


@contextlib.contextmanager
def _migrated(using: str) -> Iterator[None]:
    """Raise QueueTableMissing, naming the fix, for a statement that found no queue table.

    The failed statement has aborted the caller's transaction, if any: nothing more is
    sent, the error is only said again, as a ProgrammingError still, chained from it.
    """
    try:
        yield
    except ProgrammingError as error:
        if not isinstance(error.__cause__, psycopg.errors.UndefinedTable):
            raise
        name = connections[using].settings_dict.get("NAME")
        option = "" if using == "default" else f" --database {using}"
        raise QueueTableMissing(
            f"{error.__cause__.diag.message_primary or error} in database {name!r} (DATABASES[{using!r}]): "
            f"its queue tables are not created yet; run python manage.py migrate{option} first"
        ) from error


@contextlib.contextmanager
def _cursor(using: str) -> Iterator[Any]:
    """A cursor on the queue database's connection, in the caller's transaction.

    Django's own cursor when something watches queries (DEBUG, assertNumQueries, an
    execute wrapper); else psycopg's client-side cursor on the same connection, which
    binds as Django's does at half the client CPU of an enqueue.
    """
    wrapper = connections[using]
    with _migrated(using):
        if wrapper.queries_logged or wrapper.execute_wrappers:
            with wrapper.cursor() as cursor:
                yield cursor
            return
        wrapper.ensure_connection()
        wrapper.validate_no_broken_transaction()
        with wrapper.wrap_database_errors, psycopg.ClientCursor(wrapper.connection) as cursor:
            yield cursor


def _watched() -> bool:
    """Whether something listens to Job's pre_init or post_init (then Jobs are built by ``from_db``)."""
    return pre_init.has_listeners(Job) or post_init.has_listeners(Job)


def _job(using: str, values: dict[str, Any], watched: bool | None = None) -> Job:
    """A Job loaded from ``values`` (attname -> value; others deferred), as ``Job.from_db`` makes it, faster.

    ``from_db`` runs ``Model.__init__``, a loop over every field; a row just written
    needs only its values set, unless someone listens to pre_init or post_init
    (``watched``: that answer, asked once for a batch).
    """
    if _watched() if watched is None else watched:
        fields = list(values)
        return Job.from_db(using, fields, [values[field] for field in fields])
    job = Job.__new__(Job)
    job._state = ModelState()
    job._state.adding = False
    job._state.db = using
    job.__dict__.update(values)
    job._loaded = values  # what save() compares with: the row as written (models/moves.py)
    return job


def _build(params: list[Any], args: dict[str, Any], times: Sequence[Any], using: str) -> Job:
    job_id, name, _, queue, priority, _, _, _, max_attempts, unique_key, backend, *flow = params
    known = dict(_FRESH, errors=[], id=job_id, name=name, args=args, queue=queue, priority=priority)
    known.update(max_attempts=max_attempts, unique_key=unique_key, backend=backend)
    known.update(zip(("timeout", "concurrency_key", "rate_key", "max_losses"), flow, strict=True))
    known.update(zip(_READ_BACK, times, strict=True))
    return _job(using, known)


def write(name: str, args: dict[str, Any], options: Options, sender: Sender) -> Job:
    """Insert one job row (one statement) and return it as a Job."""
    using = conf.queue_database()
    if options.after or options.workflow is not None:
        job = write_children([(name, args, options, None)], sender, full=True)[0]
        return job
    params = _params(name, args, options)
    present = _present(params)
    with _cursor(using) as cursor:
        cursor.execute(_insert(present, options.unique_key is not None), _sent(params, present))
        row = cursor.fetchone()
    if row is None:
        existing = (
            Job.objects.using(using)
            .filter(name=name, unique_key=options.unique_key, status__in=[Job.Status.QUEUED, Job.Status.RUNNING])
            .first()
        )
        if existing is None:
            # The holder finished between our INSERT and SELECT: the slot is free again.
            return write(name, args, options, sender)
        if options.on_duplicate == "raise":
            raise DuplicateJob(existing)
        return existing
    created = row[0]
    job = _build(params, args, (row[1] if _RUN_AT_AT in present else created, created, created), using)
    job_enqueued.send(sender=sender, job=job)
    return job


class BulkResult(list[Job]):
    """The jobs a bulk enqueue wrote; ``skipped`` counts unique-key duplicates left out."""

    skipped: int = 0


# The batch is one JSON array of rows: a single parameter, a third of the client CPU
# of one array per column. args are JSON already and go in as they are.
_FROM_JSON = (
    f"SELECT id, name, args, queue, priority, {_RUN_AT.format(run_at='run_at', delay='delay', floor='floor')}, "
    "max_attempts, unique_key, backend, timeout, concurrency_key, rate_key, max_losses "
    "FROM jsonb_to_recordset(%s::jsonb) "
    "AS v(id uuid, name text, args jsonb, queue text, priority int, run_at timestamptz, delay interval, floor bool, "
    "max_attempts int, unique_key text, backend text, timeout float8, concurrency_key text, rate_key text, "
    "max_losses int)"
)
_MICROSECOND = datetime.timedelta(microseconds=1)


def _json_text(value: str | None) -> str:
    return "null" if value is None else json.dumps(value)


# A batch repeats a few names and queues: each is written as JSON once.
_json_name = functools.lru_cache(maxsize=256)(json.dumps)


def _as_json(row: list[Any]) -> str:
    """One row of ``_params`` as the JSON object _FROM_JSON reads."""
    job_id, name, args, queue, priority, run_at, delay, floor, max_attempts, unique_key, backend, *flow = row
    timeout, concurrency_key, rate_key, max_losses = flow
    when = "null" if run_at is None else f'"{run_at.isoformat()}"'
    wait = "null" if delay is None else f'"{delay // _MICROSECOND} microseconds"'
    attempts = "null" if max_attempts is None else str(max_attempts)
    return (
        f'{{"id":"{job_id.hex}","name":{_json_name(name)},"args":{args},"queue":{_json_name(queue)},'
        f'"priority":{priority},"run_at":{when},"delay":{wait},"floor":{"true" if floor else "false"},'
        f'"max_attempts":{attempts},"unique_key":{_json_text(unique_key)},"backend":{_json_text(backend)},'
        f'"timeout":{"null" if timeout is None else repr(float(timeout))},'
        f'"concurrency_key":{_json_text(concurrency_key)},"rate_key":{_json_text(rate_key)},'
        f'"max_losses":{"null" if max_losses is None else max_losses}}}'
    )


# Rows the database computes nothing for (no run_at, no delay: the column defaults say
# "now"; no unique key to settle) go in by COPY, which the server takes at about half the
# CPU per row of the INSERT below (benchmarks/results/pg15-bulk-copy-ab.txt), and reads
# while later rows are still being written here. Its text format escapes backslash, tab,
# newline and carriage return.
_COPY = (
    "COPY axa_queue (id, name, args, queue, priority, max_attempts, backend, timeout, concurrency_key, rate_key, "
    "max_losses) FROM STDIN"
)
_COPY_ROWS = 1000
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_field(value: str | None) -> str:
    return "\\N" if value is None else value.translate(_COPY_ESCAPES)


# Names, queues and backend aliases repeat across a batch.
_copy_name = functools.lru_cache(maxsize=256)(_copy_field)


def _copy_number(value: float | None) -> str:
    return "\\N" if value is None else repr(value)


def _copy_tail(options: Options) -> str:
    """What follows id, name and args on a _COPY line of a row with ``options``: the same for a batch's every row."""
    seconds = None if options.timeout is None else float(options.timeout)
    return (
        f"\t{_copy_name(options.queue)}\t{options.priority}\t{_copy_number(options.max_attempts)}\t"
        f"{_copy_name(options.backend)}\t{_copy_number(seconds)}\t{_copy_field(options.concurrency_key)}\t"
        f"{_copy_field(options.rate_key)}\t{_copy_number(options.max_losses)}\n"
    )


def _copied(chunk: list[Item], start: int, after: uuid.UUID | None) -> tuple[str, list[uuid.UUID]]:
    """_COPY's text for ``chunk`` (items ``start`` on, ids going on from ``after``) and its rows' ids;
    a bad item raises naming its index.

    Most batches share one Options (a job's own, as no key is computed): what follows
    the args is written once per Options, not per row.
    """
    lines, tails = [], {}
    ids = uuid7s(len(chunk), after)
    limit = conf.get("MAX_ARGS_BYTES")
    for index, (name, args, options), job_id in zip(itertools.count(start), chunk, ids):
        tail = tails.get(id(options))  # the items hold each Options alive: an id names one
        if tail is None:
            tail = tails[id(options)] = _copy_tail(options)
        try:
            text = _args_text(name, args, options, limit)
        except (TypeError, ValueError) as error:
            raise type(error)(f"item {index}: {error}") from None
        # args is JSON text: tabs and newlines in it are escaped already, backslashes not.
        text = text.replace("\\", "\\\\")
        lines.append(f"{job_id.hex}\t{_copy_name(name)}\t{text}{tail}")
    return "".join(lines), ids


def _built(chunk: list[Item], ids: list[uuid.UUID], using: str, watched: bool) -> list[Job]:
    """The Jobs of ``chunk``'s rows, written with ``ids``."""
    return [
        _bulk_job(using, job_id, name, args, options, watched)
        for (name, args, options), job_id in zip(chunk, ids, strict=True)
    ]


def _bulk_job(
    using: str,
    job_id: uuid.UUID,
    name: str,
    args: dict[str, Any],
    options: Options,
    watched: bool,
    status: str = "queued",
) -> Job:
    """The Job of a row written in bulk, from what was sent; the columns the database
    filled in (times, defaults) are deferred and load on first access."""
    values = {
        "id": job_id,
        "name": name,
        "args": args,
        "status": status,
        "queue": options.queue,
        "priority": options.priority,
        "max_attempts": options.max_attempts,
        "unique_key": options.unique_key,
        "backend": options.backend,
    }
    return _job(using, values, watched)


def _encoded(items: list[tuple[str, dict[str, Any], Options]], start: int, end: int) -> list[list[Any]]:
    """Rows of _params for ``items[start:end]``; a bad one raises naming its index."""
    rows = []
    for index, job_id in zip(range(start, end), uuid7s(end - start), strict=True):
        name, args, options = items[index]
        try:
            rows.append(_params(name, args, options, job_id))
        except (TypeError, ValueError) as error:
            raise type(error)(f"item {index}: {error}") from None
    return rows


def _copyable(options: Options) -> bool:
    return options.run_at is None and options.delay is None and options.unique_key is None


def _chunks(items: Iterable[Item]) -> Iterator[list[Item]]:
    """``items`` in lists of _COPY_ROWS, read as they are asked for."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, _COPY_ROWS)):
        yield chunk


def write_many(items: Iterable[Item], sender: Sender, options: Options | None = None) -> BulkResult:
    """Insert many rows in one statement; a bad item raises and none is written.

    ``options``: every item's, when the caller knows them before the items (no key is
    computed from a call's arguments). A batch that can be copied is then read as the
    COPY goes: ``items`` may be a generator that checks each call, and the checks run
    while the server takes in the rows before.
    """
    using = conf.queue_database()
    streamed = options is not None and _copyable(options) and not options.after and options.workflow is None
    listed = None if streamed else list(items)
    if listed is not None:
        if any(item[2].after or item[2].workflow is not None for item in listed):
            return write_children([(name, args, options, None) for name, args, options in listed], sender)
        if not listed:
            return BulkResult()
    result = BulkResult()
    watched = _watched()
    with _cursor(using) as cursor:
        if isinstance(cursor, psycopg.Cursor) and (listed is None or all(_copyable(item[2]) for item in listed)):
            chunks = _chunks(items if listed is None else listed)
            first = next(chunks, None)
            if first is None:
                return result
            # Rows are encoded while the server takes in the ones before. An item found
            # bad halfway aborts the COPY, which writes nothing; in a transaction, a
            # savepoint keeps the caller's transaction usable after it.
            wrapper = connections[using]
            inside = wrapper.in_atomic_block or not wrapper.get_autocommit()
            # A Job built by from_db (someone listens to pre_init or post_init) runs those
            # receivers, whose queries would wait forever on the connection the COPY holds:
            # such Jobs are built after it.
            later: list[tuple[list[Item], list[uuid.UUID]]] = []
            written = 0
            last: uuid.UUID | None = None  # the id the next part's ids go on from
            with transaction.atomic(using=using) if inside else contextlib.nullcontext(), cursor.copy(_COPY) as copy:
                for chunk in itertools.chain([first], chunks):
                    text, ids = _copied(chunk, written, last)
                    copy.write(text)
                    written, last = written + len(chunk), ids[-1]
                    if watched:
                        later.append((chunk, ids))
                    else:
                        result += _built(chunk, ids, using, watched)
            for chunk, ids in later:
                result += _built(chunk, ids, using, watched)
        else:
            listed = list(items) if listed is None else listed
            if not listed:
                return result
            rows = _encoded(listed, 0, len(listed))
            document = "[" + ",".join(map(_as_json, rows)) + "]"
            cursor.execute(f"INSERT INTO axa_queue ({_COLUMNS}) {_FROM_JSON} {_ON_UNIQUE} RETURNING id", [document])
            written = {row[0] for row in cursor.fetchall()}
            for row, (name, args, options) in zip(rows, listed, strict=True):
                if row[0] in written:
                    result.append(_bulk_job(using, row[0], name, args, options, watched))
            result.skipped = len(listed) - len(result)
    for job in result:
        job_enqueued.send(sender=sender, job=job)
    return result


# Rows with parents (after=) or in a workflow: the parents are locked in id order and
# marked has_children (so that their FINISH settles this child: see dependencies.py),
# and their status read under that lock decides the child's: waiting while some have
# not finished, cancelled if one did not complete (unless it runs anyway), else queued.
# Every parent must exist, or nothing is inserted. One statement per set of parents.
# Queued parents were locked here, so claims passed over them and may have walked past
# them (worker/lanes.py): they are announced as ready again, delivered at commit.
_CHILDREN = f"""
WITH locked AS (
    SELECT id FROM axa_queue WHERE id = ANY(%s::uuid[]) ORDER BY id FOR UPDATE
), parents AS (
    UPDATE axa_queue q SET has_children = true FROM locked WHERE q.id = locked.id
    RETURNING q.id, q.status, q.run_at
), state AS (
    SELECT count(*) AS found,
        count(*) FILTER (WHERE status NOT IN ('completed', 'failed', 'cancelled')) AS pending,
        (array_agg(id ORDER BY id) FILTER (WHERE status IN ('failed', 'cancelled')))[1] AS bad,
        (array_agg(status ORDER BY id) FILTER (WHERE status IN ('failed', 'cancelled')))[1] AS bad_status
    FROM parents
), choice AS (
    SELECT s.*, CASE WHEN s.bad IS NOT NULL AND %s <> 'run' THEN 'cancelled'
                     WHEN s.pending > 0 THEN 'waiting' ELSE 'queued' END AS status
    FROM state s WHERE s.found = %s
), inserted AS (
    INSERT INTO axa_queue ({_COLUMNS}, status, pending_parents, on_parent_failure, workflow_id, error, finished_at)
    SELECT v.*, c.status, CASE WHEN c.status = 'waiting' THEN c.pending ELSE 0 END, %s, %s::uuid,
        CASE WHEN c.status = 'cancelled' THEN format(
            '{dependencies.PARENT_FAILED}: parent job %%s ended %%s, so this job was cancelled', c.bad, c.bad_status)
        END,
        CASE WHEN c.status = 'cancelled' THEN now() END
    FROM ({_FROM_JSON}) AS v CROSS JOIN choice c
    RETURNING id, status
), edges AS (
    INSERT INTO axa_dependency (parent_id, child_id, done)
    SELECT p.id, i.id, p.status IN ('completed', 'failed', 'cancelled') FROM parents p CROSS JOIN inserted i
)
SELECT id, status FROM inserted
UNION ALL
SELECT NULL, 'woken' FROM (
    SELECT pg_notify('axa_queue', 'ready:' || extract(epoch FROM min(run_at))::text)
    FROM parents WHERE status = 'queued' HAVING count(*) > 0
) AS n
"""


def _children(using: str, cursor: Any, params: list[Any]) -> list[tuple[Any, ...]]:
    """Run _CHILDREN; again if it lost a deadlock (a finisher locking the same parents in another order)."""
    for attempt in range(5):
        try:
            with transaction.atomic(using=using):
                cursor.execute(_CHILDREN, params)
                return [row for row in cursor.fetchall() if row[0] is not None]
        except OperationalError as error:
            if attempt == 4 or not isinstance(error.__cause__, psycopg.errors.DeadlockDetected):
                raise
    raise AssertionError("unreachable")


def _missing(cursor: Any, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    cursor.execute("SELECT id FROM axa_queue WHERE id = ANY(%s::uuid[])", [list(ids)])
    found = {row[0] for row in cursor.fetchall()}
    return [job_id for job_id in ids if job_id not in found]


def write_children(
    items: Sequence[tuple[str, dict[str, Any], Options, uuid.UUID | None]],
    sender: Sender | Sequence[Sender],
    full: bool = False,
) -> BulkResult:
    """Insert rows with parents, one statement per run of items with the same parents, all or none.

    ``sender``: job_enqueued's sender, or one per item. ``full``: load every column of
    the rows back (one row, for perform_later).
    """
    using = conf.queue_database()
    prepared = []
    for index, (name, args, options, job_id) in enumerate(items):
        try:
            prepared.append((_params(name, args, options, job_id), options, args))
        except (TypeError, ValueError) as error:
            raise type(error)(f"item {index}: {error}") from None
    result = BulkResult()
    statuses: dict[uuid.UUID, str] = {}
    with _migrated(using), transaction.atomic(using=using), connections[using].cursor() as cursor:
        start = 0
        while start < len(prepared):
            key = (prepared[start][1].after, prepared[start][1].on_parent_failure, prepared[start][1].workflow)
            end = start + 1
            while end < len(prepared) and (
                (prepared[end][1].after, prepared[end][1].on_parent_failure, prepared[end][1].workflow) == key
            ):
                end += 1
            after, policy, workflow = key
            document = "[" + ",".join(_as_json(row) for row, _, _ in prepared[start:end]) + "]"
            params = [list(after), policy, len(after), policy, workflow, document]
            rows = _children(using, cursor, params)
            # A parent that finished while the statement waited for its lock moved into
            # the history, out of that statement's sight: the next statement sees it there.
            retries = 3
            while len(rows) != end - start and retries and not _missing(cursor, after):
                rows = _children(using, cursor, params)
                retries -= 1
            if len(rows) != end - start:
                missing = _missing(cursor, after)
                raise ValueError(
                    f"after= names job(s) that do not exist: {', '.join(map(str, missing)) or '(deleted meanwhile)'}; "
                    "pass jobs returned by perform_later (a job must exist before another can wait for it); "
                    "nothing was enqueued"
                )
            statuses.update(rows)
            start = end
        if full:
            result.append(Job.objects.using(using).get(pk=prepared[0][0][0]))
    if not full:
        watched = _watched()
        for row, options, args in prepared:
            result.append(_bulk_job(using, row[0], row[1], args, options, watched, statuses[row[0]]))
    senders = list(sender) if isinstance(sender, Sequence) else [sender] * len(result)
    for job, job_sender in zip(result, senders, strict=True):
        job_enqueued.send(sender=job_sender, job=job)
    return result
