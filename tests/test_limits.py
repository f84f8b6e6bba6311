"""The limits on every store alike (MemoryStore, SqlStore on a SQLite file and on PostgreSQL):
a value no store keeps exactly (NaN, ±inf, NUL) or over the payload limit fails its step once
with ``SerializationError`` (a step failure the body can catch), or the run; a caller's such
input, signal payload or identifier raises ``InvalidInputError`` and writes nothing; an
exception message with NUL is recorded escaped. On PostgreSQL the NUL case used to fail the
write on every attempt, so the run never ended."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
from store_kit import Backend

import flowkit
from flowkit import RunStatus, StepFailedError, WorkflowCtx, workflow
from flowkit.events import StepCompleted, StepFailed
from flowkit.stores import MemoryStore, SqlStore
from flowkit.stores import limits as lim
from flowkit_testing import TestEnv

UNSTORABLE = [
    pytest.param("a\x00b", id="nul"),
    pytest.param({"k": ["x", {"y": "\x00"}]}, id="nested-nul"),
    pytest.param({"k\x00": 1}, id="nul-key"),
    pytest.param(math.nan, id="nan"),
    pytest.param({"a": [1.5, math.inf]}, id="nested-inf"),
    pytest.param([[-math.inf]], id="nested-minus-inf"),
]


def _value_step(value: Any) -> Any:
    return value


@workflow(name="returns")
class Returns:
    """Records ``input["value"]`` (an index into ``VALUES``) as a step result; a failed step
    is caught and reported as the output."""

    async def run(self, ctx: WorkflowCtx, input: dict[str, Any]) -> Any:
        try:
            return await ctx.step(_value_step, VALUES[input["value"]], name="produce")
        except StepFailedError as exc:
            return {"caught": exc.error_type, "attempts": exc.attempts}


@workflow(name="outputs")
class Outputs:
    """Returns ``VALUES[input["value"]]`` as the run's output."""

    async def run(self, ctx: WorkflowCtx, input: dict[str, Any]) -> Any:
        return VALUES[input["value"]]


@workflow(name="raises")
class Raises:
    async def run(self, ctx: WorkflowCtx, input: str) -> None:
        def boom() -> None:
            raise RuntimeError(VALUES[input])

        await ctx.step(boom, name="boom")


@workflow(name="waits")
class Waits:
    async def run(self, ctx: WorkflowCtx, input: Any) -> Any:
        return await ctx.wait_for_signal("go")


VALUES: dict[str, Any] = {}
"""Values the workflows above produce, by a name their input carries (inputs cannot carry
the values themselves: the engine refuses them)."""

WORKFLOWS = [Returns(), Outputs(), Raises(), Waits()]


@pytest.fixture
async def env(backend: Backend) -> AsyncIterator[TestEnv]:
    async with TestEnv(WORKFLOWS, store=backend.store) as e:
        yield e


def _stepped(events: list[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, StepCompleted | StepFailed)]


@pytest.mark.parametrize("value", UNSTORABLE)
async def test_a_step_result_no_store_keeps_fails_the_step_once(
    env: TestEnv, value: Any, request: pytest.FixtureRequest
) -> None:
    VALUES[request.node.callspec.id] = value
    await env.start("returns", {"value": request.node.callspec.id}, "r1")
    await env.run_until_idle()
    assert await env.result("r1") == {"caught": "SerializationError", "attempts": 1}
    steps = _stepped((await env.history("r1")).events)
    assert [type(e) for e in steps] == [StepFailed]  # once: no retry loop, on every store
    assert steps[0].error.type == "SerializationError"
    assert "no store keeps exactly" in steps[0].error.message
    assert (await env.get_run("r1")).status is RunStatus.COMPLETED


@pytest.mark.parametrize("value", UNSTORABLE)
async def test_an_output_no_store_keeps_fails_the_run(
    env: TestEnv, value: Any, request: pytest.FixtureRequest
) -> None:
    VALUES[request.node.callspec.id] = value
    await env.start("outputs", {"value": request.node.callspec.id}, "r1")
    await env.run_until_idle()
    run = await env.get_run("r1")
    assert run.status is RunStatus.FAILED
    assert run.error is not None and run.error["type"] == "SerializationError"
    with pytest.raises(flowkit.WorkflowFailedError):
        await env.result("r1")


async def test_an_exception_message_with_nul_is_recorded_escaped(env: TestEnv) -> None:
    VALUES["message"] = "bad\x00message \ud800 end"
    await env.start("raises", "message", "r1")
    await env.run_until_idle()
    run = await env.get_run("r1")
    assert run.status is RunStatus.FAILED
    (failed,) = _stepped((await env.history("r1")).events)
    assert failed.error.message == "bad\\x00message \\ud800 end"
    assert run.error is not None and "bad\\x00message" in run.error["cause_message"]


@pytest.mark.parametrize("value", UNSTORABLE)
async def test_unstorable_start_input_and_signal_payload_write_nothing(
    env: TestEnv, value: Any
) -> None:
    eng = env.engines[0]
    with pytest.raises(flowkit.InvalidInputError):
        await eng.start("waits", value, "bad")
    assert await env.store.get_run("bad") is None
    await env.start("waits", None, "r1")
    await env.run_until_idle()
    before = await env.history("r1")
    with pytest.raises(flowkit.InvalidInputError):
        await eng.signal("r1", "go", value)
    await env.run_until_idle()
    assert await env.history("r1") == before
    assert await env.store.peek_signal("r1", "go") is None
    assert (await env.get_run("r1")).status is RunStatus.SUSPENDED


@pytest.mark.parametrize(
    ("run_id", "tags", "signal"),
    [
        pytest.param("a\x00b", (), "go", id="run-id-nul"),
        pytest.param("r" * (lim.MAX_RUN_ID_LENGTH + 1), (), "go", id="run-id-long"),
        pytest.param("ok", ("t\x00",), "go", id="tag-nul"),
        pytest.param("ok", ("t" * (lim.MAX_TAG_LENGTH + 1),), "go", id="tag-long"),
        pytest.param("ok", (), "g\x00o", id="signal-nul"),
        pytest.param("ok", (), "s" * (lim.MAX_SIGNAL_NAME_LENGTH + 1), id="signal-long"),
    ],
)
async def test_bad_identifiers_raise_invalid_input_and_write_nothing(
    env: TestEnv, run_id: str, tags: tuple[str, ...], signal: str
) -> None:
    eng = env.engines[0]
    if run_id != "ok" or tags:
        with pytest.raises(flowkit.InvalidInputError):
            await eng.start("waits", None, run_id, tags=tags)
        assert await env.store.list_runs() == []
        with pytest.raises(flowkit.RunNotFoundError):
            await eng.get_run(run_id)
        return
    await env.start("waits", None, "ok")
    await env.run_until_idle()
    before = await env.history("ok")
    with pytest.raises(flowkit.InvalidInputError):
        await eng.signal("ok", signal, 1)
    assert await env.history("ok") == before


async def test_identifiers_at_their_limits_are_kept(env: TestEnv) -> None:
    run_id, tag = "é" * lim.MAX_RUN_ID_LENGTH, "t" * lim.MAX_TAG_LENGTH
    await env.start("waits", None, run_id, tags=[tag])
    await env.run_until_idle()
    await env.signal(run_id, "go", {"ok": 1})
    assert await env.result(run_id) == {"ok": 1}
    assert (await env.get_run(run_id)).tags == (tag,)


# -- the payload size: configurable, checked by the engine and by the store ---------------


def _limited(backend: Backend, max_bytes: int) -> Any:
    """``backend``'s data through a store object with ``max_payload_bytes=max_bytes``."""
    if backend.url is None:
        return MemoryStore(max_payload_bytes=max_bytes, _data=backend.store._d)
    return SqlStore(backend.url, max_payload_bytes=max_bytes)


@pytest.mark.parametrize("where", ["store", "engine"])
async def test_payloads_just_under_and_over_the_limit(backend: Backend, where: str) -> None:
    limit = 1000
    store = _limited(backend, limit) if where == "store" else backend.store
    VALUES["at"], VALUES["over"] = "x" * (limit - 2), "x" * (limit - 1)  # (JSON: + 2 quotes)
    try:
        async with TestEnv(WORKFLOWS, store=store) as env:
            eng = env.engines[0]
            if where == "engine":  # (an engine may keep less than its store)
                eng.max_payload_bytes = limit
            assert eng.max_payload_bytes == limit
            await eng.start("returns", {"value": "at"}, "at")
            await eng.start("returns", {"value": "over"}, "over")
            await env.run_until_idle()
            assert await env.result("at") == VALUES["at"]
            assert await env.result("over") == {"caught": "SerializationError", "attempts": 1}
            with pytest.raises(flowkit.InvalidInputError, match="the limit is 1000"):
                await eng.start("waits", VALUES["over"], "big-input")
            assert await env.store.get_run("big-input") is None
            await eng.start("waits", VALUES["at"], "w")
            await env.run_until_idle()
            with pytest.raises(flowkit.InvalidInputError):
                await eng.signal("w", "go", VALUES["over"])
            await eng.signal("w", "go", VALUES["at"])
            assert await env.result("w") == VALUES["at"]
    finally:
        if isinstance(store, SqlStore) and store is not backend.store:
            store.close()


async def test_the_store_refuses_what_an_engine_with_a_higher_limit_let_through(
    backend: Backend,
) -> None:
    """The store is the backstop: an engine told to keep more than its store gets a
    ``SerializationError`` from the store, and nothing is written."""
    store = _limited(backend, 1000)
    try:
        engine = flowkit.Engine(store, WORKFLOWS, worker=False, max_payload_bytes=10_000)
        with pytest.raises(flowkit.SerializationError, match="the limit is 1000"):
            await engine.start("waits", "x" * 2000, "big")
        assert await store.get_run("big") is None
    finally:
        if isinstance(store, SqlStore):
            store.close()


def test_payload_limit_defaults_and_codec_allowance() -> None:
    assert lim.payload_limit(MemoryStore()) == lim.DEFAULT_MAX_PAYLOAD_BYTES == 4 * 1024 * 1024
    assert lim.payload_limit(MemoryStore(max_payload_bytes=10)) == 10
    assert flowkit.Engine(MemoryStore(max_payload_bytes=77)).max_payload_bytes == 77
    codec = flowkit.stores.CodecStore(
        MemoryStore(max_payload_bytes=4096), flowkit.stores.AESGCMCodec([("k", bytes(32))])
    )
    assert lim.payload_limit(codec) == (4096 - 256) * 3 // 4  # (base64 of the ciphertext)
