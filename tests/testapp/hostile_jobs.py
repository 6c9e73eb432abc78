"""Jobs for the hostile tests."""

from axa_django import background_job  # noqa: F401
