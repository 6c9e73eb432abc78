"""Binding call arguments to a job's signature and checking they are strict JSON (their types: ``annotations``)."""

from __future__ import annotations

import difflib
import inspect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..exceptions import ArgumentsMismatch
from .annotations import Check, type_checks

# The deepest nesting of lists and dicts a value may have: deeper input would exhaust
# Python's recursion (json, Django's normalize_json) long before PostgreSQL's limit.
MAX_DEPTH = 200

_SCALARS = (str, int, bool, type(None))
# Values that need no look inside a container unless checking what PostgreSQL can store.
_FAST = frozenset(_SCALARS)
# Non-str keys whose repr an error message may show (the standard library's own).
_SHOWN_KEYS = frozenset({int, float, bool, type(None), bytes, complex})

# Names a place inside a value from its path of keys and indexes.
Describe = Callable[[Sequence[Any]], str]
# A place inside a value, kept as a linked (parent, key) pair so the hot path builds no strings.
_Link = tuple[Any, Any] | None


def _path(link: _Link) -> list[Any]:
    keys: list[Any] = []
    while link is not None:
        link, key = link
        keys.append(key)
    keys.reverse()
    return keys


def _suffix(path: Sequence[Any]) -> str:
    return "".join(f"[{key!r}]" for key in path)


def described(where: str | Describe) -> Describe:
    """``where`` as a Describe: a str names the value, and keys and indexes follow in brackets."""
    if callable(where):
        return where
    return lambda path: where + _suffix(path)


def arguments_of(job: str) -> Describe:
    """Name places in a job's args object: ``argument 'x' of job 'j'['k']``."""

    def describe(path: Sequence[Any]) -> str:
        if not path:
            return f"the arguments of job {job!r}"
        return f"argument {path[0]!r} of job {job!r}{_suffix(path[1:])}"

    return describe


def task_arguments_of(task: str) -> Describe:
    """Name places in a task row's ``{"args": [...], "kwargs": {...}}``: ``argument 0 of task 't'``."""

    def describe(path: Sequence[Any]) -> str:
        if len(path) < 2:
            return f"the arguments of task {task!r}{_suffix(path)}"
        return f"argument {path[1]!r} of task {task!r}{_suffix(path[2:])}"

    return describe


def _text_problem(text: str) -> str | None:
    """Why PostgreSQL cannot store ``text``, or None."""
    if "\x00" in text:
        return "contains a NUL character (\\x00), which PostgreSQL cannot store in jsonb or text; remove it"
    try:
        text.encode()
    except UnicodeEncodeError as error:
        return (
            f"contains the lone surrogate {text[error.start]!r}, which is not valid Unicode and cannot be "
            "sent to PostgreSQL; pass the text decoded properly (e.g. with errors='replace')"
        )
    return None


class _NotJson(TypeError):
    """_problem's mark for a value of a type JSON lacks; raised as a TypeError beginning with Django's
    words for it (``Unsupported type: <class '...'>``, normalize_json's), which django.tasks code looks for."""


_DJANGOS = "Unsupported type: "


def _problem(value: Any, levels: int, storable: bool) -> tuple[type[Exception], _Link, str] | None:
    """The first place where ``value`` is not strict JSON: (error type, place, what is wrong).

    Iterative, so no input can exhaust recursion. ``levels``: how many levels of
    containers wrap the values the depth limit applies to (1 for an args object).
    ``storable``: also look for what JSON holds but PostgreSQL cannot (NUL, lone
    surrogates, integers Python will not print).
    """
    # Scalars inside a container are settled in place; only what needs a closer look
    # (containers, floats, anything else) goes on the stack with its place.
    settled = _FAST if not storable else ()
    stack: list[tuple[Any, _Link, int]] = [(value, None, -levels)]
    while stack:
        item, link, depth = stack.pop()
        kind = type(item)
        if kind is list or kind is dict:
            if depth >= MAX_DEPTH:
                # Name the outermost value the limit applies to, not a path 200 keys long.
                for _ in range(depth):
                    link = link[0] if link is not None else None
                return ValueError, link, _too_deep()
            pending = []
            if kind is list:
                for index, child in enumerate(item):
                    if type(child) not in settled:
                        pending.append((child, (link, index), depth + 1))
            else:
                for key, child in item.items():
                    if type(key) is not str:
                        # repr runs the key's own code: said only for the types whose repr is ours.
                        said = f"{key!r} " if type(key) in _SHOWN_KEYS else ""
                        return (
                            TypeError,
                            link,
                            f"has the key {said}of type {type(key).__name__}; JSON object keys must be str.",
                        )
                    if storable and (reason := _text_problem(key)) is not None:
                        return ValueError, link, f"has the key {key!r}, which {reason}"
                    if type(child) not in settled:
                        pending.append((child, (link, key), depth + 1))
            pending.reverse()  # report the first problem in document order
            stack.extend(pending)
            continue
        if kind is str:
            if storable and (reason := _text_problem(item)) is not None:
                return ValueError, link, reason
            continue
        if kind is int:
            if storable:
                try:
                    str(item)
                except ValueError as error:
                    return ValueError, link, f"is an integer too large for JSON ({error}); pass it as a str"
            continue
        if kind in _SCALARS:
            continue
        if kind is float:
            if not math.isfinite(item):
                return ValueError, link, f"is {item!r}, which JSON cannot hold; pass a finite number or None."
            continue
        return _NotJson, link, f"is {_describe(item)}, which is not JSON; {_hint(item)}"
    return None


def _too_deep() -> str:
    return (
        f"nests lists/dicts more than {MAX_DEPTH} levels deep (the limit, axa_django.arguments.MAX_DEPTH); "
        "flatten it, or store it elsewhere and pass its key."
    )


def _raise(value: Any, where: str | Describe, levels: int, storable: bool) -> None:
    found = _problem(value, levels, storable)
    if found is not None:
        error, link, message = found
        path = _path(link)
        place = described(where)(path)
        if error is _NotJson:
            item = value
            for key in path:  # plain lists and dicts all the way down: _problem walked them
                item = item[key]
            raise TypeError(f"{_DJANGOS}{type(item)}: {place} {message}")
        raise error(f"{place} {message}")


def of_item(error: TypeError | ValueError, index: int) -> TypeError | ValueError:
    """``error`` said of item ``index`` of a batch (``item 3: ...``), after Django's words when it begins with them."""
    text = str(error)
    lead, rest = "", text
    if text.startswith(_DJANGOS) and "'>: " in text:
        lead, _, rest = text.partition("'>: ")
        lead += "'>: "
    return type(error)(f"{lead}item {index}: {rest}")


def check_json(value: Any, where: str | Describe, *, levels: int = 0) -> None:
    """Raise TypeError/ValueError unless ``value`` survives a JSON round trip unchanged."""
    _raise(value, where, levels, storable=False)


def _describe(value: Any) -> str:
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"a {name}"


def _hint(value: Any) -> str:
    # Read from the type alone: a lazy object (request.user) asked for an attribute or its
    # __class__ loads itself, a query on a connection a bulk COPY may be holding.
    kind = type(value)
    if issubclass(kind, bytes | bytearray | memoryview):
        return "decode it to str (or base64) first."
    if issubclass(kind, tuple):
        return "pass a list (a tuple comes back as a list)."
    if issubclass(kind, set | frozenset):
        return "pass a sorted list."
    if hasattr(kind, "isoformat"):
        return "pass value.isoformat() and parse it in the job."
    if hasattr(kind, "pk"):
        return "pass its primary key and load it in the job."
    return "pass str, int, float, bool, None, list or dict with str keys."


# One encoder for every call: json.dumps with options builds a new one each time.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def encode(value: Any, where: str | Describe, limit: int, *, levels: int = 0, checked: bool = False) -> str:
    """Check ``value`` and return its JSON text, refusing anything over ``limit`` bytes.

    Also refuses what PostgreSQL cannot store (NUL, lone surrogates): ValueError naming
    the place, before any SQL is sent. ``checked``: ``value`` passed ``check_json`` at
    these ``levels`` already (``bind`` and ``check_kwargs`` did), so it is not walked again.
    """
    if not checked:
        check_json(value, where, levels=levels)
    try:
        text = _ENCODER.encode(value)
    except ValueError:
        # An integer over Python's str conversion limit; name it.
        _raise(value, where, levels, storable=True)
        raise
    # The text is made anyway: look for trouble in it, and walk the value only when
    # there is some, to name the place (a literal backslash-u0000 is a false alarm).
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        _raise(value, where, levels, storable=True)
        raise
    if "\\u0000" in text:
        _raise(value, where, levels, storable=True)
    if size > limit:
        raise ValueError(
            f"{described(where)(())}: {size} bytes as JSON, over the limit of {limit} "
            "(AXA_DJANGO['MAX_ARGS_BYTES']); store large data elsewhere and pass its key."
        )
    return text


# -- type checks: a value against a parameter's annotation -----------------------


@dataclass(frozen=True)
class _Shape:
    """A signature whose every parameter can be passed by name: binding it needs no ``Signature.bind``."""

    names: tuple[str, ...]
    known: frozenset[str]
    positional: tuple[str, ...]
    required: frozenset[str]


_BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


@dataclass(frozen=True)
class _Prepared:
    """What binding a signature needs, worked out once: its shape and its parameters' type checks."""

    shape: _Shape | None
    checks: tuple[tuple[str, Check], ...] = ()


# id(signature) -> (signature, what binding it needs); the signature is kept so its id stays its own.
_PREPARED: dict[int, tuple[inspect.Signature, _Prepared]] = {}


def _shape_of(signature: inspect.Signature) -> _Shape | None:
    parameters = list(signature.parameters.values())
    if not all(p.kind in _BY_NAME for p in parameters):
        return None
    return _Shape(
        names=tuple(p.name for p in parameters),
        known=frozenset(p.name for p in parameters),
        positional=tuple(p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD),
        required=frozenset(p.name for p in parameters if p.default is inspect.Parameter.empty),
    )


def prepare(signature: inspect.Signature, func: Callable[..., Any]) -> None:
    """Work out once how to bind calls to ``signature`` (``func``'s) and check them against its annotations."""
    _PREPARED[id(signature)] = (signature, _Prepared(_shape_of(signature), type_checks(func, signature)))


def _prepared(signature: inspect.Signature) -> _Prepared:
    entry = _PREPARED.get(id(signature))
    if entry is None or entry[0] is not signature:
        # Not prepared (not a registered job's): bound by shape alone, no type checks.
        entry = _PREPARED[id(signature)] = (signature, _Prepared(_shape_of(signature)))
    return entry[1]


def _shape(signature: inspect.Signature) -> _Shape | None:
    """``signature``'s shape, worked out once; None if it has *args, **kwargs or positional-only parameters."""
    return _prepared(signature).shape


def _bind_by_name(shape: _Shape, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The args object of a call that fits ``shape``; None if it does not (Signature.bind then says why)."""
    if len(args) > len(shape.positional):
        return None
    bound = dict(zip(shape.positional, args, strict=False))
    for key in kwargs:
        if key in bound or key not in shape.known:
            return None
    bound.update(kwargs)
    if not shape.required.issubset(bound):
        return None
    return {name: bound[name] for name in shape.names if name in bound}


def misspelt_keywords(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[list[str], str] | None:
    """The keywords of ``kwargs`` that ``signature`` lacks, each said with the parameter it was likely
    meant as (``'usr_id' (did you mean 'user_id'?)``), and what it takes; None when there is none."""
    parameters = signature.parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return None
    unknown = [key for key in kwargs if key not in parameters]
    if not unknown:
        return None
    by_name = [p.name for p in parameters.values() if p.kind in _BY_NAME]
    positional = [p.name for p in parameters.values() if p.kind is not p.KEYWORD_ONLY][: len(args)]
    # Parameters not given yet are the likelier meaning of a misspelt name.
    open_names = [n for n in by_name if n not in kwargs and n not in positional]
    said = []
    for key in unknown:
        guesses = difflib.get_close_matches(key, open_names, n=1, cutoff=0.6) or difflib.get_close_matches(
            key, by_name, n=1, cutoff=0.6
        )
        said.append(f"{key!r} (did you mean {guesses[0]!r}?)" if guesses else repr(key))
    return said, f"its parameters are {', '.join(by_name)}" if by_name else "it takes no arguments by name"


def _unexpected(signature: inspect.Signature, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why ``kwargs`` name parameters ``signature`` lacks, with the closest names; None if none do.

    Said before Signature.bind, which would report the parameter a misspelt name left
    missing ("missing 'order_id'") rather than the misspelling.
    """
    found = misspelt_keywords(signature, args, kwargs)
    if found is None:
        return None
    said, takes = found
    return f"job {name!r}: unexpected argument{'s' if len(said) > 1 else ''} {', '.join(said)}; {takes}"


def bind(signature: inspect.Signature, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Bind a call to ``signature`` and return the args object (parameter name -> value).

    Raises TypeError for a call that does not fit, a value that is not strict JSON, or
    one that does not match the parameter's annotation (when ``prepare`` saw the function).
    """
    prepared = _prepared(signature)
    shape = prepared.shape
    arguments = _bind_by_name(shape, args, kwargs) if shape is not None else None
    if arguments is None:
        unexpected = _unexpected(signature, name, args, kwargs)
        if unexpected is not None:
            raise TypeError(unexpected)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"job {name!r}: {error}") from None
        arguments = dict(bound.arguments)
        for parameter in signature.parameters.values():
            if parameter.kind is parameter.VAR_POSITIONAL and parameter.name in arguments:
                # *args binds as a tuple; it is stored as a JSON array, which prepare_call spreads.
                arguments[parameter.name] = list(arguments[parameter.name])
    check_json(arguments, arguments_of(name), levels=1)
    # After check_json: every value is a plain JSON type, as the job will receive it.
    for parameter, check in prepared.checks:
        if parameter in arguments:
            found = check(arguments[parameter])
            if found is not None:
                path, wrong = found
                raise TypeError(f"{arguments_of(name)((parameter, *path))} {wrong}")
    return arguments


def check_kwargs(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Check keyword arguments for a job known only by name."""
    check_json(kwargs, arguments_of(name), levels=1)
    return kwargs


def prepare_call(signature: inspect.Signature, stored: Any) -> tuple[list[Any], dict[str, Any]]:
    """Turn an args object read from a row into (args, kwargs) for ``signature``."""
    if type(stored) is not dict:
        raise ArgumentsMismatch(f"args must be a JSON object of parameter name -> value, not {type(stored).__name__}")
    shape = _shape(signature)
    if shape is not None and shape.known.issuperset(stored) and shape.required.issubset(stored):
        return [], dict(stored)  # every parameter can be passed by name
    unknown = set(stored) - set(signature.parameters)
    if unknown:
        raise ArgumentsMismatch(f"unexpected argument(s) {', '.join(sorted(map(repr, unknown)))}")
    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    # Positional slots fill in order until the first one the row leaves out.
    in_order = True
    for parameter in signature.parameters.values():
        if parameter.name not in stored:
            in_order = in_order and parameter.kind is parameter.VAR_KEYWORD
            continue
        value = stored[parameter.name]
        if parameter.kind is parameter.VAR_POSITIONAL:
            if type(value) is not list:
                raise ArgumentsMismatch(f"argument {parameter.name!r} must be a JSON array")
            positional.extend(value)
        elif parameter.kind is parameter.VAR_KEYWORD:
            if type(value) is not dict:
                raise ArgumentsMismatch(f"argument {parameter.name!r} must be a JSON object")
            keywords.update(value)
        elif parameter.kind is parameter.POSITIONAL_ONLY or (
            in_order and parameter.kind is parameter.POSITIONAL_OR_KEYWORD
        ):
            positional.append(value)
        else:
            keywords[parameter.name] = value
    try:
        signature.bind(*positional, **keywords)
    except TypeError as error:
        raise ArgumentsMismatch(str(error)) from None
    return positional, keywords
