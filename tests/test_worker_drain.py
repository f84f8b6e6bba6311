"""``flowkit worker`` in real processes on a SQLite file and on PostgreSQL (docs/deploying.md): on
SIGTERM/SIGINT a worker claims nothing more, lets its activations reach a durable point within
``--grace``, gives their leases back and exits 0, so another worker finishes a run that was
mid-step long before the lease TTL (300 s here); a second signal exits at once (143)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from drain_app import DrainJob
from store_kit import Backend

from flowkit import Engine

ROOT = Path(__file__).resolve().parent.parent
TTL = "300"  # far above every bound below: a run finished in time was not recovered by expiry
BOUND = 60.0


async def until(cond: Callable[[], bool], what: str, limit: float = BOUND) -> None:
    """Poll ``cond`` until it holds; fail after ``limit`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit
    while not cond():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def spawn(url: str, name: str, tmp: Path, *extra: str) -> asyncio.subprocess.Process:
    """``flowkit worker drain_app:WORKFLOWS`` as a process, its log in ``tmp/<name>.log``."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    with (tmp / f"{name}.log").open("wb") as log:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "flowkit.cli",
            "worker",
            "drain_app:WORKFLOWS",
            "--db",
            url,
            "--instance-id",
            name,
            "--lease-ttl",
            TTL,
            *extra,
            env=env,
            cwd=tmp,
            stdout=log,
            stderr=log,
        )


def log_of(tmp: Path, name: str) -> str:
    return (tmp / f"{name}.log").read_text()


def started(folder: Path, step: str, proc: asyncio.subprocess.Process) -> Callable[[], bool]:
    return lambda: (folder / f"started-{step}-{proc.pid}").exists()


async def _setup(sql_backend: Backend, tmp_path: Path) -> tuple[str, Path, Engine]:
    url = sql_backend.url
    assert url is not None
    folder = tmp_path / "gates"
    folder.mkdir()
    return url, folder, Engine(sql_backend.store, [DrainJob], worker=False)


async def _end(proc: asyncio.subprocess.Process) -> int:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(proc.wait(), BOUND)


async def test_sigterm_mid_step_hands_the_run_over_at_once(
    sql_backend: Backend, tmp_path: Path
) -> None:
    url, folder, client = await _setup(sql_backend, tmp_path)
    a = await spawn(url, "wa", tmp_path, "--grace", "0.5", "--log-format", "json")
    b = None
    try:
        run = await client.start(DrainJob, str(folder))
        await until(started(folder, "a", a), "worker a to start step a")
        b = await spawn(url, "wb", tmp_path)
        await until(lambda: "serving drain_job" in log_of(tmp_path, "wb"), "worker b to serve")
        a.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(a.wait(), BOUND) == 0
        # the step never reached its end on a: b runs it again, long before the lease's TTL
        await until(started(folder, "a", b), "worker b to take the run over")
        (folder / "go-a").touch()
        (folder / "go-b").touch()
        out = await asyncio.wait_for(client.result(run.id), BOUND)
        assert out == f"a@{b.pid} b@{b.pid}"
        lines = [json.loads(x) for x in log_of(tmp_path, "wa").splitlines() if x.startswith("{")]
        said = [x["message"] for x in lines if x["logger"] == "flowkit.worker"]
        assert any(m.startswith("SIGTERM: draining") for m in said), said
        assert any("drained" in m for m in said), said
        assert all({"time", "level", "logger", "message"} <= set(x) for x in lines)
    finally:
        assert await _end(a) == 0
        if b is not None:
            assert await _end(b) == 0


async def test_sigint_lets_the_running_step_end_then_stops(
    sql_backend: Backend, tmp_path: Path
) -> None:
    """The step running at the signal ends within the grace and is recorded; the next one
    does not start on the draining worker: it exits 0 without waiting out the grace (120 s)."""
    url, folder, client = await _setup(sql_backend, tmp_path)
    a = await spawn(url, "wa", tmp_path, "--grace", "120")
    b = None
    try:
        run = await client.start(DrainJob, str(folder))
        await until(started(folder, "a", a), "worker a to start step a")
        a.send_signal(signal.SIGINT)
        await until(lambda: "SIGINT: draining" in log_of(tmp_path, "wa"), "the drain")
        (folder / "go-a").touch()
        assert await asyncio.wait_for(a.wait(), BOUND) == 0
        held = await client.get_run(run.id)
        assert held.status.active and held.lease_owner is None  # given back
        types = [e.type for e in await sql_backend.store.load_events(run.id)]
        assert types.count("step_completed") == 1
        assert not list(folder.glob("started-b-*"))
        b = await spawn(url, "wb", tmp_path)
        await until(started(folder, "b", b), "worker b to run step b")
        (folder / "go-b").touch()
        out = await asyncio.wait_for(client.result(run.id), BOUND)
        assert out == f"a@{a.pid} b@{b.pid}"
    finally:
        assert await _end(a) == 0
        if b is not None:
            assert await _end(b) == 0


async def test_a_second_signal_exits_at_once(sql_backend: Backend, tmp_path: Path) -> None:
    url, folder, client = await _setup(sql_backend, tmp_path)
    a = await spawn(url, "wa", tmp_path, "--grace", "120")
    try:
        run = await client.start(DrainJob, str(folder))
        await until(started(folder, "a", a), "worker a to start step a")
        a.send_signal(signal.SIGTERM)
        await until(lambda: "SIGTERM: draining" in log_of(tmp_path, "wa"), "the drain")
        a.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(a.wait(), BOUND) == 128 + signal.SIGTERM
        assert "second SIGTERM: exiting at once" in log_of(tmp_path, "wa")
        # nothing was given back: the lease is left to expire
        assert (await client.get_run(run.id)).lease_owner == "wa"
    finally:
        if a.returncode is None:
            a.kill()
            await a.wait()
