"""Jobs for the admin tests."""

from axa_django import background_job  # noqa: F401
