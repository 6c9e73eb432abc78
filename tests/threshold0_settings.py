"""tests.settings with every statement prepared at its first run (prepare_threshold 0): the pooler check's tests."""

from tests.settings import *  # noqa: F403

DATABASES["default"]["OPTIONS"]["prepare_threshold"] = 0  # noqa: F405
