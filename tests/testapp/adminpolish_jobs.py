"""Jobs for the adminpolish tests."""

from axa_django import background_job  # noqa: F401
