"""Checks built from a job's type annotations: a value of the wrong type is refused at enqueue, saying where."""

from __future__ import annotations

import difflib
import inspect
import types
import typing
from collections.abc import Callable, Hashable
from typing import Any

# Where a value fails its annotation: (path of keys and indexes inside it, what is wrong there).
Mismatch = tuple[tuple[Any, ...], str]
# Checks one plain JSON value (check_json has run); None when it fits.
Check = Callable[[Any], Mismatch | None]
# How long a wrong value may be when shown in the error.
SHOWN = 60


def _text(annotation: Any) -> str:
    """An annotation in words: ``int``, ``list[int]``, ``int | None``, ``Line`` (a TypedDict)."""
    if annotation is None or annotation is type(None):
        return "None"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(map(_text, args))
    if origin is not None and args:
        return f"{_text(origin)}[{', '.join(map(_text, args))}]"
    name = getattr(annotation, "__name__", None)
    return name if isinstance(name, str) else repr(annotation).replace("typing.", "")


def _found(value: Any) -> str:
    """A wrong value in words: ``str 'abc'``, ``bool True``, ``None``."""
    if value is None:
        return "None"
    shown = repr(value)
    if len(shown) > SHOWN:
        shown = shown[: SHOWN - 3] + "..."
    return f"{type(value).__name__} {shown}"


def _wrong(expected: str, value: Any) -> Mismatch:
    hint = "; bool is not accepted as a number" if type(value) is bool and expected in ("int", "float") else ""
    return (), f"must be {expected}, not {_found(value)}{hint}"


def _exact(kind: type, expected: str) -> Check:
    def check(value: Any) -> Mismatch | None:
        return None if type(value) is kind else _wrong(expected, value)

    return check


def _number(value: Any) -> Mismatch | None:
    # int is accepted for float (PEP 484's numeric tower): 2 stays 2 through JSON.
    kind = type(value)
    return None if kind is float or kind is int else _wrong("float", value)


def _none(value: Any) -> Mismatch | None:
    return None if value is None else _wrong("None", value)


_SIMPLE: dict[Any, Check] = {
    int: _exact(int, "int"),
    str: _exact(str, "str"),
    bool: _exact(bool, "bool"),
    float: _number,
    None: _none,
    type(None): _none,
}


def _list_of(item: Check | None, expected: str) -> Check:
    def check(value: Any) -> Mismatch | None:
        if type(value) is not list:
            return _wrong(expected, value)
        if item is not None:
            for index, child in enumerate(value):
                found = item(child)
                if found is not None:
                    return (index, *found[0]), found[1]
        return None

    return check


def _dict_of(item: Check | None, expected: str) -> Check:
    # Keys are str by then (check_json): a key annotation other than str is left alone.
    def check(value: Any) -> Mismatch | None:
        if type(value) is not dict:
            return _wrong(expected, value)
        if item is not None:
            for key, child in value.items():
                found = item(child)
                if found is not None:
                    return (key, *found[0]), found[1]
        return None

    return check


def _union(members: list[Check], expected: str) -> Check:
    def check(value: Any) -> Mismatch | None:
        for member in members:
            if member(value) is None:
                return None
        if len(members) == 2 and value is not None and _none in members:
            # Optional[X] and a value of X's kind wrong inside: X says where.
            found = next(member for member in members if member is not _none)(value)
            if found is not None and (found[0] or not found[1].startswith("must be ")):
                return found
        return _wrong(expected, value)

    return check


def _literal(allowed: tuple[Any, ...], expected: str) -> Check:
    def check(value: Any) -> Mismatch | None:
        # By type too: True == 1, but Literal[1] does not take True.
        return None if any(type(value) is type(a) and value == a for a in allowed) else _wrong(expected, value)

    return check


def _typed_dict(kind: Any, seen: frozenset[int]) -> Check | None:
    try:
        hints = typing.get_type_hints(kind, include_extras=True)
    except Exception:  # noqa: BLE001 - an unresolvable TypedDict is left alone
        return None
    fields = {key: _compile(hint, seen | {id(kind)}) for key, hint in hints.items()}
    # Read the markers too: with string annotations Python 3.11 counts NotRequired keys as required.
    marked = {key: typing.get_origin(hint) for key, hint in hints.items()}
    required = sorted(
        key
        for key in hints
        if marked[key] is typing.Required or (key in kind.__required_keys__ and marked[key] is not typing.NotRequired)
    )
    name = kind.__name__

    def check(value: Any) -> Mismatch | None:
        if type(value) is not dict:
            return _wrong(name, value)
        for key in required:
            if key not in value:
                return (), f"is missing the key {key!r}, which {name} requires"
        for key, child in value.items():
            if key not in fields:
                close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
                guess = f" (did you mean {close[0]!r}?)" if close else ""
                return (), f"has the key {key!r}, which {name} does not declare{guess}"
            field = fields[key]
            found = field(child) if field is not None else None
            if found is not None:
                return (key, *found[0]), found[1]
        return None

    return check


def _compile(annotation: Any, seen: frozenset[int] = frozenset()) -> Check | None:
    """A check for ``annotation``; None when any value passes or the annotation is not one we check."""
    simple = _SIMPLE.get(annotation) if isinstance(annotation, Hashable) else None
    if simple is not None:
        return simple
    supertype = getattr(annotation, "__supertype__", None)  # NewType("UserId", int)
    if supertype is not None:
        return _compile(supertype, seen)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated or origin is typing.Required or origin is typing.NotRequired:
        return _compile(args[0], seen)
    if origin is typing.Union or origin is types.UnionType:
        members = [_compile(arg, seen) for arg in args]
        if any(member is None for member in members):
            return None  # a member that takes anything (Any) or that we do not check
        return _union(typing.cast(list[Check], members), _text(annotation))
    if origin is typing.Literal:
        if all(type(arg) in (str, int, bool) or arg is None for arg in args):
            return _literal(args, " or ".join(map(repr, args)) if len(args) > 1 else repr(args[0]))
        return None
    if annotation is list or origin is list:
        return _list_of(_compile(args[0], seen) if args else None, _text(annotation))
    if annotation is dict or origin is dict:
        return _dict_of(_compile(args[1], seen) if len(args) == 2 else None, _text(annotation))
    if typing.is_typeddict(annotation) and id(annotation) not in seen:
        return _typed_dict(annotation, seen)
    return None  # Any, object, classes, tuples, TypeVars...: left alone


def _hints(func: Callable[..., Any], signature: inspect.Signature) -> dict[str, Any]:
    """The parameters' annotations, strings resolved (``from __future__ import annotations``).

    One that cannot be resolved (a name imported under TYPE_CHECKING) is left out, not the others.
    """
    try:
        return typing.get_type_hints(func)
    except Exception:  # noqa: BLE001 - resolved one by one below
        pass
    hints = {}
    namespace = getattr(inspect.unwrap(func), "__globals__", {})
    for parameter in signature.parameters.values():
        annotation = parameter.annotation
        if annotation is parameter.empty:
            continue
        holder = types.SimpleNamespace(__annotations__={parameter.name: annotation})
        try:
            hints[parameter.name] = typing.get_type_hints(holder, globalns=namespace)[parameter.name]
        except Exception:  # noqa: BLE001 - unresolvable: no check for this one
            continue
    return hints


def type_checks(func: Callable[..., Any], signature: inspect.Signature) -> tuple[tuple[str, Check], ...]:
    """(parameter, check) for each parameter of ``signature`` whose annotation we can check.

    A parameter whose default is None also takes None; ``*args: int`` checks each item,
    ``**kwargs: int`` each value.
    """
    hints = _hints(func, signature)
    checks = []
    for parameter in signature.parameters.values():
        if parameter.name not in hints:
            continue
        try:
            check = _compile(hints[parameter.name])
        except Exception:  # noqa: BLE001 - an annotation we cannot read is left alone
            continue
        if check is None:
            continue
        if parameter.default is None and check(None) is not None:
            check = _union([check, _none], f"{_text(hints[parameter.name])} or None")
        if parameter.kind is parameter.VAR_POSITIONAL:
            check = _list_of(check, "list")
        elif parameter.kind is parameter.VAR_KEYWORD:
            check = _dict_of(check, "dict")
        checks.append((parameter.name, check))
    return tuple(checks)
