"""``ctx.logger`` (docs/writing-workflows.md): silent while the body replays, so each line of a
body is logged once across suspensions, crashes and replays; every record tagged with the run id,
workflow, step, position and attempt; ``flowkit.logging.JsonFormatter`` writes them as JSON."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import flowkit
from flowkit import RetryPolicy, RunStatus, WorkflowCtx, workflow
from flowkit.logging import JsonFormatter, WorkflowLogger, logger_name
from flowkit.stores import MemoryStore, SqlStore
from flowkit_testing import TestEnv

LOGGER = logger_name("logged")


def fetch(order: str) -> str:
    logging.getLogger("test.steps").info("fetching %s", order)  # (a step logs every attempt)
    return f"fetched {order}"


def ship(order: str) -> str:
    return f"shipped {order}"


@workflow(name="logged")
class Logged:
    """Logs before and after each kind of durable point: a step, a sleep, a signal."""

    async def run(self, ctx: WorkflowCtx, order: str) -> str:
        ctx.logger.info("start %s", order)
        got = await ctx.step(fetch, order)
        ctx.logger.info("after fetch: %s", got)
        await ctx.sleep(60)
        ctx.logger.info("after sleep")
        note = await ctx.wait_for_signal("go")
        ctx.logger.warning("signal %s", note, extra={"note": note})
        shipped = await ctx.step(ship, order)
        ctx.logger.info("done: %s", shipped)
        return shipped


LINES = [
    "start o-1",
    "after fetch: fetched o-1",
    "after sleep",
    "signal hi",
    "done: shipped o-1",
]


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in _records(caplog)]


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """MemoryStore, then SqlStore on a real SQLite file (the logger changes no store)."""
    if request.param == "memory":
        yield MemoryStore()
        return
    s = SqlStore(f"sqlite:///{tmp_path / 'logger.db'}")
    yield s
    s.close()


async def test_each_line_is_logged_once_across_suspensions(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with TestEnv([Logged()], store=store) as env:
        await env.start("logged", "o-1", "r-1")
        assert _lines(caplog) == LINES[:2]  # suspended in the sleep
        await env.advance(60)
        assert _lines(caplog) == LINES[:3]  # replayed up to the sleep, silently
        await env.signal("r-1", "go", "hi")
        assert await env.result("r-1") == "shipped o-1"
        history = await env.history("r-1")
    assert _lines(caplog) == LINES
    # a replay of the whole history (a debugging session, a CI check) logs nothing
    caplog.clear()
    await flowkit.replay_async(history, Logged())
    assert _lines(caplog) == []


async def test_records_carry_the_run_tags(store: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with TestEnv([Logged()], store=store) as env:
        await env.start("logged", "o-1", "r-1")
        await env.signal("r-1", "go", "hi")
        await env.run_until_idle()
        assert await env.result("r-1") == "shipped o-1"
    tags = [
        (
            r.flowkit_run_id,
            r.flowkit_workflow,
            r.flowkit_step,
            r.flowkit_position,
            r.flowkit_attempt,
        )  # type: ignore[attr-defined]
        for r in _records(caplog)
    ]
    assert tags == [
        ("r-1", "logged", None, None, 1),
        ("r-1", "logged", "fetch", "1", 1),
        ("r-1", "logged", "fetch", "2", 1),  # (position 2: the sleep)
        ("r-1", "logged", "fetch", "3", 1),  # (position 3: the signal)
        ("r-1", "logged", "ship", "4", 1),
    ]
    records = _records(caplog)
    assert records[3].levelno == logging.WARNING
    assert records[3].note == "hi"  # type: ignore[attr-defined]  # the caller's extra kept
    # the record points at the body's line, not at the adapter
    assert {r.filename for r in records} == {"test_ctx_logger.py"}
    assert {r.funcName for r in records} == {"run"}


async def test_a_crash_after_a_record_logs_each_line_once(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with TestEnv([Logged()], store=store) as env:
        env.crash_at(0, "after_step_record")  # fetch recorded, then the worker dies
        await env.start("logged", "o-1", "r-1")
        await env.run_until_idle()
        assert env.crashed == [0]
        await env.restart(0)
        await env.run_until_idle()  # recovered after the lease: replays fetch, sleeps
        await env.signal("r-1", "go", "hi")
        assert await env.result("r-1") == "shipped o-1"
    assert _lines(caplog) == LINES


async def test_a_worker_killed_while_the_run_waits_logs_each_line_once(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with TestEnv([Logged()], store=store, instances=2) as env:
        await env.start("logged", "o-1", "r-1")
        await env.advance(60)  # waits for the signal now
        await env.crash(0)
        await env.restart(0)
        await env.signal("r-1", "go", "hi")
        await env.run_until_idle()
        assert await env.result("r-1") == "shipped o-1"
    assert _lines(caplog) == LINES


async def test_a_crash_before_a_record_logs_the_lost_lines_again(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The lines between the last durable point and a crash ran live and were lost with the
    work after them: they run live again (at least once, as the lost step itself)."""
    caplog.set_level(logging.INFO)
    async with TestEnv([Logged()], store=store) as env:
        env.crash_at(0, "before_step_record")  # fetch computed, not recorded
        await env.start("logged", "o-1", "r-1")
        await env.run_until_idle()
        await env.restart(0)
        await env.signal("r-1", "go", "hi")
        await env.run_until_idle()
        assert await env.result("r-1") == "shipped o-1"
    assert _lines(caplog) == [*LINES[:2], *LINES]


@workflow(name="logged-retry")
class Flaky:
    """A body whose step fails on the first attempt of the run (``engine.retry`` then)."""

    def __init__(self) -> None:
        self.calls = 0

    def work(self) -> str:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("boom")
        return "ok"

    async def run(self, ctx: WorkflowCtx, _: None) -> str:
        ctx.logger.info("begin")
        out = await ctx.step(self.work, name="work", retry=RetryPolicy(max_attempts=1))
        ctx.logger.info("end %s", out)
        return out


async def test_attempt_counts_run_retries(store: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    name = logger_name("logged-retry")
    async with TestEnv([Flaky()], store=store) as env:
        await env.start("logged-retry", None, "f-1")
        await env.run_until_idle()
        assert (await env.get_run("f-1")).status is RunStatus.FAILED
        await env.retry("f-1")
        await env.run_until_idle()
        assert await env.result("f-1") == "ok"
    got = [
        (r.getMessage(), r.flowkit_attempt)  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == name
    ]
    # the retried attempt replays "begin" (its position before the failed step is answered
    # by nothing: the body starts live again) and logs it under attempt 2
    assert got == [("begin", 1), ("begin", 2), ("end ok", 2)]


@workflow(name="logged-fan")
class Fan:
    """Logs from the branches of a ``ctx.gather``: each tagged with its own position."""

    async def run(self, ctx: WorkflowCtx, _: None) -> list[str]:
        async def branch(i: int) -> str:
            out = await ctx.step(ship, f"b{i}", name=f"ship-{i}")
            ctx.logger.info("branch %d", i)
            return out

        await ctx.step(fetch, "first")
        outs = await ctx.gather(branch(1), branch(2))
        ctx.logger.info("gathered")
        await ctx.sleep(5)
        ctx.logger.info("joined")
        return outs


async def test_gather_branches_log_once_with_their_positions(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    name = logger_name("logged-fan")
    async with TestEnv([Fan()], store=store) as env:
        await env.start("logged-fan", None, "g-1")
        await env.run_until_idle()
        assert await env.result("g-1") == ["shipped b1", "shipped b2"]
    got = sorted(
        (r.getMessage(), r.flowkit_step, r.flowkit_position)  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == name
    )
    assert got == [
        ("branch 1", "ship-1", "2.0/1"),
        ("branch 2", "ship-2", "2.1/1"),
        ("gathered", "fetch", "2"),
        ("joined", "fetch", "3"),
    ]


@workflow(name="logged-fan-in")
class FanIn:
    """A gather of two signal waits (they record nothing while parked), one signal per
    activation: the line after the gather is new only where a branch did something new."""

    async def run(self, ctx: WorkflowCtx, _: None) -> list[str]:
        async def wait(name: str) -> str:
            got: str = await ctx.wait_for_signal(name)
            ctx.logger.info("got %s", got)
            return got

        ctx.logger.info("start")
        outs = await ctx.gather(wait("a"), wait("b"))
        ctx.logger.info("gathered")
        return outs


async def test_the_line_after_a_gather_is_logged_where_a_branch_ran_live(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    name = logger_name("logged-fan-in")
    async with TestEnv([FanIn()], store=store) as env:
        await env.start("logged-fan-in", None, "f-1")
        await env.signal("f-1", "a", "A")
        await env.signal("f-1", "b", "B")
        await env.run_until_idle()
        assert await env.result("f-1") == ["A", "B"]
    lines = [r.getMessage() for r in caplog.records if r.name == name]
    assert lines == ["start", "got A", "got B", "gathered"]


async def test_the_json_formatter_writes_the_tags(store: Any) -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter(fields={"service": "orders"}))
    parent = logging.getLogger("flowkit.workflow")  # configures every workflow's logger
    parent.addHandler(handler)
    old = parent.level
    parent.setLevel(logging.INFO)
    try:
        async with TestEnv([Logged()], store=store) as env:
            await env.start("logged", "o-1", "r-1")
            await env.signal("r-1", "go", "hi")
            await env.run_until_idle()
            assert await env.result("r-1") == "shipped o-1"
    finally:
        parent.removeHandler(handler)
        parent.setLevel(old)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["message"] for line in lines] == LINES
    first, warn = lines[1], lines[3]
    assert first["flowkit_run_id"] == "r-1" and first["flowkit_workflow"] == "logged"
    assert first["flowkit_step"] == "fetch" and first["flowkit_attempt"] == 1
    assert first["flowkit_position"] == "1"
    assert first["level"] == "INFO" and first["logger"] == LOGGER
    assert first["service"] == "orders" and first["time"].endswith("+00:00")
    assert warn["level"] == "WARNING" and warn["note"] == "hi"


def test_the_json_formatter_on_plain_records() -> None:
    """Any record (a worker's own, a step's) formats: exceptions, and values JSON cannot hold."""
    fmt = JsonFormatter()
    log = logging.getLogger("test.json")
    try:
        raise ValueError("bad <input>")
    except ValueError:
        import sys

        rec = log.makeRecord(
            "test.json",
            logging.ERROR,
            __file__,
            1,
            "failed %s",
            ("x",),
            sys.exc_info(),
            extra={"obj": object(), "n": 3},
        )
    data = json.loads(fmt.format(rec))
    assert data["message"] == "failed x" and data["level"] == "ERROR"
    assert "ValueError: bad <input>" in data["exception"]
    assert data["n"] == 3 and data["obj"].startswith("<object object")
    assert "flowkit_run_id" not in data and "time" in data
    assert "time" not in json.loads(JsonFormatter(timestamp=False).format(rec))
    assert isinstance(fmt, logging.Formatter)


async def test_a_silent_logger_is_disabled_for_every_level(store: Any) -> None:
    """While replaying ``isEnabledFor`` is False (a guarded expensive message is not built)."""
    seen: list[tuple[bool, bool]] = []

    @workflow(name="logged-enabled")
    class Enabled:
        async def run(self, ctx: WorkflowCtx, _: None) -> None:
            assert isinstance(ctx.logger, WorkflowLogger) and ctx.logger is ctx.logger
            seen.append((ctx.is_replaying, ctx.logger.isEnabledFor(logging.CRITICAL)))
            await ctx.sleep(1)
            seen.append((ctx.is_replaying, ctx.logger.isEnabledFor(logging.CRITICAL)))

    async with TestEnv([Enabled()], store=store) as env:
        await env.start("logged-enabled", None, "e-1")
        await env.run_until_idle()
        history = await env.history("e-1")
    assert seen == [(False, True), (True, False), (False, True)]
    seen.clear()
    await flowkit.replay_async(history, Enabled())
    assert seen == [(True, False), (True, False)]


@workflow(name="logged-waits")
class FirstWaits:
    """Its first calls are waits that record nothing while they park (a signal wait and an
    event wait without timeouts): only the run row says the body ran before."""

    async def run(self, ctx: WorkflowCtx, _: None) -> str:
        ctx.logger.info("start")
        first = await ctx.wait_for_signal("go")
        ctx.logger.info("signal %s", first)
        second = await ctx.wait_for_event("paid", match={"order": "o-1"})
        ctx.logger.info("event %s", second["amount"])
        return f"{first} {second['amount']}"


async def test_lines_before_waits_that_record_nothing_are_logged_once(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    name = logger_name("logged-waits")
    async with TestEnv([FirstWaits()], store=store) as env:
        await env.start("logged-waits", None, "w-1")
        await env.run_until_idle()
        await env.advance(10)  # (a worker may activate it again meanwhile: still silent)
        await env.signal("w-1", "go", "hi")
        await env.run_until_idle()
        await env.publish_event("paid", {"order": "o-1", "amount": 5})
        await env.run_until_idle()
        assert await env.result("w-1") == "hi 5"
        history = await env.history("w-1")
    assert [r.getMessage() for r in caplog.records if r.name == name] == [
        "start",
        "signal hi",
        "event 5",
    ]
    caplog.clear()
    await flowkit.replay_async(history, FirstWaits())
    assert [r for r in caplog.records if r.name == name] == []


def _fetch() -> str:
    return "x"


@workflow(name="logged-cancel-sleep")
class CancelSleep:
    async def run(self, ctx: WorkflowCtx, _: None) -> str:
        ctx.logger.info("start")
        await ctx.step(_fetch)
        try:
            await ctx.sleep(3600)
        except asyncio.CancelledError:
            ctx.logger.warning("cancelled: cleaning up")
            raise
        return "slept"


@workflow(name="logged-cancel-signal")
class CancelSignal:
    async def run(self, ctx: WorkflowCtx, _: None) -> str:
        ctx.logger.info("start")
        try:
            await ctx.wait_for_signal("go")
        except asyncio.CancelledError:
            ctx.logger.warning("cancelled: cleaning up")
            raise
        return "got"


@pytest.mark.parametrize("wf", [CancelSleep, CancelSignal])
async def test_a_cancellation_handler_logs_once(
    wf: Any, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler of a run cancelled while parked runs live in a new activation whose last
    call was answered by the history: its lines are new, and logged once."""
    caplog.set_level(logging.INFO)
    async with TestEnv([wf()], store=store) as env:
        run = await env.start(wf, None, "r-1")
        await env.advance(1)
        await env.cancel("r-1")
        await env.run_until_idle()
        assert (await env.get_run("r-1")).status is RunStatus.CANCELLED
        logger = logger_name(run.workflow)
    got = [r.getMessage() for r in caplog.records if r.name == logger]
    assert got == ["start", "cancelled: cleaning up"]
