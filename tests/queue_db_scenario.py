"""Run by tests/test_deployment_examples.py under tests.queue_db_settings, in a process of its own.

Runs the migrate lines it is given (docs/deployment.md's, as argument lists in JSON),
enqueues inside a transaction on ``default`` that rolls back, runs the page's
``on_commit`` snippet once rolled back and once committed, and prints as JSON what
each database then holds and what the router decided.
"""

import contextlib
import io
import json
import sys

import django

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import DatabaseError, router, transaction  # noqa: E402

from axa_django import Job  # noqa: E402
from tests.deploy_blocks import VIEWS, page_block  # noqa: E402
from tests.refapp.models import Report  # noqa: E402


class RolledBack(Exception):
    pass


def migrate_check() -> list[object]:
    """``migrate --check``'s exit status on default and on queue (1 while a migration is unapplied)."""
    codes: list[object] = []
    for database in ("default", "queue"):
        try:
            call_command("migrate", "--check", "--database", database, verbosity=0)
            codes.append(0)
        except SystemExit as exit:
            codes.append(exit.code)
    return codes


def main() -> None:
    checks = [migrate_check()]
    for argv in json.loads(sys.argv[1]):
        call_command(*argv, verbosity=0)
    checks.append(migrate_check())
    from shop.jobs import send_welcome  # README's, loaded by tests.docsapp

    # What the page says happens: the enqueue stays when default's transaction rolls back.
    try:
        with transaction.atomic():
            user = User.objects.create(username="never-saved")
            orphan = send_welcome.perform_later(user_id=user.pk)
            raise RolledBack
    except RolledBack:
        pass
    # The page's answer, rolled back by an outer transaction, then committed.
    snippet = page_block(VIEWS).compiled()
    try:
        with transaction.atomic():
            exec(snippet, {"__name__": "views"})
            raise RolledBack
    except RolledBack:
        pass
    enqueued_after_rollback = Job.objects.filter(name=send_welcome.name).count()
    exec(snippet, {"__name__": "views"})
    ann = User.objects.get(username="ann")

    report = Report.objects.create(job=Job.objects.get(args={"user_id": ann.pk}))
    try:
        list(Report.objects.select_related("job"))
        joined = "no error"
    except DatabaseError as error:
        joined = str(error).splitlines()[0]
    health = io.StringIO()
    with contextlib.suppress(SystemExit):  # it exits 1 when unhealthy, as a probe reads it
        call_command("jobhealth", "--json", stdout=health)
    print(
        json.dumps(
            {
                "migrate_check": checks,
                "router": [f"{type(r).__module__}.{type(r).__qualname__}" for r in router.routers],
                "job_database": router.db_for_write(Job),
                "user_database": router.db_for_write(User),
                "orphan": str(orphan.id),
                "orphan_saved": Job.objects.filter(pk=orphan.id).exists(),
                "users": sorted(User.objects.values_list("username", flat=True)),
                "enqueued_after_rollback": enqueued_after_rollback,
                "welcome_args": sorted(j.args["user_id"] for j in Job.objects.filter(name=send_welcome.name)),
                "ann": ann.pk,
                "report_job": str(Report.objects.get(pk=report.pk).job.id),
                "joined": joined,
                "health": json.loads(health.getvalue()),
            }
        )
    )


main()
