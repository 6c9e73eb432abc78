"""The sdist and the wheel: built from this checkout (offline), holding what they should and nothing half-way."""

import ast
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path, PurePosixPath

import pytest

from tests import docs_examples
from tests.conftest import ROOT

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# Markdown links and images whose target is a path in the repository, not a URL or an anchor.
_LOCAL_LINK = re.compile(r"\]\((?!https?://|#|mailto:)([^)\s#]+)")
# Links to a heading: (the page, empty for the same page; the anchor).
_ANCHOR_LINK = re.compile(r"\]\((?!https?://|mailto:)([^)\s#]*)#([^)\s]+)\)")


# What .gitignore leaves out of a checkout: virtualenvs, caches, build output, benchmark data.
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv*", ".ci-venv*", "__pycache__", "*.pyc", "*.egg-info", "build", "dist", ".*_cache", ".data", "data"
)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dist(tmp_path_factory)


def build_dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel of this checkout, built offline into a new folder (returned),
    beside the copy of the checkout they were built from (``checkout/``)."""
    pytest.importorskip("build", reason="pip install -e '.[dev]' installs build")
    out = tmp_path_factory.mktemp("dist")
    # A copy of the checkout: setuptools stages the sdist inside the tree it builds, and two
    # xdist workers building in one tree would remove each other's staging directory. The
    # tests compare the builds with the copy, not with a checkout others may be editing.
    tree = out / "checkout"
    shutil.copytree(ROOT, tree, ignore=_NOT_SOURCE)
    # No flags: the sdist first, then the wheel built from the unpacked sdist, so a
    # file the sdist lacks breaks the wheel. --no-isolation: the dev extra's setuptools, no network.
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(tree)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return out


def _sdist(dist: Path) -> dict[str, bytes]:
    (path,) = dist.glob("axa_django-*.tar.gz")
    with tarfile.open(path) as tar:
        return {
            str(PurePosixPath(*PurePosixPath(m.name).parts[1:])): tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def _source_files(dist: Path, folder: str) -> set[str]:
    """The files of ``folder`` in the checkout the builds came from (no caches)."""
    tree = dist / "checkout"
    return {
        path.relative_to(tree).as_posix()
        for path in (tree / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def test_the_sdist_holds_what_manifest_in_says(dist):
    files = _sdist(dist)
    # MANIFEST.in: the package, LICENSE, README, CHANGELOG, docs/ whole and the benchmarks' history
    # (docs/performance.md links to it); setuptools adds its metadata.
    made = {"PKG-INFO", "setup.cfg", "pyproject.toml", "MANIFEST.in"}
    made |= {name for name in files if name.startswith("axa_django.egg-info/")}
    wanted = {"LICENSE", "README.md", "CHANGELOG.md", "benchmarks/HISTORY.md"}
    wanted |= _source_files(dist, "docs") | _source_files(dist, "axa_django")
    assert set(files) - made == wanted, (sorted(set(files) - made - wanted), sorted(wanted - set(files)))
    assert "axa_django/migrations/0001_initial.py" in files and "axa_django/py.typed" in files
    assert b"MIT License" in files["LICENSE"] and b"The axa-django authors" in files["LICENSE"]
    # All of the test suite or none of it: none (it needs the whole repository).
    assert not [name for name in files if name.startswith(("tests/", "example_project/", "benchmarks/results/"))]
    assert not [name for name in files if "__pycache__" in name or name.endswith(".pyc")]


def test_every_local_link_of_the_readme_and_docs_resolves_inside_the_sdist(dist):
    files = _sdist(dist)
    for page in ["README.md", "CHANGELOG.md", *sorted(n for n in files if n.endswith(".md") and "/" in n)]:
        base = PurePosixPath(page).parent
        for target in _LOCAL_LINK.findall(files[page].decode()):
            resolved = str(PurePosixPath(*_normalised(base / target)))
            assert resolved in files, f"{page} links to {target}, which the sdist does not hold"
        for target, anchor in _ANCHOR_LINK.findall(files[page].decode()):
            resolved = str(PurePosixPath(*_normalised(base / target))) if target else page
            assert anchor in _anchors(files[resolved].decode()), f"{page} links to {target}#{anchor}: no such heading"


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    seen: dict[str, int] = {}
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6} (.+)$", prose, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1  # a second "Usage" is "usage-1"
    return {slug if n == 0 else f"{slug}-{n}" for slug, count in seen.items() for n in range(count + 1)}


def _normalised(path: PurePosixPath) -> list[str]:
    parts: list[str] = []
    for part in path.parts:
        if part == "..":
            parts.pop()
        elif part != ".":
            parts.append(part)
    return parts


def test_the_wheel_holds_the_package_only_with_license_and_extras(dist):
    (path,) = dist.glob("axa_django-*.whl")
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(wheel.read(metadata_name).decode())
    assert all(n.startswith(("axa_django/", f"axa_django-{VERSION}.dist-info/")) for n in names), names
    # Every file of the package, code or not (templates, static files, py.typed, migrations).
    assert {n for n in names if n.startswith("axa_django/")} == _source_files(dist, "axa_django")
    assert "axa_django/templates/admin/axa_django/dashboard.html" in names
    assert "axa_django/management/commands/runworker.py" in names
    assert "axa_django/migrations/0001_initial.py" in names and "axa_django/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert metadata["License-Expression"] == "MIT"
    assert {"binary", "c", "embedded", "cron", "dev"} <= set(metadata.get_all("Provides-Extra"))
    requires = metadata.get_all("Requires-Dist")
    assert 'psycopg[binary]>=3.2; extra == "binary"' in requires and 'psycopg[c]>=3.2; extra == "c"' in requires


def test_no_message_of_the_package_points_into_docs():
    """An installed wheel has no docs/: a log line, error or hint that names a docs/ path sends users nowhere."""
    found = []
    for path in sorted((ROOT / "axa_django").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) and id(node) not in docstrings else None
            if isinstance(text, str) and re.search(r"\bdocs/", text):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text!r}")
    assert not found, "messages naming a docs/ path:\n" + "\n".join(found)


def test_the_install_lines_of_the_readme_and_install_md_work_today(dist, tmp_path):
    """Each ``pip install`` of a checkout or a wheel the pages show, run offline into a folder of its own."""
    lines = []
    for page in ("README.md", "docs/install.md"):
        for block in docs_examples.page_blocks(page):
            for command in block.code.replace("&&", "\n").splitlines():
                words = shlex.split(command, comments=True)
                local = any(w.startswith(("./axa-django", "dist/")) for w in words)
                if words[:2] == ["pip", "install"] and local and words not in lines:
                    lines.append(words)
    assert len(lines) == 3, lines  # from a checkout (README's and install.md's), editable, and the wheel
    (wheel,) = dist.glob("axa_django-*.whl")
    (sdist,) = dist.glob("axa_django-*.tar.gz")
    runs = []
    for index, words in enumerate(lines):
        # The checkout: the unpacked sdist (one per line: pip builds in the tree), so nothing is
        # written into this repository; no network, and nothing installed around the suite.
        checkout = tmp_path / f"checkout{index}"
        with tarfile.open(sdist) as tar:
            tar.extractall(checkout, filter="data")
        (source,) = checkout.iterdir()
        argv = [w.replace("./axa-django", str(source)).replace(f"dist/{wheel.name}", str(wheel)) for w in words[2:]]
        target = tmp_path / f"target{index}"
        options = ["-q", "--no-deps", "--no-index", "--no-build-isolation", "--target", str(target)]
        command = [sys.executable, "-m", "pip", "install", *options, *argv]
        runs.append((target, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for target, proc in runs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        assert list(target.glob(f"axa_django-{VERSION}.dist-info")), sorted(p.name for p in target.iterdir())


def test_twine_check_passes_on_the_sdist_and_the_wheel(dist):
    """What the package index checks on upload: the metadata, and README as the project's page."""
    pytest.importorskip("twine", reason="pip install -e '.[dev]' installs twine")
    files = sorted(str(path) for path in dist.glob("axa_django-*"))
    assert len(files) == 2, files
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files], capture_output=True, text=True, timeout=120
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2, checked.stdout
