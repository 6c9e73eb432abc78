"""Jobs for the workermistakes tests."""

import logging

from axa_django import background_job


@background_job
def chatty(token: str) -> str:
    """Log one line on a project logger, as a project's own job would."""
    logging.getLogger("tests.testapp.chatty").warning("hello from the job %s", token)
    return token
