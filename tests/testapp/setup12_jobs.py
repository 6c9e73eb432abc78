"""Jobs for the setup12 tests."""

from axa_django import background_job


@background_job
def spread(first: int, *rest: int, scale: int = 1, **named: int) -> dict:
    """Every kind of parameter: the worker must spread *rest and **named back out."""
    return {"sum": (first + sum(rest)) * scale, "named": named}


@background_job
def only_args(*args: object) -> list:
    return list(args)


@background_job(max_attempts=2, backoff=lambda attempt: -100.0)
def negative_backoff() -> None:
    """Fails every time; its backoff asks for a retry in the past."""
    raise RuntimeError("fails on purpose")
