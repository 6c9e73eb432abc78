"""Periodic jobs for the cron tests; imported by jobs.py only when AXA_TEST_CRON is set."""

from axa_django import background_job


@background_job(name="tests.every_second", cron="* * * * * *")
def every_second() -> str:
    """Croniter's 6-field form: the sixth field is seconds."""
    return "tick"
