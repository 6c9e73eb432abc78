"""Periodic jobs of the periodic jobs page's tests; imported by jobs.py only when AXA_TEST_CONSOLE_CRON is set."""

from axa_django import background_job


@background_job(name="tests.console.kept", cron="* * * * * *")
def kept() -> str:
    return "kept"


@background_job(name="tests.console.switched_off", cron="* * * * * *")
def switched_off() -> str:
    return "switched off"
