"""Checks of the limits every store keeps (``flowkit.stores.limits``, docs/stores.md "Limits"):
identifiers over their length or holding NUL, payloads over the size limit and values no store
keeps exactly (NaN, ±inf, NUL) are refused with a typed error, and nothing is written."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from flowkit.errors import InvalidInputError, SerializationError
from flowkit.events import SignalReceived, StepCompleted
from flowkit.stores.base import Store, Update
from flowkit.stores.limits import (
    MAX_RUN_ID_LENGTH,
    MAX_SIGNAL_NAME_LENGTH,
    MAX_SINGLETON_KEY_LENGTH,
    MAX_TAG_LENGTH,
    MAX_WORKFLOW_NAME_LENGTH,
    payload_limit,
)

from ._registry import check
from ._support import (
    T0,
    S,
    StoreFactory,
    expect_eq,
    expect_raises,
    expect_unchanged,
    get,
    make_store,
    mk,
    put,
    started,
    state,
)


async def _refused_create(store: Store, run: Any, error: type[Exception], what: str) -> None:
    """``create_run(run)`` raises ``error`` and writes nothing."""
    before = await store.list_runs()
    await expect_raises(error, store.create_run(run, started(run)), f"create_run with {what}")
    expect_eq(await store.list_runs(), before, f"runs after the refused create_run ({what})")


@check()
async def check_identifier_limits(factory: StoreFactory) -> None:
    """Identifiers at their limits are kept exactly; one character longer, holding NUL or a
    lone surrogate, ``create_run`` raises ``InvalidInputError`` and writes nothing (run id,
    workflow name and version, tag, singleton key)."""
    s = await make_store(factory)
    longest = "r" * MAX_RUN_ID_LENGTH
    await put(s, mk(longest, tags=("t" * MAX_TAG_LENGTH,)))
    await put(s, mk("é" * MAX_RUN_ID_LENGTH, wf="w" * MAX_WORKFLOW_NAME_LENGTH))
    await put(s, mk("keyed", key="k" * MAX_SINGLETON_KEY_LENGTH))
    expect_eq((await get(s, longest)).tags, ("t" * MAX_TAG_LENGTH,), "the longest tag")
    bad: list[tuple[Any, str]] = [
        (mk("r" * (MAX_RUN_ID_LENGTH + 1)), "a run id over the limit"),
        (mk("a\x00b"), "a run id with NUL"),
        (mk("a\ud800b"), "a run id with a lone surrogate"),
        (mk("n1", wf="w" * (MAX_WORKFLOW_NAME_LENGTH + 1)), "a workflow name over the limit"),
        (mk("n2", wf="w\x00"), "a workflow name with NUL"),
        (dataclasses.replace(mk("n3"), workflow_version="1\x00"), "a version with NUL"),
        (mk("n4", tags=("t" * (MAX_TAG_LENGTH + 1),)), "a tag over the limit"),
        (mk("n5", tags=("a\x00",)), "a tag with NUL"),
        (mk("n6", key="k" * (MAX_SINGLETON_KEY_LENGTH + 1)), "a singleton key over the limit"),
        (mk("n7", key="k\x00"), "a singleton key with NUL"),
    ]
    for run, what in bad:  # (an input without the id: only the identifier is wrong)
        run = dataclasses.replace(run, input={"n": 1})
        await _refused_create(s, run, InvalidInputError, what)


@check()
async def check_signal_name_limits(factory: StoreFactory) -> None:
    """``deliver_signal`` with a name over ``MAX_SIGNAL_NAME_LENGTH`` or holding NUL raises
    ``InvalidInputError`` and buffers nothing; a name at the limit is delivered."""
    s = await make_store(factory)
    await put(s, mk("r1"))
    before = await state(s, "r1")
    for name, what in (("s" * (MAX_SIGNAL_NAME_LENGTH + 1), "over the limit"), ("a\x00", "NUL")):
        await expect_raises(
            InvalidInputError, s.deliver_signal("r1", name, 1, T0 + 1), f"a signal name {what}"
        )
        await expect_unchanged(s, "r1", before, f"deliver_signal with a name {what}")
    expect_eq(await s.peek_signal("r1", "s" * MAX_SIGNAL_NAME_LENGTH), None, "the inbox")
    longest = "s" * MAX_SIGNAL_NAME_LENGTH
    await s.deliver_signal("r1", longest, 1, T0 + 1)
    got = await s.peek_signal("r1", longest)
    expect_eq(None if got is None else (got.name, got.payload), (longest, 1), "the signal")


async def _refused_payloads(s: Store, value: Any, what: str) -> None:
    """``value`` as an input, an output, a step result and a signal payload: each write
    raises ``SerializationError`` and writes nothing."""
    await _refused_create(
        s, dataclasses.replace(mk("bad"), input=value), SerializationError, f"an input {what}"
    )
    before = await state(s, "r1")
    updates = {
        "an output": Update(status=S.COMPLETED, output=value),
        "a step result": Update(events=[StepCompleted(pos="1", name="f", result=value, at=T0)]),
        "a received signal": Update(
            events=[SignalReceived(pos="1", name="go", payload=value, at=T0)]
        ),
    }
    for field, update in updates.items():
        await expect_raises(
            SerializationError, s.commit("r1", None, T0 + 1, update), f"{field} {what}"
        )
        await expect_unchanged(s, "r1", before, f"commit of {field} {what}")
    await expect_raises(
        SerializationError, s.deliver_signal("r1", "go", value, T0 + 1), f"a payload {what}"
    )
    await expect_unchanged(s, "r1", before, f"deliver_signal of a payload {what}")
    expect_eq(await s.peek_signal("r1", "go"), None, f"the inbox after a payload {what}")


@check()
async def check_payload_size_limit(factory: StoreFactory) -> None:
    """A payload of exactly the store's limit (``flowkit.stores.limits.payload_limit``: its
    ``max_payload_bytes``) in bytes of compact JSON is kept exactly; one byte more is refused
    with ``SerializationError`` wherever it goes (input, output, step result, signal), and
    nothing is written."""
    s = await make_store(factory)
    limit = payload_limit(s)
    at_limit = "x" * (limit - 2)  # (its JSON: the two quotes and the characters)
    run = await put(s, dataclasses.replace(mk("r1"), input=at_limit))
    expect_eq(len(run.input), limit - 2, "the input at the limit")
    await _refused_payloads(s, at_limit + "x", "one byte over the limit")
    expect_eq((await get(s, "r1")).input == at_limit, True, "the input at the limit, read back")


@check()
async def check_unstorable_values_refused(factory: StoreFactory) -> None:
    """NaN, ±inf (anywhere nested) and strings with NUL (keys included) are refused with
    ``SerializationError`` as inputs, outputs, step results and signal payloads, and a
    recorded text with NUL (a step name) too; nothing is written. (JSON has no NaN, and
    PostgreSQL cannot store NUL: no store could give them back exactly.)"""
    s = await make_store(factory)
    await put(s, mk("r1"))
    values: list[tuple[Any, str]] = [
        (math.nan, "NaN"),
        ({"a": [1, math.inf]}, "+inf nested"),
        ([{"b": -math.inf}], "-inf nested"),
        ("a\x00b", "a string with NUL"),
        ({"k": ["x\x00"]}, "a nested string with NUL"),
        ({"k\x00": 1}, "a key with NUL"),
    ]
    for value, what in values:
        await _refused_payloads(s, value, what)
    before = await state(s, "r1")
    step = StepCompleted(pos="1", name="f\x00", result=1, at=T0)
    await expect_raises(
        SerializationError,
        s.commit("r1", None, T0 + 1, Update(events=[step])),
        "a step name with NUL",
    )
    await expect_unchanged(s, "r1", before, "commit of a step name with NUL")
