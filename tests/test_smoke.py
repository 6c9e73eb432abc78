import pytest

from axa_django.worker import Worker
from tests.testapp import jobs


@pytest.mark.django_db(transaction=True)
def test_smoke():
    job = jobs.add.perform_later(2, b=3)
    assert job.status == "queued"
    assert job.args == {"a": 2, "b": 3}
    assert Worker(concurrency=2, burst=True, install_signals=False).run() == 0
    job.refresh_from_db()
    assert job.status == "completed", job.error
    assert job.result == 5
