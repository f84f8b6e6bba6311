"""Durable schedules (docs/schedules.md): each tick starts one run however many
instances fire it and however they crash; cron with time zones and DST; overlap; catch-up
after downtime; pause, resume, delete, trigger, list; bad schedules write nothing. On
MemoryStore, a SQLite file and PostgreSQL (``backend``), in ``TestEnv`` (virtual clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowkit import (
    Engine,
    InvalidInputError,
    Schedule,
    ScheduleNotFoundError,
    UnsupportedStoreError,
    WorkflowNotFoundError,
    workflow,
)
from flowkit.stores import AESGCMCodec, CodecStore, MemoryStore
from flowkit_testing import Rule, TestEnv

HOUR = 3600.0
START = datetime(2026, 1, 1, tzinfo=UTC)


@workflow(name="report")
class Report:
    async def run(self, ctx: Any, input: Any) -> Any:
        return input


@workflow(name="slow")
class Slow:
    async def run(self, ctx: Any, input: Any) -> None:
        await ctx.sleep(2.5 * HOUR)


@workflow(name="typed")
class Typed:
    async def run(self, ctx: Any, input: int) -> int:
        return input


def ids_at(schedule_id: str, start: datetime, hours: int) -> list[str]:
    """The run ids of an hourly schedule's ticks after ``start``."""
    return [
        f"sched:{schedule_id}:{start + timedelta(hours=h):%Y-%m-%dT%H:%M:%SZ}"
        for h in range(1, hours + 1)
    ]


async def sched_runs(env: TestEnv, prefix: str = "sched:") -> list[Any]:
    return sorted(
        (r for r in await env.engines[0].list_runs() if r.id.startswith(prefix)),
        key=lambda r: r.id,
    )


def days_for(store: Any) -> int:
    """A month on MemoryStore (about a second of real time); a week on the SQL stores, whose
    every write is a real transaction (the same code, fewer ticks: the suite stays quick)."""
    return 30 if isinstance(store, MemoryStore) else 7


async def test_a_month_of_an_hourly_schedule_on_three_instances(store: Any) -> None:
    days = days_for(store)
    async with TestEnv([Report], instances=3, store=store, start=START) as env:
        eng = env.engines[1]
        await eng.schedules.create("hourly", Schedule("report", every=3600, input={"n": 1}))
        await env.advance(days * 24 * HOUR)
        runs = await sched_runs(env)
        assert [r.id for r in runs] == ids_at("hourly", START, days * 24)
        assert {r.status.value for r in runs} == {"completed"}
        assert await env.engines[0].result(runs[0].id) == {"n": 1}
        [rec] = await eng.schedules.list()
        assert rec.next_fire == (START + timedelta(hours=days * 24 + 1)).timestamp()
        assert rec.last_run_id == runs[-1].id


async def test_a_crash_between_start_and_advance_starts_nothing_twice(store: Any) -> None:
    def sched_run(args: Any, kwargs: Any) -> bool:
        return bool(args[0].id.startswith("sched:"))

    async with TestEnv([Report], instances=3, store=store, start=START, seed=7) as env:
        rules = [
            env.inject(Rule("create_run", "crash", "after", instance=i, times=4, match=sched_run))
            for i in (0, 1)
        ]
        await env.engines[2].schedules.create("h", Schedule("report", every=3600))
        days = days_for(store)
        for _ in range(days):
            await env.advance(24 * HOUR)
            for i in env.crashed:
                await env.restart(i)
        await env.advance(HOUR / 2)  # (runs a crash left behind: recovered after their lease)
        runs = await sched_runs(env)
        assert [r.id for r in runs] == ids_at("h", START, days * 24)
        assert {r.status.value for r in runs} == {"completed"}
        assert [r.fired for r in rules] == [4, 4]


async def test_cron_in_a_time_zone_across_both_dst_changes(store: Any) -> None:
    """cronsim (as cron): 02:30 does not exist on spring-forward day and fires at 03:00
    CEST; it exists twice on fall-back day and fires once, at the first (CEST) one."""
    daily = Schedule("report", cron="30 2 * * *", timezone="Europe/Berlin")
    for start, expected in (
        (
            datetime(2026, 3, 27, 12, tzinfo=UTC),
            ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"],
        ),
        (
            datetime(2026, 10, 23, 12, tzinfo=UTC),
            ["2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
        ),
    ):
        async with TestEnv([Report], store=store, start=start) as env:
            await env.engines[0].schedules.create(f"berlin-{start.month}", daily)
            await env.advance(3 * 24 * HOUR)
            runs = await sched_runs(env, f"sched:berlin-{start.month}:")
            assert [r.id for r in runs] == [f"sched:berlin-{start.month}:{e}" for e in expected]


async def test_overlap_skip_and_allow(store: Any) -> None:
    async with TestEnv([Slow], store=store, start=START) as env:
        eng = env.engines[0]
        await eng.schedules.create("skip", Schedule("slow", every=3600))
        await eng.schedules.create("allow", Schedule("slow", every=3600, overlap="allow"))
        await env.advance(5 * HOUR)
        skip = [r.id for r in await sched_runs(env, "sched:skip:")]
        allow = [r.id for r in await sched_runs(env, "sched:allow:")]
    # the 01:00 run sleeps until 03:30: 02:00 and 03:00 are skipped; likewise 05:00
    assert skip == [ids_at("skip", START, 5)[0], ids_at("skip", START, 5)[3]]
    assert allow == ids_at("allow", START, 5)


@workflow(name="looping")
class Looping:
    """Sleeps 50 minutes, then continues as new until ``input`` reaches 0."""

    async def run(self, ctx: Any, input: int) -> int:
        await ctx.sleep(50 * 60)
        if input > 0:
            ctx.continue_as_new(input - 1)
        return input


async def test_overlap_skip_follows_a_run_that_continued_as_new(store: Any) -> None:
    async with TestEnv([Looping], store=store, start=START) as env:
        eng = env.engines[0]
        await eng.schedules.create("loop", Schedule("looping", every=3600, input=2))
        await env.advance(5 * HOUR + 60)
        runs = [r.id for r in await sched_runs(env, "sched:loop:")]
        rec = (await eng.schedules.list())[0]
    first, _, _, fourth, _ = ids_at("loop", START, 5)
    # the 01:00 run goes on as ~1 at 01:50 and ~2 at 02:40, which ends at 03:30: the chain
    # is the schedule's run until then, so 02:00 and 03:00 are skipped
    assert runs == [first, f"{first}~1", f"{first}~2", fourth, f"{fourth}~1"]
    assert rec.last_run_id == f"{fourth}~1"  # (the chain's run when the 05:00 tick saw it)


@pytest.mark.parametrize(("window", "hours"), [(0, []), (3 * HOUR, [8, 9, 10])])
async def test_catchup_window_after_downtime(store: Any, window: float, hours: list[int]) -> None:
    async with TestEnv([Report], store=store, start=START) as env:
        sched = Schedule("report", every=3600, catchup_window=window, overlap="allow")
        await env.engines[0].schedules.create("c", sched)
        await env.advance(HOUR)  # 01:00 starts
        await env.crash(0)
        await env.advance(9.5 * HOUR)  # nobody runs until 10:30
        await env.restart(0)
        await env.advance(HOUR)  # and 11:00 starts on time
        runs = [r.id for r in await sched_runs(env)]
    every = ids_at("c", START, 11)
    assert runs == [every[0], *(every[h - 1] for h in hours), every[10]]


async def test_pause_resume_delete_trigger_list(store: Any) -> None:
    async with TestEnv([Report], store=store, start=START) as env:
        s = env.engines[0].schedules
        rec = await s.create("p", Schedule("report", every=3600, input=5))
        assert rec.next_fire == START.timestamp() + HOUR and not rec.paused
        assert (await s.pause("p")).paused
        await env.advance(3 * HOUR)
        assert await sched_runs(env) == []
        run = await s.trigger("p")  # (paused or not)
        assert run.id == "sched:p:manual:2026-01-01T03:00:00.000000Z"
        await env.advance(0)
        assert await env.engines[0].result(run.id) == 5
        resumed = await s.resume("p")
        # the ticks missed while paused are not started (catchup_window=0)
        assert not resumed.paused and resumed.next_fire == START.timestamp() + 4 * HOUR
        await env.advance(HOUR)
        assert [r.id for r in await sched_runs(env, "sched:p:2")] == [ids_at("p", START, 4)[3]]
        assert [r.id for r in await s.list()] == ["p"]
        await s.delete("p")
        assert await s.list() == []
        await env.advance(3 * HOUR)
        assert len(await sched_runs(env)) == 2
        for call in (s.pause, s.resume, s.delete, s.trigger):
            with pytest.raises(ScheduleNotFoundError) as err:
                await call("p")
            assert err.value.schedule_id == "p"


async def test_create_again_keeps_the_timetable_unless_it_changed(store: Any) -> None:
    async with TestEnv([Report], store=store, start=START) as env:
        s = env.engines[0].schedules
        await s.create("u", Schedule("report", every=3600, input=1))
        await s.pause("u")
        await env.advance(HOUR / 2)
        same = await s.create("u", Schedule("report", every=3600, input=2, overlap="allow"))
        assert (same.next_fire, same.paused, same.input) == (START.timestamp() + HOUR, True, 2)
        assert same.overlap == "allow" and same.created_at == START.timestamp()
        changed = await s.create("u", Schedule("report", cron="0 0 * * *"))
        assert changed.cron == "0 0 * * *" and changed.every is None and not changed.paused
        assert changed.next_fire == (START + timedelta(days=1)).timestamp()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cron": "61 * * * *"},
        {"cron": "* * * *"},
        {"cron": "0 * * * *", "timezone": "Mars/Olympus"},
        {"cron": "0 * * * *", "timezone": ""},
        {"cron": "0 * * * *", "every": 60},
        {},
        {"every": 0},
        {"every": -5},
        {"every": 0.5},
        {"every": True},
        {"every": float("nan")},
        {"every": 60, "overlap": "queue"},
        {"every": 60, "catchup_window": -1},
        {"every": 60, "catchup_window": float("inf")},
    ],
)
def test_bad_schedules_raise_value_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Schedule("report", **kwargs)


async def test_bad_creates_write_nothing(store: Any) -> None:
    async with TestEnv([Report, Typed], store=store, start=START) as env:
        s = env.engines[0].schedules
        with pytest.raises(WorkflowNotFoundError):
            await s.create("x", Schedule("nope", every=60))
        with pytest.raises(InvalidInputError):
            await s.create("x", Schedule("typed", every=60, input="not a number"))
        with pytest.raises(InvalidInputError):
            await s.create("", Schedule("report", every=60))
        with pytest.raises(InvalidInputError):
            await s.create("x" * 300, Schedule("report", every=60))
        with pytest.raises(TypeError):
            await s.create("x", "every minute")  # type: ignore[arg-type]
        assert await s.list() == []


async def test_engine_schedules_are_created_when_its_worker_starts(store: Any) -> None:
    sched = {"boot": Schedule(Report, every=60, input=3)}
    client = Engine(store, [Report], worker=False, schedules=sched)
    async with client:
        assert await client.schedules.list() == []  # (not a worker: nothing declared)
    async with Engine(store, [Report], schedules=sched) as eng:
        [rec] = await eng.schedules.list()
        assert (rec.id, rec.workflow, rec.every, rec.input) == ("boot", "report", 60.0, 3)
    with pytest.raises(WorkflowNotFoundError):
        await Engine(store, [Typed], schedules=sched).start_worker()


async def test_codec_store_encodes_the_input_at_rest() -> None:
    inner = MemoryStore()
    store = CodecStore(inner, AESGCMCodec([("k1", b"0" * 32)]))
    async with TestEnv([Report], store=store, start=START) as env:
        await env.engines[0].schedules.create("enc", Schedule("report", every=60, input="x"))
        [at_rest] = await inner.list_schedules()
        assert at_rest.input != "x"
        assert [r.input for r in await env.engines[0].schedules.list()] == ["x"]
        await env.advance(60)
        assert await env.engines[0].result("sched:enc:2026-01-01T00:01:00Z") == "x"


class NoSchedules(MemoryStore):
    keeps_schedules = False


async def test_a_store_without_schedules_says_so() -> None:
    async with Engine(NoSchedules(), [Report]) as eng:
        with pytest.raises(UnsupportedStoreError):
            await eng.schedules.create("x", Schedule("report", every=60))
        with pytest.raises(UnsupportedStoreError):
            await eng.schedules.list()
