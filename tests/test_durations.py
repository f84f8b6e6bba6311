"""Durations and instants (docs/writing-workflows.md, "Durations and their limits"): every
duration takes seconds or a ``datetime.timedelta``, the same on every call; one bound for
every store (at most 1,000 years, no instant past 9999-12-31); a bad one raises
``InvalidInputError`` (a ``ValueError``) at the call and writes nothing; ``math.inf`` as a
timeout means no timeout, as ``None`` does. An infinite timer used to be written
``"fire_at": null``: such a history could never be loaded again (the run stuck ``blocked``,
``flowkit show``/``history`` failing, a cancel left ``cancelling`` for ever); it now reads as
a timer that never fires."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

import flowkit
from flowkit import Engine, RetryPolicy, RunStatus, Schedule, Singleton, WorkflowCtx, workflow
from flowkit._core.limits import MAX_DURATION, MAX_TIMESTAMP, duration, instant, timeout
from flowkit._model.definition import definition_of
from flowkit.cli import main as cli_main
from flowkit.events import TimerStarted
from flowkit.stores import MemoryStore, SqlStore
from flowkit.stores import limits as store_limits
from flowkit.stores.sql import _schema
from flowkit_testing import TestEnv

try:
    from store_kit import KINDS, Backend, make_backend
    from ui_kit import client as ui_client
except ImportError:  # tests/ imported as a package
    from tests.store_kit import KINDS, Backend, make_backend
    from tests.ui_kit import client as ui_client

T = TypeVar("T")
HOUR = 3600.0
InvalidInputError = flowkit.InvalidInputError


# -- the rule itself ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (90, 90.0),
        (1.5, 1.5),
        (timedelta(minutes=2), 120.0),
        (timedelta(milliseconds=5), 0.005),
        (MAX_DURATION, MAX_DURATION),
        (timedelta(days=365_250), MAX_DURATION),
    ],
)
def test_a_duration_is_seconds_or_a_timedelta(value: Any, seconds: float) -> None:
    assert duration("d", value) == seconds
    assert timeout("t", value) == seconds


BAD_DURATIONS = [
    pytest.param(-1, id="negative"),
    pytest.param(timedelta(seconds=-1), id="negative-timedelta"),
    pytest.param(math.nan, id="nan"),
    pytest.param(-math.inf, id="minus-inf"),
    pytest.param(1e300, id="1e300"),
    pytest.param(10**400, id="huge-int"),
    pytest.param(timedelta.max, id="timedelta-max"),
    pytest.param(MAX_DURATION + 1, id="over-max"),
    pytest.param("5", id="str"),
    pytest.param(True, id="bool"),
]


@pytest.mark.parametrize("bad", BAD_DURATIONS)
def test_a_bad_duration_is_invalid_input(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match=r"ctx\.sleep"):
        duration("ctx.sleep", bad)
    with pytest.raises(InvalidInputError):
        timeout("timeout=", bad)


def test_inf_is_no_timeout_but_no_duration() -> None:
    assert timeout("t", math.inf) is None
    assert timeout("t", None) is None
    with pytest.raises(InvalidInputError):
        duration("ctx.sleep", math.inf)
    with pytest.raises(InvalidInputError, match="> 0"):
        duration("ctx.step timeout=", 0, positive=True)


@pytest.mark.parametrize(
    "bad",
    [math.inf, math.nan, 1e300, -1e300, MAX_TIMESTAMP + 1, "2026", datetime(2026, 1, 1)],
)
def test_a_bad_instant_is_invalid_input(bad: Any) -> None:
    with pytest.raises(InvalidInputError):
        instant("ctx.sleep_until", bad)


def test_instants_at_the_bounds() -> None:
    assert instant("at", MAX_TIMESTAMP) == MAX_TIMESTAMP
    last = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert instant("at", last) == MAX_TIMESTAMP


def test_the_stores_refuse_an_instant_out_of_range() -> None:
    """The stores' backstop: a timer the engine would never write (its fire_at infinite,
    which JSON writes ``null``)."""
    for bad in (math.inf, math.nan, 1e300):
        with pytest.raises(flowkit.SerializationError, match="fire_at"):
            store_limits.check_events([TimerStarted(pos="1", fire_at=bad, at=1.0)], 1 << 20)
    store_limits.check_events([TimerStarted(pos="1", fire_at=MAX_TIMESTAMP, at=1.0)], 1 << 20)


# -- every call takes a timedelta (and the same seconds) ------------------------------------


def _noop() -> str:
    return "ok"


CALLS: dict[str, Callable[[WorkflowCtx, Any], Awaitable[Any]]] = {
    "sleep": lambda ctx, v: ctx.sleep(v),
    "sleep_until": lambda ctx, v: ctx.sleep_until(v),
    "wait_for_signal": lambda ctx, v: ctx.wait_for_signal("go", timeout=v),
    "wait_for_event": lambda ctx, v: ctx.wait_for_event("ev", timeout=v),
    "wait_for_update": lambda ctx, v: ctx.wait_for_update("up", timeout=v),
    "step": lambda ctx, v: ctx.step(_noop, timeout=v),
}
VALUES: dict[str, Any] = {}
"""The values the probes pass, by a name their input carries (an input cannot carry
``math.inf``, a ``timedelta`` or a ``datetime``)."""


@workflow(name="probe")
class Probe:
    """Makes ``CALLS[call](ctx, VALUES[key])`` and says how it went."""

    async def run(self, ctx: WorkflowCtx, input: list[str]) -> str:
        call, key = input
        try:
            aw = CALLS[call](ctx, VALUES[key])
        except InvalidInputError as exc:
            return f"refused: {exc}"
        try:
            got = await aw
        except flowkit.SignalTimeout:
            return "timed out"
        if isinstance(got, flowkit.UpdateRequest):
            await got.reply("ok")
        return "done"


@workflow(name="refusals")
class Refusals:
    """Tries every bad value on every call in one body; each must be refused at the call."""

    async def run(self, ctx: WorkflowCtx, input: None) -> list[str]:
        refused = []
        for call, key in BAD_CALLS:
            try:
                aw = CALLS[call](ctx, VALUES[key])
            except InvalidInputError as exc:
                refused.append(f"{call}:{key}:{'ctx.' + call in str(exc)}")
                continue
            aw.close()  # type: ignore[attr-defined]  # (never awaited: a coroutine)
            refused.append(f"{call}:{key}:accepted")
        return refused


WAITS = ("wait_for_signal", "wait_for_event", "wait_for_update", "step")
BAD = {
    "nan": math.nan,
    "negative": -1,
    "negative-td": timedelta(seconds=-1),
    "1e300": 1e300,
    "huge-int": 10**400,
    "str": "5",
    "minus-inf": -math.inf,
}
BAD_INSTANTS = {
    "inf-instant": math.inf,
    "nan-instant": math.nan,
    "far-instant": 1e300,
    "naive": datetime(2026, 1, 1),
}
VALUES.update(BAD)
VALUES.update(BAD_INSTANTS)
VALUES["inf"] = math.inf
BAD_CALLS = [
    *((call, key) for call in ("sleep", *WAITS) for key in BAD),
    ("sleep", "inf"),
    *(("sleep_until", key) for key in BAD_INSTANTS),
]


async def _in_background(env: TestEnv, aw: Awaitable[T]) -> T:
    """Run ``aw`` (a caller waiting on the runs) while the environment settles."""
    task = asyncio.ensure_future(aw)
    await env.settle()
    await env.run_until_idle()
    return await asyncio.wait_for(task, 30)


@pytest.fixture
async def env(backend: Backend) -> AsyncIterator[TestEnv]:
    async with TestEnv([Probe(), Refusals()], store=backend.store) as e:
        yield e


async def test_bad_durations_in_a_body_are_refused_at_the_call_and_record_nothing(
    env: TestEnv,
) -> None:
    """``ctx.sleep(math.inf)`` used to record ``"fire_at": null``, ``ctx.sleep(1e300)`` a
    timer no tool could show; now each bad value raises ``InvalidInputError`` where the body
    makes the call (it can catch it) and nothing is recorded, on every store."""
    await env.start("refusals", None, "r1")
    refused = await env.result("r1")
    assert refused == [f"{call}:{key}:True" for call, key in BAD_CALLS]
    assert (await env.history("r1")).types == ["run_started", "run_completed"]


async def test_an_uncaught_infinite_sleep_fails_the_run_and_records_no_timer(
    env: TestEnv,
) -> None:
    @workflow(name="sleeps-for-ever")
    class SleepsForEver:
        async def run(self, ctx: WorkflowCtx, input: None) -> None:
            await ctx.sleep(math.inf)

    eng = env.engines[0]
    eng.register(SleepsForEver())
    await env.start("sleeps-for-ever", None, "r1")
    with pytest.raises(flowkit.WorkflowFailedError) as err:
        await asyncio.wait_for(env.result("r1"), 60)  # (the older code never settled it)
    assert err.value.error["type"] == "InvalidInputError"
    assert (await env.history("r1")).types == ["run_started", "run_failed"]


async def test_an_infinite_wait_timeout_is_no_timeout(env: TestEnv) -> None:
    """``timeout=math.inf`` waits as ``timeout=None`` does: no timer is recorded, and the
    run takes what comes."""
    eng = env.engines[0]
    for call in ("wait_for_signal", "wait_for_event", "wait_for_update"):
        await env.start("probe", [call, "inf"], call)
    await asyncio.wait_for(env.run_until_idle(), 60)  # (a timer at inf: the older code hung)
    for call in ("wait_for_signal", "wait_for_event", "wait_for_update"):
        assert (await env.get_run(call)).status is RunStatus.SUSPENDED
    await env.signal("wait_for_signal", "go")
    await env.publish_event("ev", {"n": 1})
    assert await _in_background(env, eng.update("wait_for_update", "up")) == "ok"
    for call in ("wait_for_signal", "wait_for_event", "wait_for_update"):
        assert await env.result(call) == "done"
        assert "timer_started" not in (await env.history(call)).types


async def _timer_of(env: TestEnv, run_id: str) -> float:
    (timer,) = [e for e in (await env.history(run_id)).events if isinstance(e, TimerStarted)]
    return timer.fire_at - timer.at


@pytest.mark.parametrize("call", ["sleep", "wait_for_signal", "wait_for_event", "wait_for_update"])
async def test_a_body_timer_takes_a_timedelta_as_its_seconds(call: str) -> None:
    VALUES["90s"], VALUES["td90"] = 90, timedelta(seconds=90)
    async with TestEnv([Probe()]) as env:
        await env.start("probe", [call, "td90"], "td")
        await env.start("probe", [call, "90s"], "secs")
        await env.settle()
        assert await _timer_of(env, "td") == pytest.approx(90, abs=1e-5)
        assert await _timer_of(env, "secs") == pytest.approx(90, abs=1e-5)
        await env.advance(timedelta(seconds=91))
        expect = "done" if call == "sleep" else "timed out"
        assert await env.result("td") == await env.result("secs") == expect


async def test_sleep_until_and_a_step_timeout_take_datetimes_and_timedeltas() -> None:
    async with TestEnv([Probe()]) as env:
        VALUES["soon"] = datetime.fromtimestamp(env.clock.now() + 60, UTC)
        VALUES["td5"] = timedelta(seconds=5)
        await env.start("probe", ["sleep_until", "soon"], "until")
        await env.start("probe", ["step", "td5"], "step")
        await env.run_until_idle()
        assert await env.result("until") == "done"
        assert await _timer_of(env, "until") == pytest.approx(60, abs=1e-5)
        assert await env.result("step") == "done"


def _declared(timeout_: Any) -> float | None:
    @workflow(name="declared", execution_timeout=timeout_)
    class Declared:
        async def run(self, ctx: WorkflowCtx, input: None) -> None:
            return None

    defn = definition_of(Declared)
    assert defn is not None
    return defn.execution_timeout


def _engine_config(**kw: Any) -> Any:
    return Engine(MemoryStore(), worker=False, **kw).config


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(
            lambda v: RetryPolicy(initial_interval=v).initial_interval, id="retry-initial"
        ),
        pytest.param(lambda v: RetryPolicy(max_interval=v).max_interval, id="retry-max"),
        pytest.param(_declared, id="execution_timeout"),
        pytest.param(lambda v: Schedule("w", every=v).every, id="schedule-every"),
        pytest.param(
            lambda v: Schedule("w", every=60, catchup_window=v).catchup_window,
            id="schedule-catchup",
        ),
        pytest.param(lambda v: _engine_config(lease_ttl=v).lease_ttl, id="engine-lease_ttl"),
        pytest.param(
            lambda v: _engine_config(poll_interval=v).poll_interval, id="engine-poll_interval"
        ),
        pytest.param(
            lambda v: _engine_config(blocked_retry=v).blocked_retry, id="engine-blocked_retry"
        ),
        pytest.param(lambda v: _engine_config(retention=v).retention, id="engine-retention"),
    ],
)
def test_every_declared_duration_takes_a_timedelta(make: Callable[[Any], Any]) -> None:
    """A ``timedelta`` is kept as its seconds; a bad one is ``InvalidInputError``."""
    assert make(timedelta(minutes=2)) == make(120) == 120.0
    with pytest.raises(InvalidInputError):
        make(timedelta(seconds=-5))
    with pytest.raises(InvalidInputError):
        make(1e300)


@workflow(name="idle")
class Idle:
    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        await ctx.wait_for_signal("go")
        return "done"


@pytest.mark.parametrize("unit", ["timedelta", "seconds"])
async def test_the_engine_calls_take_a_timedelta(unit: str) -> None:
    """``engine.result``, ``get_event``, ``update`` (real seconds) and ``prune``."""
    short: Any = timedelta(milliseconds=20) if unit == "timedelta" else 0.02
    async with Engine(MemoryStore(), [Idle()], poll_interval=None) as eng:
        await eng.start("idle", None, "r1")
        with pytest.raises(flowkit.ResultTimeoutError) as err:
            await eng.result("r1", timeout=short)
        assert err.value.timeout == pytest.approx(0.02)
        assert await eng.get_event("r1", "k", timeout=short) is None
        with pytest.raises(flowkit.ResultTimeoutError):
            await eng.update("r1", "up", timeout=short)
        day: Any = timedelta(days=1) if unit == "timedelta" else 86400
        assert await eng.prune(day) == 0
        for bad in (timedelta(seconds=-1), math.nan, 1e300, "1"):
            with pytest.raises(InvalidInputError):
                await eng.result("r1", timeout=bad)
            with pytest.raises(InvalidInputError):
                await eng.get_event("r1", "k", timeout=bad)
            with pytest.raises(InvalidInputError):
                await eng.update("r1", "up", timeout=bad)
            with pytest.raises(InvalidInputError):
                await eng.prune(bad)
        await eng.signal("r1", "go")
        assert await eng.result("r1", timeout=math.inf) == "done"  # (inf: no timeout)


async def test_testenv_advance_takes_a_timedelta() -> None:
    async with TestEnv([]) as env:
        t0 = env.clock.now()
        await env.advance(timedelta(hours=1))
        assert env.clock.now() == pytest.approx(t0 + HOUR)
        with pytest.raises(InvalidInputError):
            await env.advance(-1)


# -- schedules and retry policies: bounded alike on every store -----------------------------


def test_schedule_bounds() -> None:
    """``every=10**12`` was accepted and then broke ``flowkit schedules`` for every
    schedule; a 10,000-character cron was kept by SQLite and refused by PostgreSQL."""
    with pytest.raises(InvalidInputError, match="longest duration"):
        Schedule("w", every=10**12)
    with pytest.raises(InvalidInputError, match="cron"):
        Schedule("w", cron="*/5 " + " " * 10_000 + "* * * *")
    with pytest.raises(InvalidInputError):
        Schedule("w", every=60, catchup_window=math.inf)
    assert Schedule("w", every=timedelta(days=365_250)).every == MAX_DURATION


def test_retry_policy_bounds() -> None:
    with pytest.raises(InvalidInputError):
        RetryPolicy(max_interval=math.inf)
    with pytest.raises(InvalidInputError):
        RetryPolicy(initial_interval=math.nan)
    long = RetryPolicy(max_attempts=10_000, initial_interval=1, backoff=2, max_interval=60)
    assert long.delay_before(5_000) == 60.0  # (2.0 ** 4998 overflowed)


# -- a history an older flowkit wrote with "fire_at": null ----------------------------------


@workflow(name="legacy", singleton=Singleton(key=lambda inp: "k"))
class Legacy:
    """What the older code ran as ``ctx.sleep(math.inf)`` / ``wait_for_signal(timeout=
    math.inf)``: the timer is made null in the database by the test."""

    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        if input == "sleep":
            await ctx.sleep(HOUR)
        elif input == "wait":
            await ctx.wait_for_signal("go", timeout=HOUR)
        return input


def _nullify_timers(url: str) -> None:
    """Rewrite every ``timer_started`` as an older flowkit wrote an infinite one (its
    ``fire_at`` null, the run's ``wake_at`` infinite)."""
    eng = sa.create_engine(url)
    with eng.begin() as conn:
        rows = conn.execute(
            sa.select(_schema.events.c.run_id, _schema.events.c.seq, _schema.events.c.body).where(
                _schema.events.c.type == "timer_started"
            )
        ).all()
        assert rows
        for run_id, seq, body in rows:
            conn.execute(
                sa.update(_schema.events)
                .where(_schema.events.c.run_id == run_id, _schema.events.c.seq == seq)
                .values(body={**body, "fire_at": None})
            )
            conn.execute(
                sa.update(_schema.runs).where(_schema.runs.c.id == run_id).values(wake_at=math.inf)
            )
    eng.dispose()


def _cli(url: str, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = cli_main(["--db", url, *args])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


@pytest.mark.parametrize("kind", KINDS)
def test_a_history_with_a_null_fire_at_loads_shows_and_cancels(
    kind: str, request: pytest.FixtureRequest, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = make_backend(kind, request, tmp_path)
    url = backend.url
    assert url is not None

    async def start() -> None:
        async with TestEnv([Legacy()], store=backend.store) as env:
            await env.start("legacy", "sleep", "holder")  # holds key k
            await env.start("legacy", "wait", "waiter")  # queued behind it
            await env.settle()
            assert (await env.get_run("holder")).status is RunStatus.SUSPENDED

    async def page() -> tuple[int, str]:
        store = SqlStore(url)
        try:
            async with ui_client(store) as c:
                r = await c.get("/runs/holder")
                return r.status_code, r.text
        finally:
            store.close()

    async def finish() -> tuple[Any, ...]:
        store = SqlStore(url)
        try:
            async with Engine(store, [Legacy()], poll_interval=0.05) as eng:
                h = await eng.history("holder")
                timer = next(e for e in h.events if isinstance(e, TimerStarted))
                await eng.cancel("holder")
                with pytest.raises(flowkit.RunCancelledError):
                    await eng.result("holder", timeout=30)
                # the key is free: the waiter holds it now and takes its signal
                await eng.signal("waiter", "go")
                return timer.fire_at, await eng.result("waiter", timeout=30)
        finally:
            store.close()

    try:
        asyncio.run(start())
        backend.store.close()
        _nullify_timers(url)
        shown = _cli(url, capsys, "show", "holder")
        assert "wakes   never" in shown
        assert "sleep never fires" in _cli(url, capsys, "history", "holder")
        status, html = asyncio.run(page())  # the dashboard's run page
        assert status == 200 and "timer_started" in html
        fire_at, waited = asyncio.run(finish())
        assert fire_at == MAX_TIMESTAMP
        assert waited == "wait"
        assert "[cancelled]" in _cli(url, capsys, "show", "holder")
    finally:
        backend.close()


@pytest.mark.parametrize("kind", KINDS)
def test_flowkit_schedules_shows_a_schedule_an_older_flowkit_let_through(
    kind: str, request: pytest.FixtureRequest, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``Schedule(every=10**12)`` was accepted (its next tick in the year 33658) and then
    broke ``flowkit schedules`` for every schedule; such a row shows its next tick as
    ``never`` now (and no new one can be made)."""
    backend = make_backend(kind, request, tmp_path)
    url = backend.url
    assert url is not None

    async def create() -> None:
        async with Engine(backend.store, [Legacy()], worker=False) as eng:
            await eng.schedules.create("huge", Schedule(Legacy, every=60, input="quick"))
            await eng.schedules.create("fine", Schedule(Legacy, every=60, input="quick"))

    try:
        asyncio.run(create())
        backend.store.close()
        eng = sa.create_engine(url)
        with eng.begin() as conn:
            conn.execute(
                sa.update(_schema.schedules)
                .where(_schema.schedules.c.schedule_id == "huge")
                .values(every=1e12, next_fire=1e12)
            )
        eng.dispose()
        lines = _cli(url, capsys, "schedules").splitlines()
        huge = next(line for line in lines if line.startswith("huge"))
        assert "never" in huge
        assert any(line.startswith("fine") and "sched:" not in line for line in lines)
    finally:
        backend.close()
