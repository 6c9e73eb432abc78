"""A fleet on three hosts (network namespaces) against one PostgreSQL: exactly once, then a cut link (part 5).

Needs root, ``ip`` and Debian's PostgreSQL binaries; skips with the reason elsewhere.
"""

import json
import re
import time

import pytest

from tests import fleet
from tests.conftest import wait_for

HOSTS = 3
JOBS = 5_000
SLOW_JOBS = 360


def count(f: fleet.Fleet, where: str) -> int:
    return f.sql(f"SELECT count(*) FROM axa_queue WHERE {where}")[0][0]


@pytest.fixture
def hosts():
    reason = fleet.unavailable()
    if reason:
        pytest.skip(reason)
    f = fleet.Fleet(HOSTS)
    try:
        yield f.up()
    finally:
        f.down()


@pytest.mark.halved
def test_three_hosts_drain_once_and_a_cut_host_is_rescued_and_rejoins(hosts, capsys):
    f = hosts
    migrated = f.manage("migrate", "--noinput", "-v", "0")
    assert migrated.returncode == 0, migrated.stderr
    workers = [f.start_worker(host, "--concurrency", "4") for host in range(1, HOSTS + 1)]
    wait_for(lambda: f.sql("SELECT count(*) FROM axa_worker")[0][0] == HOSTS, 60, "three workers to register")

    # 1. 5,000 jobs of about 1 ms, enqueued at once: each runs exactly once, on every host.
    started = time.monotonic()
    f.sql(
        "INSERT INTO axa_queue (id, name, args, queue) SELECT gen_random_uuid(), 'ops.sleep', '{\"seconds\": 0.001}', 'fast' "
        "FROM generate_series(1, %s)",
        [JOBS],
    )
    wait_for(lambda: count(f, "queue = 'fast' AND status = 'completed'") == JOBS, 60, "the drain")
    drained = time.monotonic() - started
    assert f.sql("SELECT status, attempts, errors::text, count(*) FROM axa_queue GROUP BY 1, 2, 3") == [
        ("completed", 1, "[]", JOBS)
    ]
    per_host = dict(
        f.sql("SELECT w.hostname, count(*) FROM axa_queue q JOIN axa_worker w ON w.id = q.worker_id GROUP BY 1")
    )
    assert set(per_host) == {f"fleet-{h}" for h in range(1, HOSTS + 1)} and sum(per_host.values()) == JOBS

    # 2. Slower jobs; mid-drain, host 2's link goes down.
    (cut_worker,) = f.sql("SELECT id FROM axa_worker WHERE hostname = 'fleet-2'")[0]
    f.sql(
        "INSERT INTO axa_queue (id, name, args, queue) "
        "SELECT gen_random_uuid(), 'ops.sleep', '{\"seconds\": 0.05}', 'slow' FROM generate_series(1, %s)",
        [SLOW_JOBS],
    )
    wait_for(lambda: count(f, "queue = 'slow' AND status = 'completed'") >= SLOW_JOBS // 6, 60, "a start")
    (cut_at,) = f.sql("SELECT now()")[0]
    f.cut(2)
    wait_for(lambda: count(f, "queue = 'slow' AND status = 'completed'") == SLOW_JOBS, 60, "the rescue")
    rescued = f.sql(
        "SELECT id, attempts, worker_id, errors::text, updated_at, losses FROM axa_queue "
        "WHERE queue = 'slow' AND errors::text LIKE '%%WorkerLost%%' ORDER BY id"
    )
    assert rescued, "host 2 had jobs in flight when its link went down"
    lost_at = []
    for _job_id, attempts, worker_id, errors, _, losses in rescued:
        (entry,) = json.loads(errors)
        assert entry["type"] == "WorkerLost" and entry["worker"] == str(cut_worker)
        # Run again by another host at the defaults (one attempt): a loss spends no attempt,
        # and a row claimed ahead that host 2 had not started (by the database's record)
        # counts no loss either.
        unstarted = "before starting it" in entry["message"]
        assert (attempts, losses) == (1, 0 if unstarted else 1) and worker_id != cut_worker, entry
        lost_at.append(entry["at"])
    (delay,) = f.sql(
        "SELECT extract(epoch FROM max(t::timestamptz) - %s)::float8 FROM unnest(%s::text[]) AS t", [cut_at, lost_at]
    )[0]
    assert f.sql("SELECT count(*) FROM axa_queue WHERE status <> 'completed'") == [(0,)]

    # 3. The link comes back: host 2's late outcomes are refused, and it rejoins under its id.
    snapshot = "SELECT id, status, attempts, worker_id, errors::text, updated_at FROM axa_queue ORDER BY id"
    before = f.sql(snapshot)
    f.mend(2)
    wait_for(lambda: "registering again" in f.log(2), 60, "host 2 to rejoin")
    wait_for(lambda: f.sql("SELECT count(*) FROM axa_worker WHERE id = %s", [cut_worker]) == [(1,)], 30, "its row")
    wait_for(lambda: "not written: their jobs were rescued or changed meanwhile" in f.log(2), 60, "the late outcomes")
    late = {
        job_id
        for line in f.log(2).splitlines()
        if "not written" in line
        for job_id in re.findall(r"ops\.sleep ([0-9a-f-]{36})", line)
    }
    assert f.sql(snapshot) == before  # not one late outcome overwrote a row
    # Each refused outcome is of a job rescued and run elsewhere, or of one whose outcome host 2
    # had written just before the cut hid the server's reply (its retry finds the row finished).
    rescued_ids = {str(row[0]) for row in rescued}
    for job_id in late - rescued_ids:
        assert f.sql("SELECT status, attempts, worker_id FROM axa_queue WHERE id = %s", [job_id]) == [
            ("completed", 1, cut_worker)
        ]
    # The fleet, host 2 back in it, drains a last batch; then every worker stops cleanly on SIGTERM.
    f.sql(
        "INSERT INTO axa_queue (id, name, args) SELECT gen_random_uuid(), 'ops.sleep', '{}' FROM generate_series(1, 60)"
    )
    wait_for(lambda: count(f, "status = 'completed'") == JOBS + SLOW_JOBS + 60, 60, "the last batch")
    for proc in workers:
        proc.terminate()
    assert [proc.wait(timeout=60) for proc in workers] == [0] * HOSTS, f.log(2)
    with capsys.disabled():
        print(
            f"\nfleet: {JOBS:,} jobs drained by {HOSTS} hosts in {drained:.1f}s ({per_host}); host 2 cut with "
            f"{len(rescued)} job(s) in flight, rescued {delay:.1f}s after the cut (lease 3s), "
            f"{len(late)} late outcome(s) refused ({len(late & rescued_ids)} of rescued jobs)"
        )
