"""Jobs for the workermistakes tests."""

from axa_django import background_job  # noqa: F401
