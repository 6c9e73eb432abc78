"""The code blocks of README.md and docs/*.md, found and run as the modules and snippets they show.

A block is named by its page and its first line (``("docs/jobs.md", "# views.py")``; a
first line seen again in the same page gets `` #2``, `` #3``...). A ``python`` block whose
first line is ``# <path>.py`` is a module: ``shop/jobs.py`` becomes the module
``shop.jobs``. A `Page` loads its own modules into ``sys.modules`` and the job registry
only while it is open, so that pages defining ``shop.jobs`` differently do not meet.

docs/testing.md is the exception: its modules stay loaded for the whole session, so that
pytest collects the page's tests in the test modules that run them (``run_block``).
"""

from __future__ import annotations

import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "testing.md"
MODULES = ("shop/jobs.py", "shop/services.py")
# An opening fence (indented inside a list item, maybe) with its language, the code, the closing fence.
_FENCE = re.compile(r"^([ \t]*)```([\w-]*)[ \t]*\n(.*?)^\1```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    """One fenced code block: its page (relative to the repository), line, language and code."""

    page: str
    line: int  # of the code's first line, 1-based
    lang: str
    code: str
    key: str  # the first line, made unique within the page

    @property
    def module_path(self) -> str | None:
        """``shop/jobs.py`` for a python block starting ``# shop/jobs.py``, else None."""
        first = self.code.split("\n", 1)[0]
        if self.lang == "python" and re.fullmatch(r"# [\w/]+\.py", first):
            return first[2:]
        return None

    def compiled(self) -> types.CodeType:
        # Blank lines in front: tracebacks point at the block's lines in the page.
        return compile("\n" * (self.line - 1) + self.code, str(ROOT / self.page), "exec")


def pages() -> list[str]:
    """README.md and every docs/*.md, relative to the repository."""
    return ["README.md", *sorted(f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md"))]


def page_blocks(page: str) -> list[Block]:
    """The page's fenced blocks in order; raises if a fence is left open."""
    text = (ROOT / page).read_text()
    found: list[Block] = []
    seen: dict[str, int] = {}
    for match in _FENCE.finditer(text):
        indent = match.group(1)
        code = "".join(line.removeprefix(indent) for line in match.group(3).splitlines(keepends=True))
        first = code.split("\n", 1)[0].strip()
        seen[first] = seen.get(first, 0) + 1
        key = first if seen[first] == 1 else f"{first} #{seen[first]}"
        line = text.count("\n", 0, match.start(3)) + 1
        found.append(Block(page, line, match.group(2), code, key))
    fences = len(re.findall(r"^[ \t]*(?:```|~~~)", text, re.M))
    if fences != 2 * len(found):
        raise AssertionError(
            f"{page}: {fences} fence lines for {len(found)} blocks; a fence is left open or its closing fence is indented differently"
        )
    return found


def all_blocks() -> list[Block]:
    """Every block of every page."""
    return [block for page in pages() for block in page_blocks(page)]


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _install(name: str, file: str) -> types.ModuleType:
    """An empty module ``name`` in sys.modules, with its parent packages."""
    package, _, leaf = name.rpartition(".")
    if package and package not in sys.modules:
        parent = _install(package, file)
        parent.__path__ = []
    module = types.ModuleType(name)
    module.__file__ = file
    sys.modules[name] = module
    if package:
        setattr(sys.modules[package], leaf, module)
    return module


def load_module(block: Block) -> types.ModuleType:
    """Run a ``# <path>.py`` block as the module it names (left in sys.modules)."""
    path = block.module_path
    if path is None:
        raise AssertionError(f"{block.page}: block {block.key!r} does not start with '# <path>.py'")
    name = _module_name(path)
    module = _install(name, str(ROOT / block.page))
    try:
        exec(block.compiled(), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _job_registry() -> dict[str, Any]:
    from axa_django import registry

    return registry.registry


class Page:
    """A page's blocks, run in order: modules in sys.modules, snippets in one namespace.

    Open it with ``with Page("docs/jobs.md", **context) as page``: ``context`` is what the
    page's prose assumes exists (a metrics client, a helper). On leaving, the page's
    modules and jobs are removed, what they replaced comes back, and every block of the
    page not named in ``skip`` must have been run.
    """

    def __init__(self, page: str, *, skip: frozenset[str] = frozenset(), snippet_module: str = "docs_snippets"):
        self.page = page
        self.blocks = {block.key: block for block in page_blocks(page)}
        self.skip = skip
        self.used: set[str] = set()
        self.namespace: dict[str, Any] = {"__name__": snippet_module}
        self._packages: set[str] = set()
        self._saved_modules: dict[str, types.ModuleType] = {}
        self._saved_registry: dict[str, Any] = {}

    def __enter__(self) -> Page:
        registry = _job_registry()
        self._saved_registry = dict(registry)
        # Alone: the page's names may be the test suite's too ("CountWorker").
        registry.clear()
        return self

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        for package in self._packages:
            for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
                del sys.modules[name]
        sys.modules.update(self._saved_modules)
        registry = _job_registry()
        registry.clear()
        registry.update(self._saved_registry)
        if kind is None:
            left = set(self.blocks) - self.used - self.skip
            if left:
                raise AssertionError(f"{self.page}: blocks not run by its test: {sorted(left)}")

    def _take(self, key: str) -> Block:
        if key not in self.blocks:
            raise AssertionError(f"{self.page} has no block starting {key!r}; it has {sorted(self.blocks)}")
        self.used.add(key)
        return self.blocks[key]

    def block(self, key: str) -> Block:
        """The block ``key``, counted as checked by the caller."""
        return self._take(key)

    def module(self, key: str) -> types.ModuleType:
        """Load the module block ``key`` (e.g. ``"# shop/jobs.py"``) for as long as the page is open."""
        block = self._take(key)
        if block.module_path is None:
            raise AssertionError(f"{self.page}: {key!r} does not start with '# <path>.py'")
        package = _module_name(block.module_path).split(".")[0]
        if package not in self._packages:
            # Another page's, or the session's, modules of that package step aside until exit.
            self._packages.add(package)
            for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
                self._saved_modules[name] = sys.modules.pop(name)
        return load_module(block)

    def run(self, key: str, **names: Any) -> dict[str, Any]:
        """Run snippet ``key`` in the page's namespace (with ``names`` added) and return the namespace."""
        block = self._take(key)
        self.namespace.update(names)
        exec(block.compiled(), self.namespace)
        return self.namespace

    def settings(self, key: str, **names: Any) -> dict[str, Any]:
        """Run a ``# settings.py`` block in a fresh namespace holding ``names``; return that namespace."""
        block = self._take(key)
        namespace: dict[str, Any] = {"__name__": "settings", **names}
        exec(block.compiled(), namespace)
        return namespace


# -- docs/testing.md, loaded once per session ---------------------------------------------


def blocks() -> dict[str, tuple[int, str]]:
    """Each python block of docs/testing.md by the path it names: (the line before it, its code)."""
    found: dict[str, tuple[int, str]] = {}
    for block in page_blocks("docs/testing.md"):
        if block.lang != "python":
            continue
        if block.module_path is None:
            raise AssertionError(f"a python block of {DOC.name} does not start with '# <path>.py': {block.key!r}")
        found[block.module_path] = (block.line - 1, block.code)
    return found


def _testing_block(path: str) -> Block:
    return next(block for block in page_blocks("docs/testing.md") if block.module_path == path)


def run_block(path: str, namespace: dict[str, Any]) -> None:
    """Load docs/testing.md's modules, then run its test block ``path`` in ``namespace``."""
    for module in MODULES:
        if _module_name(module) not in sys.modules:
            load_module(_testing_block(module))
    exec(_testing_block(path).compiled(), namespace)
