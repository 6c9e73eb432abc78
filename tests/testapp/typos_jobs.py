"""Jobs with annotations, for the enqueue-time type checks (tests/test_enqueue_types.py).

Annotations are strings here (``from __future__ import annotations``), as in most
projects: the checks resolve them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NewType, NotRequired, Optional, TypedDict, Union

from axa_django import JobContext, background_job

if TYPE_CHECKING:
    from decimal import Decimal  # only for type checkers: the check leaves it alone

UserId = NewType("UserId", int)


class Line(TypedDict):
    sku: str
    qty: int
    note: NotRequired[str | None]


class Tree(TypedDict):
    name: str
    kids: list[Tree]


@background_job
def walk(tree: Tree) -> None:
    """A recursive TypedDict: checked at its first level, the rest left alone."""


@background_job
def ship(order_id: int, user_id: int = 0) -> None:
    """The misspelt-argument job."""


@background_job
def charge(user_id: int, amount: float, currency: str, gift: bool, note: str | None = None) -> None:
    """Scalars."""


@background_job
def containers(ids: list[int], prices: dict[str, float], tags: list, meta: dict, lines: list[Line]) -> None:
    """Lists and dicts, bare and parametrised, and a TypedDict inside."""


@background_job
def typing_forms(a: Optional[int], b: Union[int, str], c: Literal["a", "b"], d: UserId) -> None:  # noqa: UP007, UP045
    """typing's spellings."""


@background_job
def left_alone(a: Any, b: object, c: Decimal, d: tuple[int, int], e: int | Any, f: Unknown) -> None:  # noqa: F821
    """Annotations the check does not know, or cannot resolve: any JSON value passes."""


@background_job
def defaults(limit: int = None, *more: int, **named: str) -> None:  # type: ignore[assignment]  # noqa: RUF013
    """A None default takes None; *args and **kwargs items are checked one by one."""


@background_job(takes_context=True)
def with_context(context: JobContext, count: int) -> None:
    """The context parameter is not an argument."""
