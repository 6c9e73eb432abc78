"""Writing job rows: one INSERT per call, one per batch (COPY or one INSERT), in the caller's transaction."""

from __future__ import annotations

import contextlib
import functools
import itertools
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import psycopg
from django.db import connections, transaction

from .. import conf
from ..exceptions import DuplicateJob
from ..ids import uuid7s
from ..models import Job
from ..signals import job_enqueued
from .children import write_children
from .encoding import (
    _COLUMNS,
    _FROM_JSON,
    _ON_UNIQUE,
    _RUN_AT,
    BulkResult,
    Item,
    Sender,
    _args_text,
    _as_json,
    _build,
    _bulk_job,
    _cursor,
    _encoded,
    _params,
    _watched,
)
from .options import Options

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
