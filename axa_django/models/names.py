"""The Job names page's kept figures: per (span, job name) counts and a duration histogram, and its admin entry."""

from __future__ import annotations

from typing import Any

from django.db import models

from .jobs import Job


class IntArrayField(models.Field):
    """A PostgreSQL array of integers (``smallint[]``, ``bigint[]``), read and written as a list.

    Not django.contrib.postgres's ArrayField: Django 6.1 refuses that field unless its
    app is installed, which a job queue should not ask of a project.
    """

    def __init__(self, *args: Any, element: str = "bigint", **kwargs: Any) -> None:
        self.element = element
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        kwargs["element"] = self.element
        return name, path, args, kwargs

    def db_type(self, connection: Any) -> str:
        return f"{self.element}[]"


class NameSpan(models.Model):
    """A past span of time (a 5-minute slot or an hour, UTC) whose jobs were counted into NameStat, once."""

    pk = models.CompositePrimaryKey("minutes", "start")
    minutes = models.SmallIntegerField()
    start = models.DateTimeField()

    class Meta:
        db_table = "axa_name_span"
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.start:%Y-%m-%d %H:%M%z} ({self.minutes} min)"


class NameStat(models.Model):
    """Jobs of one name that finished (completed or failed) in one kept span, and their run times.

    ``bins`` and ``counts`` are a sparse histogram of the final attempt's run time
    (started_at to finished_at): ``counts[i]`` jobs fell in bin ``bins[i]`` of the
    log-spaced bins of ``ops/names.py``. Histograms add up, so any run of spans gives
    its percentiles; ``max_seconds`` is exact.
    """

    pk = models.CompositePrimaryKey("minutes", "start", "name")
    minutes = models.SmallIntegerField()
    start = models.DateTimeField()
    name = models.TextField()
    completed = models.BigIntegerField()
    failed = models.BigIntegerField()
    retried = models.BigIntegerField()
    max_seconds = models.FloatField(null=True)
    bins = IntArrayField(element="smallint")
    counts = IntArrayField(element="bigint")

    class Meta:
        db_table = "axa_name_stat"
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.name} {self.start:%Y-%m-%d %H:%M%z} ({self.minutes} min): {self.completed} completed"


class JobNames(Job):
    """The Job names page's admin entry; it lists no rows of its own."""

    class Meta:
        proxy = True
        app_label = "axa_django"
        verbose_name = "job names"
        verbose_name_plural = "job names"
        default_permissions = ()
