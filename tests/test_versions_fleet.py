"""A mixed fleet on one PostgreSQL database, with real processes (tests/version_worker.py): a
v1-only worker and a v1+v2 worker. v1 runs run on either, v2 runs only on the v1+v2 one;
with the v1+v2 process stopped, v2 runs wait (``pending``, never failed) while v1 runs still
complete, and they complete once it is back."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pg import fresh_database
from version_kit import NAME, GreetV1, GreetV2

from flowkit import Engine, RunStatus
from flowkit.stores import SqlStore

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "version_worker.py"
ENV = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}


class Fleet:
    """The worker processes of one test; each is stopped (SIGTERM, then waited for) at the
    end, whatever happened."""

    def __init__(self, url: str, logs: Path) -> None:
        self.url = url
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, instance: str, versions: str) -> None:
        log = open(self.logs / f"{instance}.log", "ab")  # noqa: SIM115 (the child owns it)
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), self.url, instance, versions],
            cwd=ROOT,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=log,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready", self.log(instance)
        self.procs[instance] = proc

    def stop(self, instance: str) -> None:
        proc = self.procs.pop(instance)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, self.log(instance)

    def log(self, instance: str) -> str:
        return (self.logs / f"{instance}.log").read_text(errors="replace")

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait()


@pytest.fixture
def fleet(pg_server: str, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(fresh_database(pg_server, "flowkit_fleet"), tmp_path)
    yield f
    f.close()


async def test_a_mixed_fleet_runs_each_version_only_where_it_is_registered(fleet: Fleet) -> None:
    store = SqlStore(fleet.url)
    try:
        client = Engine(store, [GreetV1, GreetV2], worker=False)
        fleet.start("old", "1")
        fleet.start("new", "1,2")
        first = await _start(client, "a", 6)
        await _all_done(client, first)
        for r in first["2"]:  # v2 runs: only on the v1+v2 process
            assert await client.result(r, timeout=30) == f"v2:{_n(r)}:new"
        for r in first["1"]:
            assert await client.result(r, timeout=30) == _n(r) + 1
        seen = {w.instance_id: w.versions for w in await store.workers()}
        assert seen == {"old": ((NAME, "1"),), "new": ((NAME, "1"), (NAME, "2"))}

        fleet.stop("new")  # (its leases given back: nothing of it is left running)
        second = await _start(client, "b", 6)
        for r in second["1"]:  # v1 runs still complete, on the v1-only process
            assert await client.result(r, timeout=30) == _n(r) + 1
        for r in second["2"]:  # v2 runs wait: never claimed by "old", never failed
            run = await client.get_run(r)
            assert (run.status, run.lease_owner) == (RunStatus.PENDING, None), run
            assert (await client.history(r)).types == ["run_started"]

        fleet.start("new", "1,2")
        for r in second["2"]:
            assert await client.result(r, timeout=30) == f"v2:{_n(r)}:new"
        fleet.stop("new")
        fleet.stop("old")
    finally:
        store.close()


def _n(run_id: str) -> int:
    return int(run_id.rsplit("-", 1)[1])


async def _start(client: Engine, prefix: str, n: int) -> dict[str, list[str]]:
    """``n`` runs of each version, interleaved: ids ``{prefix}{version}-{i}``."""
    out: dict[str, list[str]] = {"1": [], "2": []}
    for i in range(n):
        for v in ("2", "1"):  # (v2 first: each v1 run done proves a poll that saw them)
            run: Any = await client.start(NAME, i, f"{prefix}{v}-{i}", version=v)
            out[v].append(run.id)
    return out


async def _all_done(client: Engine, runs: dict[str, list[str]]) -> None:
    for ids in runs.values():
        for r in ids:
            await client.result(r, timeout=30)
