"""The job lists' search syntax: ``name:``, ``queue:``, ``status:``, ``args.key:``, ``error:``, ``after:``, ``before:``.

A query is checked whole before any SQL is built from it: a malformed one raises
``SearchError`` with a sentence for the page. Words without a field are the text
search the lists always had (an id, an id's start, or text in name, args or error).
"""

from __future__ import annotations

import datetime
import json
import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from ..models import Job

FIELDS = ("name", "queue", "status", "args", "error", "after", "before")
# What a field looks like before its colon: wide enough to name a mistake (args.1x, Name).
FIELD = re.compile(r"[A-Za-z_][^\s:\"]*")
KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
SCALARS: dict[str, Any] = {"true": True, "false": False, "null": None}
EXAMPLES = {
    "name": "name:app.jobs.send_email",
    "queue": "queue:mail",
    "status": "status:failed",
    "error": "error:timeout",
    "after": "after:2026-12-01",
    "before": "before:2026-12-06T10:00",
}


class SearchError(ValueError):
    """A search the lists cannot run, with what to write instead."""


@dataclass
class Search:
    """A parsed query: the fields' filter, the remaining text, and which forms it uses."""

    filters: Q = field(default_factory=Q)
    text: str = ""
    # Forms used, for the "reads every row" note: "args", "error", "text".
    forms: set[str] = field(default_factory=set)


@dataclass
class Token:
    """One word of a query: its text with quotes removed, and where its first quote began (-1: none)."""

    text: str
    quoted_from: int


def tokens(query: str) -> list[Token]:
    """Split on spaces outside double quotes; inside them ``\\"`` and ``\\\\`` stand for ``"`` and ``\\``."""
    found: list[Token] = []
    i, n = 0, len(query)
    while i < n:
        if query[i].isspace():
            i += 1
            continue
        text: list[str] = []
        quoted_from = -1
        while i < n and not query[i].isspace():
            if query[i] != '"':
                text.append(query[i])
                i += 1
                continue
            if quoted_from < 0:
                quoted_from = len("".join(text))
            start = i
            i += 1
            while i < n and query[i] != '"':
                if query[i] == "\\" and i + 1 < n and query[i + 1] in '"\\':
                    i += 1
                text.append(query[i])
                i += 1
            if i >= n:
                raise SearchError(f'A quote opened at {query[start : start + 20]!r} is never closed; close it with ".')
            i += 1
        found.append(Token("".join(text), quoted_from))
    return found


def parse(query: str, time_field: str = "created_at") -> Search:
    """Read ``query``; ``after:``/``before:`` bound ``time_field``. Raise SearchError when malformed."""
    if "\x00" in query:
        raise SearchError("The search holds a NUL character (%00); no job can match it.")
    search = Search()
    words = []
    plain = True
    for token in tokens(query):
        head, colon, value = token.text.partition(":")
        is_field = colon and FIELD.fullmatch(head) and (token.quoted_from < 0 or token.quoted_from > len(head))
        if not is_field:
            words.append(token.text)
            plain = plain and token.quoted_from < 0
            continue
        plain = False
        search.filters &= _term(head, value, token.quoted_from >= 0, time_field, search)
    # No field and no quote: the text exactly as typed, as the search always took it.
    search.text = query.strip() if plain and words else " ".join(words)
    if search.text:
        search.forms.add("text")
    return search


def _term(head: str, value: str, quoted: bool, time_field: str, search: Search) -> Q:
    name, _, path = head.partition(".")
    name = name.lower()
    if name not in FIELDS:
        raise SearchError(
            f"Unknown field {head!r}: the fields are {', '.join(FIELDS)} (args.key); "
            f'to search for text with a colon, put it in quotes ("{head}:{value}").'
        )
    if name == "args":
        if not path:
            raise SearchError(f"args needs a key, as in args.user_id:42 (not {head}:{value}).")
        keys = path.split(".")
        for key in keys:
            if not KEY.fullmatch(key):
                raise SearchError(
                    f"{key!r} in {head!r} is not a key the search takes: keys are letters, digits and _, "
                    "not starting with a digit (args.user_id, args.order.id)."
                )
        search.forms.add("args")
        contained: Any = _scalar(value, quoted, head)
        for key in reversed(keys):
            contained = {key: contained}
        return Q(args__contains=contained)
    if path:
        raise SearchError(f"{name}: takes no key ({head!r}); only args does, as in args.user_id:42.")
    if not value and not quoted:
        raise SearchError(f"{name}: needs a value, as in {EXAMPLES[name]}.")
    if name == "name":
        return Q(name=value)
    if name == "queue":
        return Q(queue=value)
    if name == "status":
        if value.lower() not in Job.Status.values:
            raise SearchError(f"Unknown status {value!r}: the statuses are {', '.join(Job.Status.values)}.")
        return Q(status=value.lower())
    if name == "error":
        search.forms.add("error")
        return Q(error__icontains=value)
    moment = _time(name, value)
    return Q(**{f"{time_field}__gte" if name == "after" else f"{time_field}__lt": moment})


def _scalar(value: str, quoted: bool, head: str) -> Any:
    """A JSON scalar: quoted text is a string; a number, true, false or null is itself; else a string."""
    if quoted:
        return value
    if value in SCALARS:
        return SCALARS[value]
    if NUMBER.fullmatch(value):
        try:
            number = json.loads(value)
        except ValueError:  # an integer past Python's digit limit (sys.set_int_max_str_digits)
            raise SearchError(
                f"{_cut(value)} in {head}: is a number of {len(value.lstrip('-')):,} digits, more than "
                f"{sys.get_int_max_str_digits():,}, too long to search; quote it to search for the text."
            ) from None
        if isinstance(number, float) and not math.isfinite(number):
            raise SearchError(
                f"{_cut(value)} in {head}: is too large a number for JSON; quote it to search for the text."
            )
        return number
    if not value:
        raise SearchError(f'{head}: needs a value, as in {head}:42 or {head}:"text" ("" for the empty string).')
    return value


def _time(name: str, value: str) -> datetime.datetime:
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise SearchError(
            f"{name}: takes a date or a time, as in {name}:2026-12-01 or {name}:2026-12-06T10:00 (not {value!r})."
        ) from None
    # A time without an offset is in the site's time zone, as the lists show times.
    try:
        if settings.USE_TZ and timezone.is_naive(moment):
            return timezone.make_aware(moment)
        if not settings.USE_TZ and timezone.is_aware(moment):
            return timezone.make_naive(moment)
    except OverflowError:  # moved to the site's time zone, past year 1 or 9999
        raise SearchError(
            f"{name}:{value} falls outside the years 1 to 9999 in the site's time zone ({settings.TIME_ZONE}); "
            f"give a time inside them, as in {EXAMPLES[name]}."
        ) from None
    return moment


def _cut(value: str) -> str:
    """A long value as a message shows it: its start and its length."""
    return value if len(value) <= 24 else f"{value[:20]}... ({len(value)} characters)"
