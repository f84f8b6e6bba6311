"""Any value ``to_json`` accepts comes back exactly from every store (MemoryStore, SqlStore on a
SQLite file and on PostgreSQL) as a run input, an output, a step result and a signal payload;
what it refuses (NaN, ±inf, NUL, lone surrogates, integers orjson cannot write) no store is
asked to keep. Exactly: the same types (1 is not 1.0 nor True), the same float bits."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_kit import T0, Backend, mk, put

from flowkit._core import serde as _serde
from flowkit.errors import SerializationError
from flowkit.events import StepCompleted
from flowkit.stores.base import Update

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**65), max_value=2**65)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def exactly(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down, floats by their bits (``-0.0`` too)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return math.copysign(1.0, a) == math.copysign(1.0, b) and a == b
    if isinstance(a, list):
        return len(a) == len(b) and all(exactly(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(exactly(v, b[k]) for k, v in a.items())
    return bool(a == b)


IDS = itertools.count()


def jsonb_loses(value: Any) -> bool:
    """A float PostgreSQL's ``jsonb`` does not give back as a float (a known gap, see
    ``test_jsonb_float_gap``): ``-0.0`` (its numeric has no negative zero) and whole floats
    that orjson writes with an exponent and that read back within 64-bit integers (``1e16``
    comes back as the integer ``10000000000000000``)."""
    if isinstance(value, float):
        whole = value.is_integer() and abs(value) >= 1e16 and -(2**63) <= value < 2**64
        return whole or (value == 0.0 and math.copysign(1.0, value) < 0)
    if isinstance(value, list):
        return any(jsonb_loses(v) for v in value)
    if isinstance(value, dict):
        return any(jsonb_loses(v) for v in value.values())
    return False


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=VALUES)
async def test_what_to_json_accepts_round_trips_through_every_store(
    backend: Backend, value: Any
) -> None:
    try:
        data = _serde.to_json(value)
    except SerializationError:
        return  # refused: no store is asked to keep it
    assert exactly(_serde.loads(_serde.dumps(data)), data)
    if backend.name == "postgres" and jsonb_loses(data):
        return  # (the known gap: test_jsonb_float_gap)
    store = backend.store
    rid = f"p{next(IDS)}"
    await put(store, dataclasses.replace(mk(rid), input=data))
    await store.deliver_signal(rid, "go", data, T0 + 1)
    got = await store.peek_signal(rid, "go")
    assert got is not None and exactly(got.payload, data), got
    step = StepCompleted(pos="1", name="f", result=data, at=T0 + 2)
    await store.commit(rid, None, T0 + 2, Update(events=[step]))
    await store.commit(rid, None, T0 + 3, Update(status=None, output=data))
    run = await store.get_run(rid)
    assert run is not None
    assert exactly(run.input, data), run.input
    assert exactly(run.output, data), run.output
    recorded = [e for e in await store.load_events(rid) if isinstance(e, StepCompleted)]
    assert exactly(recorded[0].result, data), recorded[0].result


@pytest.mark.parametrize(
    "value",
    [1e15, 1e300, 2e19, 2.5e-300, 0.1, 2**64 - 1, -(2**63), "é\U0001f600", {"": [None, {}]}],
)
async def test_edge_values_round_trip_through_every_store(backend: Backend, value: Any) -> None:
    data = _serde.to_json(value)
    rid = f"e{next(IDS)}"
    await put(backend.store, dataclasses.replace(mk(rid), input=data))
    run = await backend.store.get_run(rid)
    assert run is not None and exactly(run.input, data), run.input


@pytest.mark.parametrize("value", [1e16, -3e17, -0.0])
async def test_jsonb_float_gap(backend: Backend, value: Any) -> None:
    """Floats PostgreSQL's ``jsonb`` does not keep exactly (it keeps numbers as ``numeric``):
    exact on MemoryStore and SQLite; a known gap on PostgreSQL, not fixed yet (xfail there
    while the value comes back changed)."""
    rid = f"g{next(IDS)}"
    await put(backend.store, dataclasses.replace(mk(rid), input=_serde.to_json(value)))
    run = await backend.store.get_run(rid)
    assert run is not None
    if backend.name == "postgres" and not exactly(run.input, value):
        pytest.xfail(f"jsonb gave {value!r} back as {run.input!r}")
    assert exactly(run.input, value), run.input
