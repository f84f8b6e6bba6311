"""SqlStore against MemoryStore and real processes: the SQL forms of the claim rules on random
run states, an end-to-end TestEnv run of singleton lanes, worker processes racing for
singleton slots, and a hand-off across processes on PostgreSQL."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from store_kit import (
    PG,
    T0,
    Backend,
    database_url,
    fresh_database,
    gated,
    mk,
    put,
    release,
)

from flowkit import Engine, History, Run, RunStatus, Singleton, WorkflowCtx, workflow
from flowkit.singleton import HEAD_RECHECK
from flowkit.stores import MemoryStore
from flowkit.stores.sql import (
    SqlStore,
)
from flowkit_testing import TestEnv, VirtualClock

ROOT = Path(__file__).resolve().parent.parent


# -- the SQL forms of the claim rules agree with MemoryStore's -----------------------------


def _random_run(rng: random.Random, i: int) -> Run:
    status = rng.choice(list(RunStatus))
    times = [T0 + d for d in (0, 1, 2, 3, 5, 8)]
    lease = rng.random() < 0.4
    return mk(
        f"r{i:03d}",
        t=rng.choice(times),
        updated_at=rng.choice(times),
        wf=rng.choice(["wf", "other"]),
        status=status,
        wake_at=rng.choice([None, *times]),
        lease_owner=rng.choice(["w1", "w2", ""]) if lease else None,
        lease_expires=rng.choice([None, *times]) if lease else None,
    )


async def test_sql_claim_rules_match_memory_store(sql_backend: Backend) -> None:
    rng = random.Random(1234)
    mem, sql = MemoryStore(), sql_backend.store
    for i in range(160):
        run = _random_run(rng, i)
        await put(mem, run)
        await put(sql, run)
    for now in (T0 - 1, T0, T0 + 2, T0 + 4, T0 + 9):
        for limit in (1000, 7):
            for wfs in (None, ["wf"]):
                assert await sql.due_runs(now, limit, wfs) == await mem.due_runs(now, limit, wfs)
    for excl in ((), ("w1",), ("w1", "w2"), ("",)):
        assert await sql.next_due_at(excl) == await mem.next_due_at(excl)
    now = T0 + 3
    for run in await mem.list_runs():
        got_mem = await mem.claim(run.id, "w9", now, now + 30)
        got_sql = await sql.claim(run.id, "w9", now, now + 30)
        assert got_sql == got_mem, run
    assert await sql.list_runs() == await mem.list_runs()


# -- end to end -------------------------------------------------------------------------------


class LaneInput(BaseModel):
    store_id: str
    n: int


@workflow(name="lane", singleton=Singleton(key=lambda i: f"store:{i.store_id}"))
class Lane:
    def work(self, n: int) -> int:
        return n * 10

    async def run(self, ctx: WorkflowCtx, input: LaneInput) -> int:
        a = await ctx.step(self.work, input.n)
        await ctx.sleep(60)
        got = await ctx.wait_for_signal("go")
        return int(a + got)


async def _lane_scenario(store: Any) -> dict[str, str]:
    async with TestEnv([Lane()], instances=2, seed=3, store=store) as env:
        for i in range(6):
            await env.start("lane", {"store_id": "AB"[i % 2], "n": i}, f"run-{i}")
        await env.run_until_idle()
        for _ in range(3):
            for i in range(6):
                run = await env.get_run(f"run-{i}")
                if run.admitted and not run.status.terminal:
                    await env.signal(f"run-{i}", "go", i)
            await env.run_until_idle()
        for i in range(6):
            assert await env.result(f"run-{i}") == i * 10 + i
        return {f"run-{i}": (await env.history(f"run-{i}")).to_json() for i in range(6)}


@pytest.mark.parametrize("kind", ["sqlite", PG])
async def test_end_to_end_singleton_lanes(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store = SqlStore(database_url(kind, request, tmp_path))
    try:
        on_sql = await _lane_scenario(store)
    finally:
        store.close()
    for key in "AB":
        ids = [f"run-{i}" for i in range(6) if "AB"[i % 2] == key]
        spans = []
        for rid in ids:
            h = History.from_json(on_sql[rid])
            assert h.types[-2:] == ["singleton_released", "run_completed"]
            adm = next(e.at for e in h if e.type == "singleton_admitted")
            rel = next(e.at for e in h if e.type == "singleton_released")
            spans.append((adm, rel, rid))
        spans.sort()
        assert [sp[2] for sp in spans] == ids
        assert all(nxt[0] >= cur[1] for cur, nxt in itertools.pairwise(spans))
    # same seed, same scenario: byte-identical histories on MemoryStore
    assert await _lane_scenario(MemoryStore()) == on_sql


# -- several processes on one database -----------------------------------------------------

RACE_SCRIPT = """
import asyncio, os, sys, time

from pydantic import BaseModel

from flowkit import Engine, Singleton, WorkflowCtx, workflow
from flowkit.stores.sql import SqlStore


class RaceInput(BaseModel):
    key: str
    n: int


@workflow(name="race", singleton=Singleton(key=lambda i: i.key))
class Race:
    async def work(self, n: int) -> int:
        await asyncio.sleep(0.002)
        return os.getpid()

    async def run(self, ctx: WorkflowCtx, input: RaceInput) -> list[int]:
        a = await ctx.step(self.work, input.n)
        await ctx.sleep(0.01)
        b = await ctx.step(self.work, input.n)
        return [a, b]


async def main(url: str, name: str, expected: int) -> None:
    store = SqlStore(url)
    # Two runs at a time: a worker that polls first cannot claim all 40 (group commit claims
    # a whole poll's worth in one transaction), so every worker gets keys and waiters to race.
    engine = Engine(store, [Race()], instance_id=name, poll_interval=0.05, max_concurrency=2)
    print("ready", flush=True)  # the test starts every worker at once: a real race
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    deadline = time.time() + 60
    async with engine:
        while time.time() < deadline:
            runs = await store.list_runs(workflow="race")
            if len(runs) >= expected and all(r.status.terminal for r in runs):
                break
            await asyncio.sleep(0.1)
    store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def _load_race_module(path: Path) -> Any:
    path.write_text(RACE_SCRIPT)
    spec = importlib.util.spec_from_file_location("flowkit_race_worker", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("kind", ["sqlite", PG])
async def test_worker_processes_race_for_singleton_slots(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    n_runs, keys, n_workers = 40, ["k0", "k1", "k2", "k3"], 3
    url = database_url(kind, request, tmp_path)
    script = tmp_path / "race_worker.py"
    mod = _load_race_module(script)
    store = SqlStore(url)
    try:
        # runs created up front by a client-only engine; ties in created_at fall back to ids
        clock = VirtualClock(T0)
        client = Engine(store, [mod.Race()], clock=clock, worker=False, rng=random.Random(5))
        ids = [f"run-{i:02d}" for i in range(n_runs)]
        random.Random(9).shuffle(ids)
        for i, rid in enumerate(ids):
            if i % 3:
                clock.advance(0.000001)
            await client.start("race", {"key": keys[i % len(keys)], "n": i}, rid)
        t0 = time.monotonic()
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                str(script),
                url,
                f"worker-{w}",
                str(n_runs),
                cwd=ROOT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            for w in range(n_workers)
        ]
        try:
            for p in procs:  # every worker imported and built its engine...
                assert p.stdout is not None
                line = await asyncio.wait_for(p.stdout.readline(), timeout=60)
                assert line.strip() == b"ready", line
            outputs = await asyncio.wait_for(  # ...then all of them start at once
                asyncio.gather(*(p.communicate(b"go\n") for p in procs)), timeout=90
            )
        finally:
            for p in procs:
                if p.returncode is None:
                    p.kill()
        elapsed = time.monotonic() - t0
        for p, (out, _) in zip(procs, outputs, strict=True):
            assert p.returncode == 0, out.decode()
        runs = await store.list_runs(workflow="race")
        assert len(runs) == n_runs
        assert all(r.status is RunStatus.COMPLETED for r in runs), [
            (r.id, r.status, r.error) for r in runs if r.status is not RunStatus.COMPLETED
        ]
        full = [await store.get_run(r.id) for r in runs]  # (lists carry no outputs)
        pids = {pid for r in full if r is not None for pid in r.output}
        assert len(pids) >= 2, "only one worker process did any work"
        for key in keys:
            mine = sorted(
                (r for r in runs if r.singleton_key == key), key=lambda r: (r.created_at, r.id)
            )
            spans = []
            for r in mine:
                h = History(r.id, await store.load_events(r.id))
                adm = [e.at for e in h if e.type == "singleton_admitted"]
                rel = [e.at for e in h if e.type == "singleton_released"]
                assert len(adm) == 1 and len(rel) == 1, h.types
                assert h.types[-1] == "run_completed"
                spans.append((adm[0], rel[0], r.id))
            by_admission = sorted(spans)
            # FIFO: admission order per key follows (created_at, id)
            assert [sp[2] for sp in by_admission] == [r.id for r in mine]
            # mutual exclusion: no two [admitted, released] intervals overlap
            for cur, nxt in itertools.pairwise(by_admission):
                assert nxt[0] >= cur[1], (key, cur, nxt)
        assert elapsed < 60, elapsed
    finally:
        store.close()
        sys.modules.pop("flowkit_race_worker", None)


@pytest.mark.postgres
async def test_hand_off_on_postgres_across_processes(request: pytest.FixtureRequest) -> None:
    """Two store objects (two processes' connections): the releaser hands the slot over and
    the other sees the waiter admitted and leased, with nothing left to claim."""
    url = fresh_database(request.getfixturevalue("pg_server"))
    a, b = SqlStore(url), SqlStore(url)
    try:
        await gated(a)
        res = await a.commit("h", "x", T0 + 3, release())
        assert [h.run.id for h in res.handed] == ["w1"]
        w1 = await b.get_run("w1")
        assert w1 is not None and w1.admitted and w1.lease_owner == "x"
        assert await b.claim("w1", "y", T0 + 4, T0 + 34) is None  # leased to the releaser
        # nothing else to claim but the next head's re-check (the release armed w2)
        assert await b.due_runs(T0 + 3.5, 10) == []
        assert await b.due_runs(T0 + 3 + HEAD_RECHECK, 10) == ["w2"]
    finally:
        a.close()
        b.close()
