"""docs/testing.md's code blocks, loaded as the modules they name, so that the suite runs the docs' example.

Every ``python`` block starts with a ``# path`` comment. ``shop/jobs.py`` and
``shop/services.py`` become the modules ``shop.jobs`` and ``shop.services``; a test
module runs a test block in its own namespace, so pytest collects the docs' tests there.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parent.parent / "docs" / "testing.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
MODULES = ("shop/jobs.py", "shop/services.py")


def blocks() -> dict[str, tuple[int, str]]:
    """Each python block of the page by the path it names: (the line it starts on, its code)."""
    text = DOC.read_text()
    found: dict[str, tuple[int, str]] = {}
    for match in _BLOCK.finditer(text):
        code = match.group(1)
        first = code.split("\n", 1)[0]
        if not first.startswith("# ") or not first.endswith(".py"):
            raise AssertionError(f"a python block of {DOC.name} does not start with '# <path>.py': {first!r}")
        found[first[2:]] = (text.count("\n", 0, match.start(1)), code)
    return found


def _execute(path: str, namespace: dict[str, Any]) -> None:
    line, code = blocks()[path]
    # Blank lines in front: tracebacks point at the block's lines in the page.
    exec(compile("\n" * line + code, str(DOC), "exec"), namespace)


def _load(path: str) -> None:
    name = path.removesuffix(".py").replace("/", ".")
    if name in sys.modules:
        return
    package, _, leaf = name.rpartition(".")
    if package not in sys.modules:
        parent = types.ModuleType(package)
        parent.__path__ = []
        sys.modules[package] = parent
    module = types.ModuleType(name)
    module.__file__ = str(DOC)
    sys.modules[name] = module
    try:
        _execute(path, module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    setattr(sys.modules[package], leaf, module)


def run_block(path: str, namespace: dict[str, Any]) -> None:
    """Load the example's modules, then run the test block ``path`` in ``namespace``."""
    for module in MODULES:
        _load(module)
    _execute(path, namespace)
