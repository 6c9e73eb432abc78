"""Signals sent as jobs move through their lifecycle.

``job_enqueued(sender=JobFunction|None, job=Job)`` after a row is written (in the
caller's transaction); ``job_started(sender=JobFunction, job_id, name, attempt)`` when
a worker starts a job; ``job_finished(sender=JobFunction, job_id, name, attempt,
status, error, result)`` once its outcome is written. ``sender`` is None for a job
enqueued by name that this process does not define.
"""

from django.dispatch import Signal

job_enqueued = Signal()
job_started = Signal()
job_finished = Signal()
