"""The test settings plus what the docs tell a project to write: a worker subprocess of the docs' tests."""

from tests import docs_examples
from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.docsapp"]

# docs/deployment.md's LOGGING, exactly as the page shows it.
_logging = next(block for block in docs_examples.page_blocks("docs/deployment.md") if block.key == "LOGGING = {")
exec(_logging.compiled())
