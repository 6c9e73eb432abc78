"""Enqueue checks arguments against the job's annotations and names misspelt arguments (issue 25)."""

from __future__ import annotations

import inspect

import pytest

from axa_django import arguments, background_job
from axa_django.models import Job
from tests.conftest import AXA_APPS
from tests.testapp import typos_jobs as t

JOB = "tests.testapp.typos_jobs"

# -- misspelt arguments ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (
            (),
            {"ordr_id": 5},
            f"job '{JOB}.ship': unexpected argument 'ordr_id' (did you mean 'order_id'?); "
            "its parameters are order_id, user_id",
        ),
        ((5,), {"usr_id": 1}, "unexpected argument 'usr_id' (did you mean 'user_id'?)"),
        ((), {"ordr_id": 5, "colour": 1}, "unexpected arguments 'ordr_id' (did you mean 'order_id'?), 'colour';"),
    ],
)
def test_a_misspelt_argument_is_named_with_the_closest_parameter(args, kwargs, message):
    with pytest.raises(TypeError) as raised:
        t.ship.perform_later(*args, **kwargs)
    assert message in str(raised.value)
    assert "missing" not in str(raised.value)


def test_a_missing_argument_is_still_said_as_missing():
    with pytest.raises(TypeError, match=f"job '{JOB}.ship': missing a required argument: 'order_id'"):
        t.ship.perform_later(user_id=1)


# -- type checks -----------------------------------------------------------------------


def bind(job, *args, **kwargs):
    return arguments.bind(job.signature, job.name, args, kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"user_id": "abc"}, f"argument 'user_id' of job '{JOB}.charge' must be int, not str 'abc'"),
        (
            {"user_id": True},
            "argument 'user_id' of job '{}' must be int, not bool True; bool is not accepted as a number",
        ),
        ({"user_id": 5.0}, "argument 'user_id' of job '{}' must be int, not float 5.0"),
        ({"amount": "9.50"}, "argument 'amount' of job '{}' must be float, not str '9.50'"),
        ({"amount": False}, "argument 'amount' of job '{}' must be float, not bool False"),
        ({"currency": None}, "argument 'currency' of job '{}' must be str, not None"),
        ({"gift": 1}, "argument 'gift' of job '{}' must be bool, not int 1"),
        ({"note": 3}, "argument 'note' of job '{}' must be str | None, not int 3"),
    ],
)
def test_scalars_must_match_their_annotation(kwargs, message):
    call = {"user_id": 1, "amount": 2.5, "currency": "EUR", "gift": False} | kwargs
    with pytest.raises(TypeError) as raised:
        bind(t.charge, **call)
    assert message.replace("'{}'", f"'{JOB}.charge'") in str(raised.value)


def test_values_that_fit_pass_unchanged_and_int_is_a_float():
    call = {"user_id": 1, "amount": 2, "currency": "EUR", "gift": True, "note": None}
    assert bind(t.charge, **call) == call
    assert bind(t.charge, 1, 2.5, "EUR", False, "hi") == {
        "user_id": 1,
        "amount": 2.5,
        "currency": "EUR",
        "gift": False,
        "note": "hi",
    }


GOOD = {
    "ids": [1, 2],
    "prices": {"a": 1.5, "b": 2},
    "tags": ["x", 1, None],
    "meta": {"any": [1, "x"]},
    "lines": [{"sku": "A", "qty": 1}, {"sku": "B", "qty": 2, "note": None}],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ids": (1, 2)}, "argument 'ids' of job '{}' is a tuple, which is not JSON"),  # check_json first
        ({"ids": [1, "2"]}, "argument 'ids' of job '{}'[1] must be int, not str '2'"),
        ({"ids": {"a": 1}}, "argument 'ids' of job '{}' must be list[int], not dict {'a': 1}"),
        ({"prices": {"a": "1.5"}}, "argument 'prices' of job '{}'['a'] must be float, not str '1.5'"),
        ({"prices": [1.5]}, "argument 'prices' of job '{}' must be dict[str, float], not list [1.5]"),
        ({"tags": "x"}, "argument 'tags' of job '{}' must be list, not str 'x'"),
        ({"meta": []}, "argument 'meta' of job '{}' must be dict, not list []"),
        ({"lines": [{"sku": "A"}]}, "argument 'lines' of job '{}'[0] is missing the key 'qty', which Line requires"),
        (
            {"lines": [{"sku": "A", "qty": 1, "qyt": 2}]},
            "argument 'lines' of job '{}'[0] has the key 'qyt', which Line does not declare (did you mean 'qty'?)",
        ),
        ({"lines": [{"sku": "A", "qty": "1"}]}, "argument 'lines' of job '{}'[0]['qty'] must be int, not str '1'"),
        ({"lines": [{"sku": "A", "qty": 1, "note": 5}]}, "[0]['note'] must be str | None, not int 5"),
        ({"lines": ["A"]}, "argument 'lines' of job '{}'[0] must be Line, not str 'A'"),
    ],
)
def test_lists_dicts_and_typed_dicts_are_checked_inside(change, message):
    with pytest.raises(TypeError) as raised:
        bind(t.containers, **(GOOD | change))
    assert message.replace("'{}'", f"'{JOB}.containers'") in str(raised.value)


def test_containers_that_fit_pass():
    assert bind(t.containers, **GOOD) == GOOD
    assert bind(t.containers, ids=[], prices={}, tags=[], meta={}, lines=[]) is not None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"a": "1"}, "argument 'a' of job '{}' must be int | None, not str '1'"),
        ({"b": 1.5}, "argument 'b' of job '{}' must be int | str, not float 1.5"),
        ({"c": "c"}, "argument 'c' of job '{}' must be 'a' or 'b', not str 'c'"),
        ({"d": "7"}, "argument 'd' of job '{}' must be int, not str '7'"),  # NewType: its supertype
    ],
)
def test_typing_forms_are_checked(change, message):
    good = {"a": None, "b": "x", "c": "a", "d": 7}
    assert bind(t.typing_forms, **good) == good
    with pytest.raises(TypeError) as raised:
        bind(t.typing_forms, **(good | change))
    assert message.replace("'{}'", f"'{JOB}.typing_forms'") in str(raised.value)


def test_unknown_and_unresolvable_annotations_are_left_alone():
    weird = {"a": "x", "b": [1], "c": "1.5", "d": [1, 2, 3], "e": {"k": None}, "f": 1.5}
    assert bind(t.left_alone, **weird) == weird


def test_a_none_default_takes_none_and_star_arguments_are_checked_item_by_item():
    assert bind(t.defaults, None, 1, 2, x="a") == {"limit": None, "more": [1, 2], "named": {"x": "a"}}
    with pytest.raises(TypeError, match=r"argument 'limit' of job '.*defaults' must be int or None, not str 'x'"):
        bind(t.defaults, "x")
    with pytest.raises(TypeError, match=r"argument 'more' of job '.*defaults'\[1\] must be int, not str '2'"):
        bind(t.defaults, 0, 1, "2")
    with pytest.raises(TypeError, match=r"argument 'named' of job '.*defaults'\['y'\] must be str, not int 1"):
        bind(t.defaults, y=1)


def test_the_context_parameter_is_not_checked_and_the_others_are():
    assert bind(t.with_context, count=1) == {"count": 1}
    with pytest.raises(TypeError, match=r"argument 'count' of job '.*with_context' must be int, not str"):
        bind(t.with_context, count="1")


def test_a_recursive_typed_dict_is_checked_at_its_first_level():
    assert bind(t.walk, {"name": "a", "kids": [{"anything": 1}]}) == {"tree": {"name": "a", "kids": [{"anything": 1}]}}
    with pytest.raises(TypeError, match=r"argument 'tree' of job '.*walk'\['kids'\] must be list\[Tree\], not int 1"):
        bind(t.walk, {"name": "a", "kids": 1})


# -- through perform_later: nothing written -----------------------------------------


@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_perform_later_many_using_and_enqueue_by_name_check_types_and_write_nothing():
    with pytest.raises(TypeError, match=f"item 1: argument 'user_id' of job '{JOB}.ship' must be int, not str 'abc'"):
        t.ship.perform_later_many([{"order_id": 1}, {"order_id": 2, "user_id": "abc"}])
    with pytest.raises(TypeError, match=r"item 0: job '.*ship': unexpected argument 'ordr_id' \(did you mean"):
        t.ship.perform_later_many([{"ordr_id": 1}])
    with pytest.raises(TypeError, match=r"argument 'order_id' of job .* must be int, not str '5'"):
        t.ship.using(queue="emails", priority=3).perform_later("5")
    from axa_django import enqueue

    with pytest.raises(TypeError, match=r"argument 'order_id' of job .* must be int, not None"):
        enqueue(f"{JOB}.ship", order_id=None)
    assert not Job.objects.exists()
    job = t.ship.using(queue="emails").perform_later(5, user_id=7)
    assert Job.objects.get(pk=job.pk).args == {"order_id": 5, "user_id": 7}


def test_a_job_defined_later_than_its_annotations_names_checks_them():
    # The annotations name a class defined after the job: resolved at decoration they
    # fail as a whole, so each is resolved on its own and the resolvable ones are checked.
    namespace: dict = {}
    exec(
        "from __future__ import annotations\n"
        "from axa_django import background_job\n"
        "@background_job(name='tests.typos.later')\n"
        "def later(a: int, b: Later) -> None: ...\n"
        "class Later: ...\n",
        namespace,
    )
    job = namespace["later"]
    assert arguments.bind(job.signature, job.name, (1, "x"), {}) == {"a": 1, "b": "x"}
    with pytest.raises(TypeError, match=r"argument 'a' of job 'tests\.typos\.later' must be int, not str"):
        arguments.bind(job.signature, job.name, ("1", "x"), {})


def test_an_unregistered_signature_binds_without_type_checks():
    def plain(a: int) -> None: ...

    assert arguments.bind(inspect.signature(plain), "plain", ("x",), {}) == {"a": "x"}


def test_background_job_builds_the_checks_once(monkeypatch):
    calls = []
    original = arguments.type_checks

    def counting(func, signature):
        calls.append(func)
        return original(func, signature)

    monkeypatch.setattr(arguments, "type_checks", counting)

    @background_job(name="tests.typos.once")
    def once(a: int) -> None: ...

    for _ in range(3):
        arguments.bind(once.signature, once.name, (1,), {})
    assert len(calls) == 1
