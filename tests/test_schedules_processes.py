"""Durable schedules across real processes (SQLite file, PostgreSQL): two worker processes
fire one ``every=1`` schedule; every tick between the first and the last starts exactly one
run. And ``flowkit schedules`` lists the schedule with its next fire time."""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from cli_kit import flowkit
from store_kit import Backend

from flowkit.stores import SqlStore

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "schedule_worker.py"


def _tick(run_id: str) -> float:
    stamp = run_id.removeprefix("sched:tick:")
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


async def test_two_processes_start_each_tick_once(sql_backend: Backend, tmp_path: Path) -> None:
    url = sql_backend.url
    assert url is not None
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), url, f"w{i}", "4", env=env, cwd=tmp_path
        )
        for i in range(2)
    ]
    for p in procs:
        assert await asyncio.wait_for(p.wait(), 120) == 0
    store = SqlStore(url)
    try:
        runs = [r for r in await store.list_runs() if r.id.startswith("sched:tick:")]
        # (list_runs leaves the payloads out: each run's input is read whole)
        inputs = {getattr(await store.get_run(r.id), "input", None) for r in runs}
        [rec] = await store.list_schedules()
    finally:
        store.close()
    ticks = sorted(_tick(r.id) for r in runs)
    assert len(ticks) >= 2
    # one run per tick, none missing between the first and the last
    assert ticks == [ticks[0] + i for i in range(len(ticks))]
    assert rec.next_fire == ticks[-1] + 1
    assert (
        rec.last_run_id == f"sched:tick:{datetime.fromtimestamp(ticks[-1], UTC):%Y-%m-%dT%H:%M:%SZ}"
    )
    assert inputs <= {"w0", "w1"}

    out = flowkit(tmp_path, "--db", url, "schedules")
    assert out.returncode == 0, out.stderr
    assert "tick" in out.stdout and "every 1 s" in out.stdout and "allow" in out.stdout
    next_fire = datetime.fromtimestamp(rec.next_fire, UTC)
    assert f"{next_fire:%H:%M:%S}" in out.stdout
