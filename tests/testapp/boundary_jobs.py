"""Jobs for the boundary tests."""

from typing import Any

from axa_django import background_job


@background_job
def returns(value: Any) -> Any:
    """Return what it was given, so a test controls the result."""
    return value


@background_job
def returns_nul() -> str:
    return "before\x00after"


@background_job(unique=lambda key: key)
def keyed(key: str) -> str:
    """Unique by its argument, so a test controls the unique key."""
    return key
