"""The connection budget: runworker says what it holds; a database check warns when the fleet nears max_connections."""

from io import StringIO

import pytest
from django.core import checks
from django.core.management import call_command
from django.db import connection

from axa_django.ops import budget

pytestmark = pytest.mark.django_db(transaction=True)


def live_workers(*concurrencies: int, age: float = 0) -> None:
    with connection.cursor() as cursor:
        for concurrency in concurrencies:
            cursor.execute(
                "INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, heartbeat_at) "
                "VALUES (gen_random_uuid(), 'h', 1, %s, '[]', now() - make_interval(secs => %s))",
                [concurrency, age],
            )


def server_limits() -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(budget.FLEET, {"lease": 3.0, "own": 5})
        max_conn, superuser, reserved, *_ = cursor.fetchone()
    return max_conn, superuser + reserved


def budget_warnings() -> list[checks.CheckMessage]:
    return [m for m in checks.run_checks(databases=["default"]) if m.id == "axa_django.W001"]


def test_runworker_says_how_many_connections_it_holds(workers):
    proc = workers.start("--burst", "--concurrency", "3", env=workers.env(AXA_LOG_LEVEL="INFO"))
    assert proc.wait(timeout=60) == 0
    assert (
        "this worker holds up to 8 database connections: 4 of its own (dispatcher, heartbeat, finisher, listener), "
        "one per job thread (3) while its jobs use the database, and 1 for periodic jobs and pruning; size "
        "max_connections for every worker (python manage.py check --database default warns when they do not fit)"
        in proc.stdout.read()
    )


def test_without_listen_the_worker_holds_one_fewer():
    assert budget.worker_connections(2, listens=False) == (3, 3)
    assert "up to 6 database connections: 3 of its own (dispatcher, heartbeat, finisher)," in budget.start_line(
        2, False
    )


def test_check_warns_when_live_workers_near_max_connections():
    max_conn, reserved = server_limits()
    usable = max_conn - reserved
    margin = max(budget.MARGIN_MIN, round(usable * budget.MARGIN_SHARE))
    room = usable - margin  # the workers may hold this many before the warning
    live_workers(room - 5 - 1)  # one connection short
    assert budget_warnings() == []
    live_workers(1, age=60)  # a dead worker's row does not count
    assert budget_warnings() == []
    live_workers(0)  # five more: now the total plus the margin reaches the limit
    (warning,) = budget_warnings()
    assert warning.msg.startswith(f"The 2 live worker(s) may hold up to {room + 4} connections (concurrency + 5 each)")
    assert (
        f"reaches the {usable} this server allows (max_connections {max_conn} minus {reserved} reserved" in warning.msg
    )
    # The hint says what to do itself: a wheel has no docs/ to point to.
    assert "docs/" not in warning.hint and "TRANSACTION_POOLING" in warning.hint
    out, err = StringIO(), StringIO()
    call_command("check", "--database", "default", stdout=out, stderr=err)
    assert "axa_django.W001" in err.getvalue()


def test_plain_check_queries_nothing(django_assert_num_queries):
    live_workers(10_000)
    with django_assert_num_queries(0):
        assert [m for m in checks.run_checks() if m.id == "axa_django.W001"] == []
