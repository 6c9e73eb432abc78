"""Jobs for the boundary tests."""

from axa_django import background_job  # noqa: F401
