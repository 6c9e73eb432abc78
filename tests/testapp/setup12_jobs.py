"""Jobs for the setup12 tests."""

from axa_django import background_job  # noqa: F401
