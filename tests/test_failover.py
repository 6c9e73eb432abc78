"""A database crash or a failover strands no job: private clusters, real workers, every job checked.

The server crashes (``pg_ctl stop -m immediate``) mid-drain and starts again; or the
primary of a streaming pair crashes and its standby is promoted, the workers given
both hosts (``target_session_attrs=read-write``). Claims and outcomes written without
waiting for the flush may be lost with the server: a row whose claim survived and whose
outcome did not stayed ``running`` under a live worker for ever. Now every job ends
``completed`` (some run twice: at least once), and a worker pointed at a standby waits.

Each drain prints one line: the first and the last completion after the stop (from the
rows' ``finished_at``), the jobs run twice and the acknowledged enqueues lost
(benchmarks/results/pg15-failover.txt keeps them). With asynchronous replication, what
had not reached the standby is lost (enqueues) or run again (outcomes): shown with a
standby whose WAL stream is cut first. A server turned read-only under a working worker
(``default_transaction_read_only``, as a managed service does when its disk fills) is
waited out; tests/test_read_only.py starts one on a read-only database.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest

from tests import clusters, docs_examples
from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.skipif(clusters.unavailable() is not None, reason=str(clusters.unavailable()))

JOB = "tests.testapp.jobs.trace"


class HA:
    """Clusters and runworker processes for one test, all gone at its end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.clusters: list[clusters.Cluster] = []
        self.procs: list[tuple[subprocess.Popen[str], IO[str]]] = []

    def env(self, url: str) -> dict[str, str]:
        return dict(os.environ, DATABASE_URL=url, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONUNBUFFERED="1")

    def primary(self) -> clusters.Cluster:
        primary = clusters.Cluster(self.root, "primary").init().start()
        self.clusters.append(primary)
        with primary.connect("postgres") as conn:
            conn.execute("CREATE DATABASE axa_ha")
        done = subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v", "0"],
            cwd=ROOT,
            env=self.env(primary.url()),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return primary

    def standby(self, primary: clusters.Cluster) -> clusters.Cluster:
        standby = clusters.Cluster(self.root, "standby").standby_of(primary).start()
        self.clusters.append(standby)
        clusters.wait_ready(standby, "axa_ha")
        wait_for(lambda: streaming(primary), timeout=60, what="the standby streaming")
        return standby

    def worker(self, url: str, *args: str) -> subprocess.Popen[str]:
        n = len(self.procs)
        out = (self.root / f"worker{n}.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "runworker", *args],
            cwd=ROOT,
            env=self.env(url),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.procs.append((proc, out))
        return proc

    def output(self, proc: subprocess.Popen[str]) -> str:
        index = next(i for i, (p, _) in enumerate(self.procs) if p is proc)
        return (self.root / f"worker{index}.log").read_text()

    def close(self, failed: bool = False) -> None:
        for proc, out in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            out.close()
            if failed:  # pytest shows it with the failure
                print(f"-- the last lines of worker {proc.pid} (exit {proc.returncode}):", self.output(proc)[-3000:])
        clusters.remove(self.root, self.clusters)


@pytest.fixture
def ha(request: pytest.FixtureRequest) -> Iterator[HA]:
    setup = HA(clusters.workspace())
    failures = request.session.testsfailed
    yield setup
    setup.close(failed=request.session.testsfailed > failures)  # the call's report is counted before teardown


def streaming(primary: clusters.Cluster, sync: bool = False) -> bool:
    with primary.connect("postgres") as conn:
        states = conn.execute("SELECT state, sync_state FROM pg_stat_replication").fetchall()
    return any(state == "streaming" and (not sync or mode == "sync") for state, mode in states)


def both(primary: clusters.Cluster, standby: clusters.Cluster) -> str:
    """The URL of both hosts that lets libpq find the primary, as the deployment page says."""
    return (
        f"postgresql://{clusters.SUPERUSER}@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/axa_ha"
        "?target_session_attrs=read-write"
    )


def enqueue(
    cluster: clusters.Cluster, first: int, count: int, log: Path, seconds: float = 0.002, later: float = 0
) -> None:
    """``count`` trace jobs by SQL (tokens first..first+count-1): a durable commit, as a view's enqueue is.

    ``seconds``: each job's run; ``later``: they are due that many seconds from now.
    """
    with cluster.connect() as conn:
        conn.execute(
            "INSERT INTO axa_queue (id, name, args, run_at) SELECT gen_random_uuid(), %s, "
            "jsonb_build_object('token', i::text, 'log', %s::text, 'seconds', %s::float8), "
            "now() + make_interval(secs => %s) FROM generate_series(%s::int, %s::int) AS i",
            [JOB, str(log), seconds, later, first, first + count - 1],
        )


def statuses(cluster: clusters.Cluster) -> dict[str, int]:
    """Rows per status, or {} while the server does not answer (restarting, promoting)."""
    try:
        with cluster.connect() as conn:
            return dict(conn.execute("SELECT status, count(*) FROM axa_queue GROUP BY status").fetchall())
    except psycopg.Error:
        return {}


def all_completed(cluster: clusters.Cluster, total: int) -> bool:
    return statuses(cluster) == {"completed": total}


def tokens(cluster: clusters.Cluster, status: str | None = None) -> set[str]:
    """The tokens of the jobs ``cluster`` has (in ``status``)."""
    with cluster.connect() as conn:
        rows = conn.execute(
            "SELECT args->>'token' FROM axa_queue WHERE status = %s OR %s::text IS NULL", [status, status]
        ).fetchall()
    return {token for (token,) in rows}


def runs(log: Path) -> Counter[str]:
    return Counter(line.split()[0] for line in log.read_text().splitlines())


def drained(
    cluster: clusters.Cluster,
    enqueued: int,
    log: Path,
    stopped: float,
    what: str,
    timeout: float,
    lost: frozenset[str] = frozenset(),
) -> Counter[str]:
    """Wait until every job on ``cluster`` is completed; check them against the runs; print the figures.

    ``enqueued`` jobs were acknowledged (tokens 0..enqueued-1) and each ran at least once;
    those of ``lost`` never reached ``cluster``, every other one is on it. ``stopped``: the
    wall-clock time once the server was gone (its ``pg_ctl stop`` returned), against which
    the rows' ``finished_at`` are read (one host, one clock).
    """
    kept = enqueued - len(lost)
    try:
        wait_for(lambda: all_completed(cluster, kept), timeout=timeout, what=f"every job completed after the {what}")
    except AssertionError as error:
        raise AssertionError(f"{error}; rows per status now: {statuses(cluster)}") from None
    ran = runs(log)
    acknowledged = {str(i) for i in range(enqueued)}
    assert set(ran) - lost == acknowledged - lost
    assert acknowledged - tokens(cluster) == lost
    twice = sum(1 for token, n in ran.items() if n > 1 and token not in lost)
    with cluster.connect() as conn:
        first, last = conn.execute(
            "SELECT extract(epoch FROM min(finished_at) FILTER (WHERE finished_at >= to_timestamp(%s)))::float8, "
            "extract(epoch FROM max(finished_at))::float8 FROM axa_queue",
            [stopped],
        ).fetchone() or (None, None)
    assert first is not None and last is not None, "no job completed after the stop"
    print(
        f"{what}: first completion {first - stopped:.1f}s after it, last {last - stopped:.1f}s; "
        f"run twice: {twice} of {kept}; lost: {len(lost)} of {enqueued} acknowledged enqueues"
    )
    return ran


def stop_workers(ha: HA, procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        assert proc.poll() is None, "a worker died:\n" + ha.output(proc)[-3000:]
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=60) == 0, ha.output(proc)[-3000:]


@pytest.mark.halved
def test_a_crash_of_the_server_mid_drain_strands_no_job(ha: HA, tmp_path: Path) -> None:
    total = 5000
    log = tmp_path / "runs.log"
    log.touch()
    primary = ha.primary()
    enqueue(primary, 0, total, log)
    procs = [ha.worker(primary.url(), "--concurrency", "4") for _ in range(3)]
    wait_for(lambda: statuses(primary).get("completed", 0) >= total // 5, timeout=120, what="a fifth done")
    primary.stop("immediate")
    crashed = time.time()  # the server is gone: what finished after this was written after the crash
    primary.start()
    drained(primary, total, log, crashed, "crash", timeout=120)
    stop_workers(ha, procs)


@pytest.mark.halved
@pytest.mark.parametrize("sync", [True, False], ids=["synchronous", "asynchronous"])
def test_a_failover_to_the_promoted_standby_strands_and_loses_no_job(ha: HA, tmp_path: Path, sync: bool) -> None:
    total, late = 3000, 200
    log = tmp_path / "runs.log"
    log.touch()
    primary = ha.primary()
    enqueue(primary, 0, total, log)
    standby = ha.standby(primary)
    if sync:
        with primary.connect("postgres") as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
        wait_for(lambda: streaming(primary, sync=True), timeout=60, what="the standby synchronous")
    procs = [ha.worker(both(primary, standby), "--concurrency", "4") for _ in range(2)]
    wait_for(lambda: statuses(primary).get("completed", 0) >= total // 3, timeout=120, what="a third done")
    if sync:
        enqueue(primary, total, late, log)  # acknowledged by the synchronous standby
        total += late
    primary.stop("immediate")
    failed_at = time.time()
    standby.promote()
    mode = "synchronous" if sync else "asynchronous"
    ran = drained(standby, total, log, failed_at, f"failover ({mode}) to the promoted standby", timeout=150)
    if sync:
        # Every claim and outcome the workers acted on waited for the standby: none is run
        # again. (A claim whose commit the crash cut short was never acted on, and an
        # outcome not yet acknowledged is written again by the finisher: neither reruns.)
        assert sorted(token for token, n in ran.items() if n > 1) == [], "outcomes acknowledged but lost"
    stop_workers(ha, procs)


@pytest.mark.halved
def test_asynchronous_replication_loses_the_enqueues_and_reruns_the_outcomes_the_standby_lacked(
    ha: HA, tmp_path: Path
) -> None:
    total, late = 400, 50
    log = tmp_path / "runs.log"
    log.touch()
    primary = ha.primary()
    enqueue(primary, 0, total, log, seconds=0.01)  # a drain of a second or more
    standby = ha.standby(primary)
    procs = [ha.worker(both(primary, standby), "--concurrency", "4")]
    # Outcomes skip the WAL flush: they reach the standby a WAL writer's round later.
    wait_for(lambda: tokens(standby, "completed"), timeout=60, what="outcomes on the standby")
    standby.stop_receiving()  # the primary goes on alone, as ahead of a lagging standby
    reached = tokens(standby, "completed")  # the outcomes the standby has
    # Acknowledged by the primary alone, and due later: they stay queued there until it dies.
    enqueue(primary, total, late, log, later=3600)
    wait_for(lambda: statuses(primary) == {"completed": total, "queued": late}, timeout=60, what="the drain done")
    primary.stop("immediate")
    failed_at = time.time()
    standby.promote()
    ran = drained(
        standby,
        total + late,
        log,
        failed_at,
        "failover (asynchronous, the standby cut off first) to the promoted standby",
        timeout=60,
        lost=frozenset(str(i) for i in range(total, total + late)),
    )
    # Every outcome written after the cut ran again (claimed ahead or not before it); every
    # outcome the standby had, and every enqueue it lacked, ran once.
    assert len(reached) < total, "the drain ended before the cut: nothing left to lose"
    assert {token for token, n in ran.items() if n > 1} == {str(i) for i in range(total)} - reached
    stop_workers(ha, procs)


def read_only(cluster: clusters.Cluster, on: bool) -> None:
    """Turn the whole server read-only, its open sessions too (as a managed service whose disk fills), or back."""
    writable = "-c default_transaction_read_only=off"  # this session writes whatever the server says
    with psycopg.connect(cluster.url("postgres"), autocommit=True, connect_timeout=5, options=writable) as conn:
        conn.execute(f"ALTER SYSTEM SET default_transaction_read_only = {'on' if on else 'off'}")
        conn.execute("SELECT pg_reload_conf()")


@pytest.mark.halved
def test_a_worker_on_a_read_only_server_says_so_waits_and_works_once_it_takes_writes(ha: HA, tmp_path: Path) -> None:
    total, late = 100, 4
    log = tmp_path / "runs.log"
    log.touch()
    primary = ha.primary()
    enqueue(primary, 0, total, log)
    standby = ha.standby(primary)
    # A standby: its connections are refused at once.
    proc = ha.worker(standby.url(), "--concurrency", "2")
    said = "is read-only (a standby, or default_transaction_read_only is on)"
    wait_for(lambda: ha.output(proc).count(said) >= 3, timeout=60, what="the worker saying so, again and again")
    assert proc.poll() is None, ha.output(proc)
    assert statuses(standby) == {"queued": total}  # nothing claimed, nothing failed
    primary.stop("immediate")
    standby.promote()
    wait_for(lambda: all_completed(standby, total), timeout=90, what="the jobs done once promoted")
    assert set(runs(log)) == {str(i) for i in range(total)}
    # The server turned read-only under the working worker, its open sessions too: their
    # next writes (the running jobs' outcomes, a beat, a claim) are refused mid-session.
    enqueue(standby, total, late, log, seconds=0.5)
    wait_for(lambda: len(runs(log)) >= total + 2, timeout=60, what="two jobs done, the other two claimed")
    output = len(ha.output(proc))
    read_only(standby, True)
    wait_for(lambda: ha.output(proc)[output:].count(said) >= 2, timeout=30, what="the worker saying so, again")
    assert "read-only transaction" in ha.output(proc)[output:]  # a write of an open session refused first
    assert proc.poll() is None, ha.output(proc)
    assert "failed" not in statuses(standby)
    read_only(standby, False)
    wait_for(lambda: all_completed(standby, total + late), timeout=30, what="every job done once writes are allowed")
    assert runs(log) == Counter({str(i): 1 for i in range(total + late)})  # each outcome written once, none rerun
    stop_workers(ha, [proc])


def test_the_deployment_pages_settings_and_url_say_the_same() -> None:
    from axa_django.devdb import parse_url

    [block] = [b for b in docs_examples.page_blocks("docs/deployment.md") if "a primary and its standby" in b.key]
    namespace: dict[str, Any] = {}
    exec(block.code, namespace)
    written = namespace["DATABASES"]["default"]
    page = (ROOT / "docs/deployment.md").read_text()
    url = page.split("`DATABASE_URL=", 1)[1].split("`", 1)[0]
    parsed = parse_url(url)
    assert {key: parsed[key] for key in written} == written


def test_one_url_of_several_hosts_becomes_the_host_and_port_lists_libpq_reads() -> None:
    from axa_django.devdb import parse_url

    entry: dict[str, Any] = parse_url("postgresql://u:p@db1:5432,db2:5433/app?target_session_attrs=read-write")
    assert (entry["HOST"], entry["PORT"], entry["OPTIONS"]) == (
        "db1,db2",
        "5432,5433",
        {"target_session_attrs": "read-write"},
    )
    assert parse_url("postgresql://u@[::1]:5433/app")["HOST"] == "::1"
    with pytest.raises(ValueError, match="not a number"):
        parse_url("postgresql://u@db1:x/app")
