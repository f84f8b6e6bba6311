"""The payload fast paths of ``flowkit._core.serde`` and ``event_to_json`` give exactly what the
pydantic way gives: the same digest bytes (recorded in every history, so older runs' digests
stay comparable), the same JSON forms and values, the same errors."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import enum
import hashlib
import math
from typing import Annotated, Any

import orjson
import pydantic
import pydantic_core
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import Field, TypeAdapter

from flowkit._core import serde as _serde
from flowkit._model import history as _history
from flowkit._model.history import step_completed
from flowkit.errors import SerializationError
from flowkit.events import StepCompleted, event_from_json, event_to_json


class Color(enum.Enum):
    RED = "red"
    BLUE = 2


class Level(enum.IntEnum):
    LOW = 1


class Perm(enum.IntFlag):
    R = 4
    W = 2


class Kind(enum.StrEnum):
    A = "a"


class Odd(enum.Enum):
    T = (1, "x")
    O = object()  # noqa: E741


Pair = collections.namedtuple("Pair", "a b")


class Name(str):
    pass


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Model(pydantic.BaseModel):
    a: int
    b: list[str] = []


class Service:
    """An injected object that is not JSON (counts by its type name)."""


def reference_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The digest as flowkit always computed it: pydantic's JSON form, canonical bytes."""
    data = pydantic_core.to_jsonable_python(
        [list(args), kwargs], fallback=lambda o: f"<{type(o).__qualname__}>"
    )
    return hashlib.sha256(_serde.dumps(data)).hexdigest()[:12]


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except Exception as exc:
        return "raised", type(exc)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
others = st.one_of(
    st.uuids(),
    st.sampled_from(
        [Color.RED, Color.BLUE, Level.LOW, Perm.R | Perm.W, Kind.A, Odd.T, Odd.O, Name("n")]
    ),
    st.sampled_from([Service(), Pair(1, "b"), {Kind.A: 1}, {Name("k"): 2}, {True: 3}]),
    st.datetimes(timezones=st.sampled_from([None, datetime.UTC])),
    st.dates(),
    st.builds(Point, st.integers(-5, 5), st.floats(allow_nan=False)),
    st.builds(Model, a=st.integers(-5, 5)),
    st.binary(max_size=4),
)
values = st.recursive(
    st.one_of(scalars, others),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=3), inner, max_size=3),
        st.dictionaries(st.integers(0, 3), inner, max_size=2),  # (non-str keys)
    ),
    max_leaves=8,
)


@settings(max_examples=300)
@given(
    args=st.lists(values, max_size=3).map(tuple),
    kwargs=st.dictionaries(st.text(max_size=3), values, max_size=2),
)
def test_digest_is_the_pydantic_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    assert outcome(_serde.digest, args, kwargs) == outcome(reference_digest, args, kwargs)


def test_digest_of_common_arguments_is_unchanged() -> None:
    # digests recorded by earlier flowkit versions (the same arguments, the same digest)
    assert _serde.digest((42,), {}) == "9e72457d0795"
    assert _serde.digest((1.5, "x", None, True, [1, {"b": 2, "a": 1}]), {"k": 3}) == (
        "5a5e9b15c0ff"
    )


ADAPTERS = [
    _serde.ANY_ADAPTER,
    TypeAdapter(int),
    TypeAdapter(str),
    TypeAdapter(bool),
    TypeAdapter(float),
    TypeAdapter(type(None)),
    TypeAdapter(Annotated[int, Field(gt=0)]),
    TypeAdapter(int | None),
    TypeAdapter(Color),
]
SAMPLES: list[Any] = [
    0,
    -3,
    2**63 - 1,
    2**64 - 1,
    2**64,
    -(2**63),
    -(2**63) - 1,
    True,
    False,
    None,
    "",
    "7",
    "é",
    "\ud800",  # (a lone surrogate: not UTF-8, orjson refuses it)
    "a\x00b",  # (NUL: PostgreSQL cannot store it; refused everywhere)
    "\x00",
    {"k\x00": 1},
    [1, [math.nan]],
    {"a": -math.inf},
    1.5,
    -0.0,
    math.inf,
    math.nan,
    Level.LOW,
    Name("x"),
    Color.RED,
    "red",
    [1, 2],
    {"a": 1},
]


def _unstorable(value: Any) -> bool:
    """NaN, ±inf or a string with NUL anywhere in ``value`` (keys included)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_unstorable(k) or _unstorable(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_unstorable(v) for v in value)
    return False


def slow_to_json(value: Any, adapter: TypeAdapter[Any]) -> Any:
    """``_serde.to_json`` without its fast path: pydantic's JSON form, refused when orjson
    cannot write it or it holds what no store keeps exactly (NaN, inf, NUL)."""
    try:
        data = adapter.dump_python(value, mode="json")
        orjson.dumps(data)
    except Exception as exc:
        raise SerializationError(str(exc)) from exc
    if _unstorable(data) or _unstorable(adapter.dump_python(value, mode="python")):
        raise SerializationError("NaN, inf or NUL")
    return data


def same(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    """Equal outcomes, with nan equal to nan and the exact types compared (1 is not True)."""
    if a[0] != b[0]:
        return False
    x, y = a[1], b[1]
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return bool(type(x) is type(y) and x == y)


@pytest.mark.filterwarnings("ignore::UserWarning")  # (pydantic warns on mismatched types)
@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: str(a.core_schema.get("type")))
def test_to_json_and_from_json_match_pydantic(adapter: TypeAdapter[Any]) -> None:
    for value in SAMPLES:
        fast = outcome(_serde.to_json, value, adapter)
        slow = outcome(slow_to_json, value, adapter)
        assert same(fast, slow), (value, fast, slow)
        fast = outcome(_serde.from_json, value, adapter)
        slow = outcome(adapter.validate_python, value)
        assert same(fast, slow), (value, fast, slow)


@pytest.mark.parametrize(
    "result",
    [None, True, 3, 2**64, -1.25, math.nan, math.inf, "s", "\ud800", [1, "a"], {"k": [None]}],
)
@pytest.mark.parametrize("at", [1767225600.123456, 0.0])
def test_event_to_json_of_a_step_is_pydantics(result: Any, at: float) -> None:
    ev = StepCompleted(pos="1.2", name="f", attempt=2, result=result, args_digest="ab", at=at)
    fast, slow = event_to_json(ev), ev.model_dump(mode="json")
    assert outcome(_serde.dumps, fast) == outcome(_serde.dumps, slow)
    assert list(fast) == list(slow)  # (SQLite stores the body in this order)
    assert event_to_json(ev.model_copy(update={"seq": 7}))["seq"] == 7


@pytest.mark.parametrize("result", [None, 3, "s", [1, {"a": None}], {"k": 1.5}])
def test_a_step_record_built_without_validation_is_the_validated_one(result: Any) -> None:
    assert _history._UNCHECKED  # (this pydantic: the path under test is taken)
    args: dict[str, Any] = {
        "pos": "2.1", "name": "f", "attempt": 3, "result": result, "args_digest": "ab", "at": 2.5
    }  # fmt: skip
    fast, slow = step_completed(**args), StepCompleted(**args)
    assert fast == slow and type(fast) is StepCompleted
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.model_dump(mode="json") == slow.model_dump(mode="json")
    assert event_from_json(event_to_json(fast)) == slow
    assert fast.model_copy(update={"seq": 4}).seq == 4
    with pytest.raises(pydantic.ValidationError):
        fast.pos = "x"  # type: ignore[misc]  # (frozen, as validated ones are)
    # values the engine did not make go through validation
    odd = step_completed("1", "f", 1, None, None, 5)  # type: ignore[arg-type]  # (an int clock)
    assert odd == StepCompleted(pos="1", name="f", result=None, at=5.0)
    assert type(odd.at) is float
