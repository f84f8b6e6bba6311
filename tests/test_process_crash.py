"""A real process crash: a worker process is killed with SIGKILL in the middle of step 2 of a
three-step workflow, and a second worker process takes the run over once the dead worker's
lease has expired. Completed steps are not executed again; the interrupted step is (at least
once semantics for the step that was running); the history has one ``step_completed`` per
position. On a SQLite file and on PostgreSQL (tests/pg.py).

The worker is tests/crash_worker.py; each step execution appends a line to a marker file, so
the test counts executions across processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from flowkit import Engine, History, RunStatus
from flowkit.stores.sql import SqlStore

try:
    import crash_worker
    from pg import fresh_database
except ImportError:  # tests/ imported as a package
    from tests import crash_worker
    from tests.pg import fresh_database

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(crash_worker.__file__).resolve()
RUN_ID = "crash-run"
PG = pytest.param("postgres", marks=pytest.mark.postgres)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def executions(path: Path) -> list[tuple[str, int, float]]:
    """``(instance, pid, wall time)`` of each execution recorded in a marker file."""
    out = []
    for line in lines(path):
        instance, pid, at = line.split()
        out.append((instance, int(pid), float(at)))
    return out


def spawn(
    url: str,
    markers: Path,
    instance: str,
    log: Path,
    *,
    block: bool,
    lease_ttl: float | None = None,
) -> subprocess.Popen[Any]:
    args = [sys.executable, str(WORKER), url, str(markers), instance, RUN_ID]
    if block:
        args.append("--block")
    if lease_ttl is not None:
        args += ["--lease-ttl", str(lease_ttl)]
    with open(log, "wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def wait_for_line(path: Path, count: int, proc: subprocess.Popen[Any], log: Path) -> None:
    """Wait (bounded) until ``path`` has ``count`` lines, failing early if ``proc`` died."""
    deadline = time.monotonic() + 15
    while len(lines(path)) < count:
        if proc.poll() is not None:
            pytest.fail(f"worker exited ({proc.returncode}) early:\n{log.read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"no marker line in {path.name} within 15 s:\n{log.read_text()}")
        time.sleep(0.05)


async def start_run(url: str, markers: Path) -> None:
    store = SqlStore(url)
    try:
        client = Engine(store, [crash_worker.Crash3(markers, "client", False)], worker=False)
        await client.start(crash_worker.WORKFLOW, {"n": 4}, RUN_ID)
    finally:
        store.close()


async def snapshot(url: str) -> tuple[Any, History]:
    store = SqlStore(url)
    try:
        run = await store.get_run(RUN_ID)
        return run, History(RUN_ID, await store.load_events(RUN_ID))
    finally:
        store.close()


def _url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'crash.db'}"
    return fresh_database(request.getfixturevalue("pg_server"))


@pytest.mark.parametrize("kind", ["sqlite", PG])
def test_sigkill_mid_step_then_another_process_finishes_the_run(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = _url(kind, request, tmp_path)
    markers = tmp_path / "markers"
    markers.mkdir()
    t0 = time.monotonic()
    asyncio.run(start_run(url, markers))

    # worker A: runs step 1, starts step 2, and blocks there until it is killed
    log_a, log_b = tmp_path / "worker-a.log", tmp_path / "worker-b.log"
    a = spawn(url, markers, "worker-a", log_a, block=True)
    survivor: subprocess.Popen[Any] | None = None
    try:
        wait_for_line(markers / "step2.log", 1, a, log_a)
        os.kill(a.pid, signal.SIGKILL)
        assert a.wait(timeout=10) == -signal.SIGKILL
        killed_at = time.monotonic()

        run, history = asyncio.run(snapshot(url))
        assert run is not None and run.status is RunStatus.RUNNING
        assert run.lease_owner == "worker-a"  # the dead process still "holds" the lease
        dead_lease_expires = run.lease_expires
        assert dead_lease_expires is not None
        assert [e.type for e in history if e.type.startswith("step_")] == ["step_completed"]
        assert lines(markers / "step3.log") == []

        # worker B: claims the run once worker A's lease has expired, and finishes it
        survivor = spawn(url, markers, "worker-b", log_b, block=False)
        assert survivor.wait(timeout=30) == 0, log_b.read_text()
        took_over_after = time.monotonic() - killed_at
    finally:
        for p in (a, survivor):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()

    run, history = asyncio.run(snapshot(url))
    assert run is not None and run.status is RunStatus.COMPLETED, (run, log_b.read_text())
    assert run.output == [5, 50, 53]
    assert run.lease_owner is None

    step1, step2, step3 = (executions(markers / f"step{i}.log") for i in (1, 2, 3))
    assert survivor is not None
    # completed before the crash: never again; interrupted: executed again by the survivor
    assert [(x[0], x[1]) for x in step1] == [("worker-a", a.pid)]
    assert [(x[0], x[1]) for x in step2] == [("worker-a", a.pid), ("worker-b", survivor.pid)]
    assert [(x[0], x[1]) for x in step3] == [("worker-b", survivor.pid)]
    # the survivor waited for the dead worker's lease to expire instead of stealing it
    assert step2[1][2] >= dead_lease_expires, (step2, dead_lease_expires)

    completed = [e for e in history if e.type == "step_completed"]
    positions = Counter(getattr(e, "pos", None) for e in completed)
    assert len(completed) == 3 and all(n == 1 for n in positions.values()), history.types
    assert [getattr(e, "name", None) for e in completed] == [
        "Crash3.step1",
        "Crash3.step2",
        "Crash3.step3",
    ]
    assert history.types[0] == "run_started" and history.types[-1] == "run_completed"
    assert history.types.count("run_completed") == 1
    assert "step_failed" not in history.types
    assert took_over_after < 15 and time.monotonic() - t0 < 20, took_over_after


@pytest.mark.parametrize("kind", ["sqlite", PG])
def test_a_worker_restarted_with_its_instance_id_takes_its_runs_back_at_once(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The same instance id after a SIGKILL (a deploy, a pod restart): the new process owns
    the dead one's leases, so it resumes their runs at once instead of after a 60 s lease."""
    url = _url(kind, request, tmp_path)
    markers = tmp_path / "markers"
    markers.mkdir()
    asyncio.run(start_run(url, markers))
    log_a, log_b = tmp_path / "first.log", tmp_path / "restarted.log"
    first = spawn(url, markers, "worker-1", log_a, block=True, lease_ttl=60)
    restarted: subprocess.Popen[Any] | None = None
    try:
        wait_for_line(markers / "step2.log", 1, first, log_a)
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL
        run, _ = asyncio.run(snapshot(url))
        assert run is not None and run.lease_owner == "worker-1"
        dead_lease_expires = run.lease_expires
        assert dead_lease_expires is not None
        restarted = spawn(url, markers, "worker-1", log_b, block=False, lease_ttl=60)
        # (the bound only ends a broken run early: the assertions below are on the history)
        assert restarted.wait(timeout=45) == 0, log_b.read_text()
    finally:
        for p in (first, restarted):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    run, history = asyncio.run(snapshot(url))
    assert run is not None and run.status is RunStatus.COMPLETED, (run, log_b.read_text())
    assert run.output == [5, 50, 53]
    step2 = executions(markers / "step2.log")
    assert restarted is not None
    assert [(x[0], x[1]) for x in step2] == [("worker-1", first.pid), ("worker-1", restarted.pid)]
    # it did not wait for its own dead lease: the run settled before that lease would expire
    assert history.events[-1].at < dead_lease_expires, (history.events[-1].at, dead_lease_expires)
    assert history.types.count("step_completed") == 3
