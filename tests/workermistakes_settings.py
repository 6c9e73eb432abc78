"""tests.settings with a project's own LOGGING, as runworker meets it in a real site."""

import os

from tests.settings import *  # noqa: F403

_CONSOLE = {"class": "logging.StreamHandler", "stream": "ext://sys.stdout"}
if os.environ.get("AXA_TEST_LOGGING") == "root":
    # Everything goes through one root handler.
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"console": _CONSOLE},
        "root": {"handlers": ["console"], "level": "INFO"},
    }
else:
    # The project configures its own loggers only, nothing for the root or axa_django.
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"console": _CONSOLE},
        "loggers": {"tests.testapp": {"handlers": ["console"], "level": "INFO"}},
    }
