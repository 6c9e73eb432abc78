"""Binding call arguments to a job's signature and checking they are strict JSON."""

from __future__ import annotations

import inspect
import json
import math
from typing import Any

_SCALARS = (str, int, bool, type(None))


def check_json(value: Any, where: str) -> None:
    """Raise TypeError/ValueError unless ``value`` survives a JSON round trip unchanged."""
    kind = type(value)
    if kind in _SCALARS:
        return
    if kind is float:
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value!r}, which JSON cannot hold; pass a finite number or None.")
        return
    if kind is list:
        for index, item in enumerate(value):
            check_json(item, f"{where}[{index}]")
        return
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise TypeError(
                    f"{where} has the key {key!r} of type {type(key).__name__}; JSON object keys must be str."
                )
            check_json(item, f"{where}[{key!r}]")
        return
    raise TypeError(f"{where} is {_describe(value)}, which is not JSON; {_hint(value)}")


def _describe(value: Any) -> str:
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"a {name}"


def _hint(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return "decode it to str (or base64) first."
    if isinstance(value, tuple):
        return "pass a list (a tuple comes back as a list)."
    if isinstance(value, set | frozenset):
        return "pass a sorted list."
    if hasattr(value, "isoformat"):
        return "pass value.isoformat() and parse it in the job."
    if hasattr(value, "pk"):
        return "pass its primary key and load it in the job."
    return "pass str, int, float, bool, None, list or dict with str keys."


def encode(value: Any, where: str, limit: int) -> str:
    """Check ``value`` and return its JSON text, refusing anything over ``limit`` bytes."""
    check_json(value, where)
    text = json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    size = len(text.encode())
    if size > limit:
        raise ValueError(
            f"{where}: {size} bytes as JSON, over the limit of {limit} "
            "(AXA_DJANGO['MAX_ARGS_BYTES']); store large data elsewhere and pass its key."
        )
    return text


def bind(signature: inspect.Signature, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Bind a call to ``signature`` and return the args object (parameter name -> value)."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as error:
        raise TypeError(f"job {name!r}: {error}") from None
    for parameter, value in bound.arguments.items():
        check_json(value, f"argument {parameter!r} of job {name!r}")
    return dict(bound.arguments)


def check_kwargs(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Check keyword arguments for a job known only by name."""
    for parameter, value in kwargs.items():
        check_json(value, f"argument {parameter!r} of job {name!r}")
    return kwargs


class ArgumentsMismatch(TypeError):
    """A row's args do not fit its job's signature; running it again cannot help."""


def prepare_call(signature: inspect.Signature, stored: Any) -> tuple[list[Any], dict[str, Any]]:
    """Turn an args object read from a row into (args, kwargs) for ``signature``."""
    if type(stored) is not dict:
        raise ArgumentsMismatch(f"args must be a JSON object of parameter name -> value, not {type(stored).__name__}")
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
