"""Jobs for the pooler tests."""

from axa_django import background_job  # noqa: F401
