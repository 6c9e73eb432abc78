"""A workflow (a group of jobs) and the edges between its jobs."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from ..ids import uuid7
from .jobs import Job, JobQuerySet


class Dependency(models.Model):
    """An edge of a workflow: ``child`` runs once ``parent`` has finished; ``done`` once that was counted."""

    id = models.BigAutoField(primary_key=True)
    parent_id = models.UUIDField()
    child_id = models.UUIDField()
    done = models.BooleanField(db_default=False)

    class Meta:
        db_table = "axa_dependency"
        constraints = [models.UniqueConstraint(fields=["parent_id", "child_id"], name="axa_dependency_edge")]
        indexes = [
            models.Index(fields=["child_id", "parent_id"], name="axa_dependency_child"),
            # Edges not yet counted: few, whatever the history (dependencies.SWEEP).
            models.Index(fields=["parent_id"], name="axa_dependency_pending", condition=models.Q(done=False)),
        ]

    def __str__(self) -> str:
        return f"{self.parent_id} -> {self.child_id}"


class Workflow(models.Model):
    """A named group of jobs written together: a ``workflow()`` or a ``batch()``."""

    class Kind(models.TextChoices):
        WORKFLOW = "workflow"
        BATCH = "batch"

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    kind = models.TextField(choices=Kind, default=Kind.WORKFLOW)
    name = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "axa_workflow"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.kind} {self.name or self.id}"

    def jobs(self) -> JobQuerySet:
        """The jobs of this group, callbacks included."""
        return Job.objects.using(self._state.db).filter(workflow_id=self.id)

    def counts(self) -> dict[str, int]:
        """Jobs of this group by status (every status, 0 where none)."""
        found = dict(self.jobs().order_by().values_list("status").annotate(n=models.Count("id")))
        return {status: found.get(status, 0) for status in Job.Status.values}

    def cancel(self) -> int:
        """Cancel every job of this group not yet finished; return how many changed."""
        return self.jobs().cancel()
