"""One id, one row: the ORM's reads and writes by id follow a job's row wherever it moved.

A job's row moves twice in its life: into ``axa_history`` when it finishes, and back
into ``axa_queue`` when it is retried (both tables are read as ``axa_queue``, the
history inheriting it). Under READ COMMITTED, a locking statement that waits on the
mover's lock then finds the row deleted and cannot see its new copy, which committed
after the statement began: an UPDATE touches nothing, ``select_for_update().get()``
raises DoesNotExist, and Django's ``save()``, finding nothing to update, inserted the
stale row back (two rows with one id). Here every write by id runs again, as a new
statement with a fresh snapshot, when it found fewer rows than it named; ``save()``
writes only the fields the caller changed since the row was read, and never inserts
a row whose id is taken.

A delete also settles the children of the workflow parents it deletes, in its own
transaction: a parent deleted before it ended would otherwise hold its children
``waiting`` for ever (the workers' sweep settles only parents that still exist).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any, TypeVar

from django.apps import apps
from django.core import checks
from django.core.exceptions import EmptyResultSet, ValidationError
from django.db import DatabaseError, IntegrityError, connections, models, router, transaction
from django.db.models import sql
from django.db.models.deletion import Collector
from django.db.models.expressions import Col
from django.db.models.lookups import Exact, In
from django.db.models.query_utils import DeferredAttribute
from django.db.models.sql.where import AND

from .. import dependencies

# Statements a write by id runs at most: each retry waits for the mover's lock, then sees
# where the row went. A row retried and finished again meanwhile moves twice.
TRIES = 3

# Fields whose values are mutable (JSON): their value at load is kept as a copy.
_MUTABLE = (dict, list)

# A row's state as a delete locked it: (id, status, has_children).
Locked = tuple[Any, str, bool]

# Django's fast delete (one DELETE: no signal receiver, no relation to follow), returning
# how many rows it deleted and the parents among them with the status each had as deleted
# (after any wait on its lock): exact, with no read before the delete to fall out of date.
_DELETE_RETURNING = (
    "WITH axa_gone AS ({delete} RETURNING id, status, has_children) "
    "SELECT count(*), array_agg(id) FILTER (WHERE has_children), array_agg(status) FILTER (WHERE has_children) "
    "FROM axa_gone"
)


def lock_rows(model: type[models.Model], using: str, targets: Iterable[Any]) -> list[Locked]:
    """Lock the rows of ids ``targets`` where they are now, in id order (inside a transaction); return each
    one's state. A row that moved while this waited on its lock is looked for again by a fresh statement."""
    targets = set(targets)
    rows = model._base_manager.using(using).filter(pk__in=targets).order_by("pk").select_for_update(of=("self",))
    found: list[Locked] = []
    for _ in range(TRIES):
        again = list(rows.values_list("pk", "status", "has_children"))
        if len(again) <= len(found):
            break
        found = again
        if len(found) >= len(targets):
            break
    return found


def settle_deleted(using: str, rows: Iterable[Locked]) -> None:
    """Settle the children of the parents among ``rows`` that are gone now (dependencies.SETTLE_GONE)."""
    parents = [(job_id, status) for job_id, status, has_children in rows if has_children]
    if parents:
        with connections[using].cursor() as cursor:
            dependencies.settle_gone(cursor, parents)


class JobGone(DatabaseError):
    """``save()`` found no row for this job: it was deleted, pruned or dropped by RETENTION. Nothing was written."""


def pk_targets(query: Any) -> set[Any] | None:
    """The ids a query names as ``pk=`` / ``pk__in=`` at its top level; None if it selects otherwise."""
    where = query.where
    if where.connector != AND or where.negated:
        return None
    pk = query.model._meta.pk
    for child in where.children:
        if not isinstance(child, Exact | In) or not isinstance(child.lhs, Col) or child.lhs.target != pk:
            continue
        values = child.rhs if isinstance(child, In) else [child.rhs]
        if not isinstance(values, Iterable) or isinstance(values, str | bytes):
            continue
        try:
            return {pk.to_python(value) for value in values}
        except (TypeError, ValidationError):
            return None  # an expression or a subquery: not a plain list of ids
    return None


def _expected(query: Any, targets: set[Any]) -> int:
    """Rows a query by these ids should find at most (a slice may cap it, as ``get()`` does)."""
    if query.high_mark is None:
        return len(targets)
    return min(len(targets), query.high_mark - query.low_mark)


M = TypeVar("M", bound=models.Model)


class MovingQuerySet(models.QuerySet[M]):
    """A queryset whose locking reads and writes by id find a row that moved during the statement."""

    def _fetch_all(self) -> None:
        if self._result_cache is None and self.query.select_for_update:
            targets = pk_targets(self.query)
            if targets:
                rows = list(self._iterable_class(self))
                for _ in range(TRIES - 1):
                    if len(rows) >= _expected(self.query, targets):
                        break
                    # Rows locked by the first statement stay locked; a fresh snapshot sees where the others went.
                    again = list(self._iterable_class(self))
                    if len(again) <= len(rows):
                        break
                    rows = again
                self._result_cache = rows
        super()._fetch_all()

    def _lock_targets(self) -> list[Locked]:
        """Lock the rows this queryset names by id, where they are now (call inside a transaction).

        The ids alone (an annotated or grouped queryset cannot be locked as it is), in id order.
        """
        return lock_rows(self.model, self.db, pk_targets(self.query) or set())

    def _by_id(self) -> bool:
        """Whether this queryset names its rows by id, in a shape a locking read can take first."""
        query = self.query
        return bool(pk_targets(query)) and not (query.is_sliced or query.distinct or query.combinator)

    def update(self, **kwargs: Any) -> int:
        """Update the rows; rows named by id are found even while they move (locked first, then written)."""
        if not self._by_id():
            return super().update(**kwargs)
        with transaction.atomic(using=self.db, savepoint=False):
            self._lock_targets()
            return super().update(**kwargs)

    update.alters_data = True  # type: ignore[attr-defined]

    def delete(self) -> tuple[int, dict[str, int]]:
        """Delete the rows; rows named by id are found even while they move (locked first, then deleted).

        The children of the workflow parents deleted are settled in the same transaction.
        """
        query = self.query
        if query.is_sliced or query.distinct_fields or query.combinator or self._fields is not None:
            return super().delete()  # Django refuses these
        with transaction.atomic(using=self.db, savepoint=False):
            if Collector(using=self.db, origin=self).can_fast_delete(self):
                if self._by_id():
                    self._lock_targets()
                return super().delete()  # one DELETE: _raw_delete settles the children
            # Django reads the rows, then deletes them by id: they are locked first, so each is
            # deleted as it was read.
            jobs = self
            if not self._by_id():
                jobs = self.filter(pk__in=list(self.values_list("pk", flat=True)))
            rows = jobs._lock_targets()
            deleted = super(MovingQuerySet, jobs).delete()
            settle_deleted(self.db, rows)
            return deleted

    delete.alters_data = True  # type: ignore[attr-defined]
    delete.queryset_only = True  # type: ignore[attr-defined]

    def _raw_delete(self, using: str) -> int:
        """Django's fast delete, as one statement that also names the parents it deleted, whose children
        are settled next (the caller's transaction)."""
        query = self.query.clone()
        query.__class__ = sql.DeleteQuery
        try:
            statement, params = query.get_compiler(using).as_sql()
        except EmptyResultSet:
            return 0
        if not statement:
            return 0
        with connections[using].cursor() as cursor:
            cursor.execute(_DELETE_RETURNING.replace("{delete}", statement), params)
            count, ids, statuses = cursor.fetchone()
            if ids:
                dependencies.settle_gone(cursor, zip(ids, statuses, strict=True))
        return int(count)

    _raw_delete.alters_data = True  # type: ignore[attr-defined]

    def bulk_create(self, objs: Iterable[Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Insert new rows; an id already in use anywhere (the history included) is refused, or skipped
        with ``ignore_conflicts`` (the table's own key sees only ``axa_queue``, not the history)."""
        objs = list(objs)
        ids = [obj.pk for obj in objs if obj.pk is not None]
        found = self.model._base_manager.using(self.db).filter(pk__in=ids)
        if kwargs.get("update_conflicts"):
            # An upsert updates a row of axa_queue itself (its key sees it); one in the history it would duplicate.
            found = found.extra(where=["tableoid <> 'axa_queue'::regclass"])
        taken = set(found.values_list("pk", flat=True))
        if taken:
            if kwargs.get("ignore_conflicts"):
                objs = [obj for obj in objs if obj.pk not in taken]
            else:
                raise IntegrityError(_taken_message(sorted(taken, key=str)[0]))
        return super().bulk_create(objs, *args, **kwargs)


def _taken_message(job_id: Any) -> str:
    return (
        f"job {job_id} exists already (in axa_queue or the history): a job's id is never written twice; "
        "load the job to change it, or enqueue a new one"
    )


def _copy(value: Any) -> Any:
    if not isinstance(value, _MUTABLE):
        return value
    try:
        return copy.deepcopy(value)
    except RecursionError:
        # JSON nested deeper than a copy can follow (json decodes about twice as deep):
        # kept as is, so a change made in place to it is not seen; loading never fails.
        return value


def _snapshot(values: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    return {name: _copy(values[name]) for name in names}


class _Fetched(DeferredAttribute):
    """A deferred field that, once fetched for many instances at once (Django 6.1's FETCH_PEERS),
    takes the fetched values as loaded: else save() took them for the caller's changes and
    wrote back a status read long before (a finished job queued again)."""

    def fetch_many(self, instances: list[Any]) -> None:
        attname = self.field.attname
        missing = [instance for instance in instances if attname not in instance.__dict__]
        super().fetch_many(instances)  # type: ignore[misc]
        for instance in missing:
            if attname in instance.__dict__:
                instance.__dict__.setdefault("_loaded", {}).update(_snapshot(instance.__dict__, [attname]))


def track_fetches(model: type[models.Model]) -> None:
    """Have ``model``'s deferred fields record what a fetch of many instances loads (``_Fetched``)."""
    for field in model._meta.concrete_fields:
        if type(model.__dict__.get(field.attname)) is DeferredAttribute:
            setattr(model, field.attname, _Fetched(field))


def mark_loaded(job: Any) -> None:
    """Take ``job``'s present values as those of its row, so ``save()`` writes only what changes after."""
    names = [field.attname for field in job._meta.concrete_fields if field.attname in job.__dict__]
    job._loaded = _snapshot(job.__dict__, names)


class StaysPut(models.Model):
    """Save, delete and refresh by id, following the row wherever it moved; ``save()`` never inserts a row twice."""

    _loaded: dict[str, Any]

    class Meta:
        abstract = True

    @classmethod
    def from_db(cls, db: str | None, field_names: Any, values: Any, **kwargs: Any) -> Any:
        # kwargs: Django 6.1's fetch_mode.
        instance = super().from_db(db, field_names, values, **kwargs)
        instance._loaded = _snapshot(instance.__dict__, field_names)
        return instance

    def changed_fields(self) -> list[str]:
        """The fields assigned a new value (or changed in place) since the row was read."""
        loaded = self.__dict__.get("_loaded")
        changed = []
        for field in self._meta.concrete_fields:
            if field.primary_key or field.attname not in self.__dict__:
                continue
            if loaded is None or field.attname not in loaded:
                changed.append(field.name)
                continue
            now, then = self.__dict__[field.attname], loaded[field.attname]
            if now is not then and (type(now) is not type(then) or now != then):
                changed.append(field.name)
        return changed

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Insert a new job, or write the fields changed since the row was read, wherever the row is now.

        Nothing changed, nothing is written. A job whose row is gone raises ``JobGone``:
        it is never inserted again (the stale copy would run the job twice).
        """
        if not self._state.adding and not kwargs.get("force_insert") and kwargs.get("update_fields") is None:
            changed = self.changed_fields()
            if not changed:
                return
            kwargs["update_fields"] = changed
        super().save(*args, **kwargs)
        mark_loaded(self)

    save.alters_data = True  # type: ignore[attr-defined]

    def _do_update(
        self, base_qs: Any, using: Any, pk_val: Any, values: Any, update_fields: Any, forced: Any, *args: Any
    ) -> Any:
        # Without update_fields or force_update, Django inserts when nothing was updated (a
        # raw save: loaddata); _do_insert then refuses an id in use. One try is enough there.
        fields_given = update_fields is not None or forced
        for _ in range(TRIES if fields_given else 1):
            updated = super()._do_update(base_qs, using, pk_val, values, update_fields, forced, *args)  # type: ignore[misc]
            if updated or not values:
                return updated
        if not fields_given:
            return updated
        if base_qs.filter(pk=pk_val).exists():
            raise DatabaseError(
                f"job {pk_val} was not saved: the database skipped the update (the schema's axa_queue_requeue "
                "guard leaves a running job of a live worker running when its start is cleared); nothing was written"
            )
        raise JobGone(
            f"job {pk_val} was not saved: its row no longer exists (deleted, pruned, or dropped with the history "
            "by RETENTION); nothing was written. A job is never inserted again by save(): enqueue a new one"
        )

    def _do_insert(self, manager: Any, using: Any, *args: Any, **kwargs: Any) -> Any:
        # The primary key is axa_queue's own: a history row of this id would not stop the INSERT.
        if self.pk is not None and type(self)._base_manager.using(using).filter(pk=self.pk).exists():
            raise IntegrityError(_taken_message(self.pk))
        return super()._do_insert(manager, using, *args, **kwargs)  # type: ignore[misc]

    def delete(self, using: Any = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        """Delete this job's row, wherever it is now (locked first: a row moving meanwhile is waited for)."""
        using = using or router.db_for_write(self.__class__, instance=self)
        with transaction.atomic(using=using, savepoint=False):
            rows = lock_rows(type(self), using, [self.pk])
            deleted = super().delete(using=using, keep_parents=keep_parents)
            settle_deleted(using, rows)  # a workflow parent's children
            return deleted

    delete.alters_data = True  # type: ignore[attr-defined]

    def refresh_from_db(self, using: Any = None, fields: Any = None, **kwargs: Any) -> None:
        super().refresh_from_db(using=using, fields=fields, **kwargs)
        names = {field.attname for field in self._meta.concrete_fields if field.attname in self.__dict__}
        if fields is not None:
            wanted = set()
            for name in fields:
                field = self._meta.get_field(name)
                wanted.add(getattr(field, "attname", name))
            names &= wanted
        loaded = self.__dict__.setdefault("_loaded", {})
        loaded.update(_snapshot(self.__dict__, names))


@checks.register(checks.Tags.models)
def check_references(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Refuse (E008) a relation to Job backed by a database constraint: a job's row moves, and the
    constraint refuses the move (the worker's finish, a cancel, the rescue) or points at nothing."""
    return reference_problems(apps.get_models())


def reference_problems(models: Iterable[Any]) -> list[checks.CheckMessage]:
    """E008 for each relation of ``models`` to Job that a database constraint backs."""
    found: list[checks.CheckMessage] = []
    for model in models:
        for field in [*model._meta.local_fields, *model._meta.local_many_to_many]:
            target = getattr(field.remote_field, "model", None)
            if not isinstance(target, type) or getattr(target._meta, "db_table", None) != "axa_queue":
                continue
            # A ForeignKey holds db_constraint itself; a ManyToManyField on its remote_field.
            constrained = getattr(field, "db_constraint", getattr(field.remote_field, "db_constraint", False))
            if model._meta.db_table == "axa_queue" or not constrained:
                continue
            found.append(
                checks.Error(
                    f"{model._meta.label}.{field.name} points at a job with a database constraint: a job's row "
                    "moves into the history when it finishes (and out when retried), which that constraint "
                    "refuses, and RETENTION drops the history's rows without asking it",
                    hint=(
                        "declare it with db_constraint=False; then a reference can outlive its job (RETENTION): "
                        "read it as the _id value, or catch Job.DoesNotExist"
                    ),
                    obj=field,
                    id="axa_django.E008",
                )
            )
    return found
