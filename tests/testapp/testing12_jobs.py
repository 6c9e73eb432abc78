"""Jobs for the testing12 tests."""

from axa_django import background_job  # noqa: F401
