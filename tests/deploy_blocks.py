"""The blocks of docs/deployment.md that tests/test_deployment_examples.py runs, by their first lines.

Shared with the settings modules and the script its subprocesses run, which must not
be imported by the test process itself (they read the production environment).
"""

from tests import docs_examples

PAGE = "docs/deployment.md"
ENV_FILE = "# /etc/shop/env  (EnvironmentFile= of both units; readable by root only, it holds secrets)"
PRODUCTION = "# settings.py  (production: the database, secrets and hosts from the environment)"
LOGS = "# shop/logs.py"
DOCKERFILE = "# Dockerfile  (docker build -t shop .)"
COMPOSE = "# compose.yaml"
SECRET = "# shop-secret.yaml  (the shape only: the values here are placeholders)"
KUBERNETES = "# shop-worker.yaml  (kubectl apply -f shop-worker.yaml, once per release)"
QUEUE_SETTINGS = "# settings.py  (the queue on a database of its own: added to the production settings)"
ROUTERS = "# shop/routers.py"
MIGRATE_QUEUE = "python manage.py migrate --database queue   # the queue's tables, and nothing else"
VIEWS = "# views.py  (the queue on a database of its own)"


def page_block(key: str) -> docs_examples.Block:
    """The block of docs/deployment.md whose first line is ``key``."""
    return next(block for block in docs_examples.page_blocks(PAGE) if block.key == key)
