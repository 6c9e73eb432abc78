"""Jobs for the housekeeping tests."""

from axa_django import background_job  # noqa: F401
