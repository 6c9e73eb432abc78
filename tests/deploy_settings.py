"""The test settings under docs/deployment.md's production settings: the processes its examples' tests start.

The page's ``shop/logs.py`` is loaded as ``shop.logs`` (its LOGGING names the formatter
there), and its production settings block runs here as the page shows it, reading the
environment the test gives (DATABASE_URL: the test database).
"""

from tests import docs_examples
from tests.deploy_blocks import LOGS, PRODUCTION, page_block
from tests.settings import *  # noqa: F403

BASE_DIR = docs_examples.ROOT
docs_examples.load_module(page_block(LOGS))
exec(page_block(PRODUCTION).compiled())
