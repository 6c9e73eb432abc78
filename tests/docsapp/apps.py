"""Load the jobs modules of the page named by AXA_DOCS_PAGE (README.md unless set) when Django starts."""

import os

from django.apps import AppConfig


class DocsAppConfig(AppConfig):
    name = "tests.docsapp"
    label = "docsapp"

    def ready(self) -> None:
        from tests import docs_examples

        for block in docs_examples.page_blocks(os.environ.get("AXA_DOCS_PAGE", "README.md")):
            # Only the jobs modules: a worker imports those, not views or settings.
            if block.module_path is not None and block.module_path.endswith("jobs.py"):
                docs_examples.load_module(block)
