"""``flowkit show`` and ``flowkit runs`` on a run left ``running`` by a worker process killed
with SIGKILL (a real process, tests/crash_worker.py, on a real SQLite file): they print the
lease owner and expiry, count down to it, flag the run once the lease has expired, and stop
flagging once another worker has recovered it. Also a live lease held by a running engine, and
a run whose lease was handed back."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from flowkit import Engine, Run, RunStatus, SystemClock, WorkflowCtx, workflow
from flowkit.cli._out import _duration, _fmt_time, _lease, _lease_left
from flowkit.stores.sql import SqlStore

try:
    import crash_worker
except ImportError:  # tests/ imported as a package
    from tests import crash_worker

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(crash_worker.__file__).resolve()
RUN_ID = "stuck-run"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# this checkout's flowkit in every child process, not the virtualenv's (an editable install)
ENV = {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "PYTHONPATH": str(ROOT)}


def flowkit(url: str, *args: str, rich: bool = False) -> list[str]:
    """The command's output lines (rich output, forced, with its colour codes kept)."""
    env = {**ENV, "FORCE_COLOR": "1"} if rich else ENV
    out = subprocess.run(
        [sys.executable, "-m", "flowkit.cli", "--db", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def lease_line(lines: list[str]) -> str:
    [line] = [ln for ln in lines if ln.startswith("  lease ")]
    return line


async def read_run(url: str, run_id: str) -> Run:
    store = SqlStore(url)
    try:
        run = await store.get_run(run_id)
    finally:
        store.close()
    assert run is not None
    return run


def spawn(url: str, markers: Path, instance: str, log: Path, *, block: bool) -> Any:
    args = [sys.executable, str(WORKER), url, str(markers), instance, RUN_ID]
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*args, "--block"] if block else args,
            cwd=ROOT,
            env=ENV,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_a_run_left_running_by_a_killed_worker_is_flagged(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    markers = tmp_path / "markers"
    markers.mkdir()

    async def start() -> None:
        store = SqlStore(url)
        try:
            client = Engine(store, [crash_worker.Crash3(markers, "client", False)], worker=False)
            await client.start(crash_worker.WORKFLOW, {"n": 4}, RUN_ID)
        finally:
            store.close()

    asyncio.run(start())
    a = spawn(url, markers, "worker-a", tmp_path / "a.log", block=True)
    b = None
    try:
        deadline = time.monotonic() + 30
        while not (markers / "step2.log").exists():  # worker A is inside step 2, blocked
            assert a.poll() is None, (tmp_path / "a.log").read_text()
            assert time.monotonic() < deadline, "worker A never reached step 2"
            time.sleep(0.05)
        os.kill(a.pid, signal.SIGKILL)
        assert a.wait(timeout=10) == -signal.SIGKILL

        run = asyncio.run(read_run(url, RUN_ID))
        assert run.status is RunStatus.RUNNING and run.lease_owner == "worker-a"
        assert run.lease_expires is not None
        until = _fmt_time(run.lease_expires)
        line = lease_line(flowkit(url, "show", RUN_ID))
        assert line.startswith(f"  lease   worker-a until {until} ("), line

        # nothing renews the dead worker's lease: wait for the clock to pass its expiry
        clock = SystemClock()
        while clock.now() <= run.lease_expires:
            time.sleep(0.05)
        shown = flowkit(url, "show", RUN_ID)
        assert shown[0] == f"{RUN_ID}  {crash_worker.WORKFLOW} v1  [running]"
        m = re.fullmatch(rf"  lease   worker-a until {until} \(expired (\d+\.\d) s ago\)", shown[2])
        assert m is not None, shown
        assert 0.0 <= float(m.group(1)) < 30, shown
        assert shown[3] == (
            "  lease expired: worker-a is probably gone; any worker running crash3 recovers "
            "the run at its next poll"
        )
        [row] = [ln for ln in flowkit(url, "runs") if ln.startswith(RUN_ID + " ")]
        assert re.search(r"  worker-a \(expired \d+\.\d s ago\)$", row), row
        assert row.split()[2] == "running"

        rich = flowkit(url, "show", RUN_ID, rich=True)
        plain = [ANSI.sub("", ln) for ln in rich]
        assert plain[2].startswith(f"  lease   worker-a until {until} (expired ")
        assert plain[3].startswith("  lease expired: worker-a is probably gone")
        assert "\x1b[1;31mlease expired: worker-a" in rich[3]  # flagged: bold red

        # any worker recovers it: worker B (no --block) claims it and finishes it
        b = spawn(url, markers, "worker-b", tmp_path / "b.log", block=False)
        assert b.wait(timeout=30) == 0, (tmp_path / "b.log").read_text()
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    shown = flowkit(url, "show", RUN_ID)
    assert shown[0].endswith("[completed]") and "  output  [5,50,53]" in shown
    assert not any("lease" in ln for ln in shown), shown
    [row] = [ln for ln in flowkit(url, "runs") if ln.startswith(RUN_ID + " ")]
    assert row.endswith("  -"), row  # no lease column value for a settled run


HOLD: dict[str, asyncio.Event] = {}


async def hold(name: str) -> str:
    HOLD["entered"].set()
    await HOLD["release"].wait()
    return name


@workflow(name="cli-hold")
class Hold:
    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        return await ctx.step(hold, input)


async def test_a_live_lease_counts_down_and_a_handed_back_one_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flowkit.db'}"
    HOLD.update(entered=asyncio.Event(), release=asyncio.Event())
    engine = Engine(SqlStore(url), [Hold()], instance_id="worker-live", lease_ttl=30)
    async with engine:
        await engine.start("cli-hold", "x", "live-1")
        await asyncio.wait_for(HOLD["entered"].wait(), 10)
        before = await engine.get_run("live-1")
        shown = flowkit(url, "show", "live-1")
        after = await engine.get_run("live-1")
        m = re.fullmatch(r"  lease   worker-live until (.+) \(expires in (\d+\.\d) s\)", shown[2])
        assert m is not None, shown
        assert m.group(1) in {_fmt_time(before.lease_expires), _fmt_time(after.lease_expires)}
        assert 0 < float(m.group(2)) <= 30
        assert not any("lease expired" in ln for ln in shown)
        [row] = [ln for ln in flowkit(url, "runs") if ln.startswith("live-1 ")]
        assert re.search(r"  worker-live \(expires in \d+\.\d s\)$", row), row
    # the engine stopped mid-step and handed its lease back: running, nobody holds it
    run = await read_run(url, "live-1")
    assert run.status is RunStatus.RUNNING and run.lease_owner is None
    shown = flowkit(url, "show", "live-1")
    assert shown[2] == "  lease   none: any worker running cli-hold claims it at its next poll"


def test_lease_wording() -> None:
    base = Run("r", "wf", "1", RunStatus.RUNNING, None, lease_owner="w-1", lease_expires=1000.0)
    assert _lease_left(base, 987.7) == "expires in 12.3 s"
    assert _lease_left(base, 1004.0) == "expired 4.0 s ago"
    assert _lease_left(base, 1000.0) == "expired 0.0 s ago"  # a lease is live strictly before
    assert _lease(base, 1125.0) == "w-1 (expired 2 min 5 s ago)"
    assert _lease(base, 1000.0 + 3 * 3600 + 310) == "w-1 (expired 3 h 5 min ago)"
    assert _duration(2 * 86400 + 7 * 3600 + 5) == "2 d 7 h"
    settled = Run("r", "wf", "1", RunStatus.COMPLETED, None, lease_owner="w-1")
    unleased = Run("r", "wf", "1", RunStatus.RUNNING, None)
    assert _lease(settled, 0.0) == "" and _lease(unleased, 0.0) == ""
