"""The production settings of docs/deployment.md with the queue on a database of its own, as the page shows it.

QUEUE_DATABASE_URL names that database. The page's ``shop/routers.py`` is loaded as
``shop.routers`` (its settings block names the router there); tests.docsapp loads
README's ``shop/jobs.py``, whose ``send_welcome`` the page's snippet enqueues.
"""

import os  # noqa: F401  (the page's block continues the production settings: it uses their imports)

from axa_django.devdb import parse_url  # noqa: F401
from tests import docs_examples
from tests.deploy_blocks import QUEUE_SETTINGS, ROUTERS, page_block
from tests.deploy_settings import *  # noqa: F403
from tests.deploy_settings import AXA_DJANGO, DATABASES, INSTALLED_APPS

_SUITE = AXA_DJANGO  # the suite's short lease and poll, under the page's DATABASE
DATABASES = dict(DATABASES)
docs_examples.load_module(page_block(ROUTERS))
exec(page_block(QUEUE_SETTINGS).compiled())
AXA_DJANGO = {**_SUITE, **AXA_DJANGO}
INSTALLED_APPS = [*INSTALLED_APPS, "tests.docsapp"]
