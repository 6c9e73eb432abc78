"""axa_django.testing from Django's TestCase and TransactionTestCase (and the docs' TestCase example)."""

from django.contrib.auth.models import User
from django.db import connection
from django.test import TestCase, TransactionTestCase, override_settings

from axa_django.models import Job
from axa_django.testing import JobFailed, assert_enqueued, enqueued_jobs, raise_failures, run_jobs
from tests import docs_examples
from tests.testapp import testing12_jobs as t

# The TestCase example of docs/testing.md, run here as tests of this module.
docs_examples.run_block("shop/tests.py", globals())


def test_every_python_block_of_the_docs_page_runs():
    assert set(docs_examples.blocks()) == {*docs_examples.MODULES, "shop/test_jobs.py", "shop/tests.py"}
    assert {"OrderTests", "CommittedOrderTests"} <= set(globals())


class RunJobsInATestCase(TestCase):
    """Each test starts with no rows: what the one before enqueued and ran was rolled back."""

    def setUp(self):
        self.assertFalse(Job.objects.exists())

    def test_jobs_see_the_tests_uncommitted_rows(self):
        self.assertTrue(connection.in_atomic_block)
        User.objects.create(username="case")
        job = t.greet.perform_later("case", punctuation=".")
        self.assertEqual(assert_enqueued(t.greet, username="case"), job)
        [attempt] = run_jobs()
        self.assertEqual((attempt.status, attempt.result), ("completed", "hello case."))
        self.assertEqual(Job.objects.get(pk=job.pk).status, "completed")

    def test_failures_raise_with_the_jobs_exception(self):
        t.relay.perform_later(1)
        t.explode.perform_later("in a TestCase")
        with self.assertRaises(JobFailed) as failed:
            run_jobs()
        self.assertIsInstance(failed.exception.exception, ValueError)
        self.assertEqual(len(failed.exception.attempts), 3)  # relay(1), explode, relay(0)
        self.assertEqual(enqueued_jobs(), [])

    @override_settings(AXA_DJANGO={"MODE": "immediate"})
    def test_immediate_mode_raises_only_when_asked(self):
        self.assertEqual(t.explode.perform_later("quiet").status, "failed")
        with raise_failures(), self.assertRaises(JobFailed):
            t.explode.perform_later("loud")


class RunJobsInATransactionTestCase(TransactionTestCase):
    def test_jobs_commit_as_a_workers_would(self):
        self.assertTrue(connection.get_autocommit())
        User.objects.create(username="committed")
        t.greet.perform_later("committed")
        t.relay.perform_later(1)
        self.assertEqual(sorted(a.result for a in run_jobs() if a.name == t.relay.name), [0, 1])
        self.assertEqual(set(Job.objects.values_list("status", flat=True)), {"completed"})
