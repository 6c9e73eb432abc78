"""What every writer of job rows shares: a row's values in column order, its JSON form for
the batch statements, the cursor that names a missing table's fix, and the Jobs handed back."""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
from django.db import ProgrammingError, connections
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

from .. import conf
from ..arguments import arguments_of, encode, task_arguments_of
from ..exceptions import QueueTableMissing
from ..ids import uuid7, uuid7s
from ..models import Job
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

    Only for one of the package's own tables (axa_*, which the message names in any
    language), missing to the statement itself: a table missing to a user's trigger or
    function on axa_queue (diag.context says where it was raised) is the user's, left as it is.

    The failed statement has aborted the caller's transaction, if any: nothing more is
    sent, the error is only said again, as a ProgrammingError still, chained from it.
    """
    try:
        yield
    except ProgrammingError as error:
        cause = error.__cause__
        if (
            not isinstance(cause, psycopg.errors.UndefinedTable)
            or cause.diag.context
            or "axa_" not in (cause.diag.message_primary or "")
        ):
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
