"""The PostgreSQL chaos suite (issue #19, item 8): real worker processes
(tests/chaos_worker.py), a real server (tests/pg.py), faults injected for real: the server
restarted under load, every connection reset, one worker's connections stalled for longer
than the lease (each worker talks to the server through its own ``NetProxy``), a worker
killed with SIGKILL and restarted. After each: no committed step re-ran, no step recorded
twice, no key had two holders, no run executed by two processes at once, every run settled,
no worker died, and the runs in flight resumed within the recovery target, asserted loosely.

The targets (issue #19): after ``pg_ctl restart -m fast`` (or a reset of every connection)
in-flight runs resume within 2 s of the server accepting connections again; asserted as 5 s.
A worker that cannot prove its lease is live stops working on the run; the others take it
over once the lease has expired. The figures are printed (``pytest -s``).

The default run is one fault per test; ``pytest -m chaos tests/test_pg_chaos.py`` adds a
longer workload with repeated faults of every kind, and a loop hunting the SIGSEGV the issue
reports (workers with an extra psycopg async connection, every connection reset)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

try:
    from chaos_kit import (
        Cluster,
        Workload,
        cluster,
        completed_steps,
        histories,
        read_executions,
        recovery,
        run_ids,
        snapshot,
        start_runs,
        violations,
        wait_settled,
        wait_until,
    )
    from pg import PgServer, PostgresUnavailable, fresh_database, started_server
except ImportError:  # tests/ imported as a package
    from tests.chaos_kit import (
        Cluster,
        Workload,
        cluster,
        completed_steps,
        histories,
        read_executions,
        recovery,
        run_ids,
        snapshot,
        start_runs,
        violations,
        wait_settled,
        wait_until,
    )
    from tests.pg import PgServer, PostgresUnavailable, fresh_database, started_server

pytestmark = pytest.mark.postgres

RECOVERY_BOUND = 5.0
"""Seconds: the issue's target is 2 s after the server accepts connections; asserted loosely."""

Fault = Callable[[Cluster], tuple[float, float]]
"""Injects a fault; returns (when it began, when the database was usable again)."""


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    """A server of this module's own: the tests restart it."""
    with contextlib.ExitStack() as stack:
        try:
            s = stack.enter_context(started_server())
        except PostgresUnavailable as exc:
            if os.environ.get("FLOWKIT_REQUIRE_POSTGRES") == "1":
                pytest.fail(f"PostgreSQL required but unavailable: {exc}")
            pytest.skip(f"PostgreSQL unavailable: {exc}")
        yield s


def restart(server: PgServer) -> Fault:
    def fault(c: Cluster) -> tuple[float, float]:
        t = time.time()
        server.restart("fast")  # returns once the server accepts connections
        return t, time.time()

    return fault


def reset(c: Cluster) -> tuple[float, float]:
    t = time.time()
    for p in c.proxies():
        p.reset()
    return t, t


def stall(instance: str, seconds: float) -> Fault:
    """Stall one worker's connections (open, silent) for ``seconds``; the 'up' time returned
    is the stall's start: the other workers must take its runs over meanwhile."""

    def fault(c: Cluster) -> tuple[float, float]:
        proxy = c.workers[instance].proxy
        assert proxy is not None
        t = time.time()
        proxy.stall()
        time.sleep(seconds)  # the fault's duration, not a synchronization
        proxy.resume()
        return t, t

    return fault


def kill_and_restart(instance: str) -> Fault:
    """SIGKILL a worker and start it again under the same instance id; 'up' is when the new
    process is ready."""

    def fault(c: Cluster) -> tuple[float, float]:
        t = c.kill(instance)
        w = c.spawn(instance)
        wait_until(lambda: "ready" in w.log.read_text(), 30, f"{instance} restarted", c)
        return t, time.time()

    return fault


def run_scenario(
    server: PgServer,
    tmp_path: Path,
    faults: list[tuple[str, Fault]],
    *,
    work: Workload,
    lease_ttl: float,
    workers: int = 3,
    extra_connection: bool = False,
) -> list[tuple[str, float, dict[str, float]]]:
    """Start ``work``, run ``workers`` workers (each through a proxy), inject ``faults`` at
    evenly spaced points of progress, wait until every run settled, check every invariant;
    return each fault's recovery (the maximum and per run)."""
    url = fresh_database(server.url)
    asyncio.run(start_runs(url, work, tmp_path / "client-marks.log"))
    total = work.steps * (work.plain + work.single)
    times: list[tuple[str, float, float]] = []
    with cluster(
        url, server.socket_path, tmp_path, lease_ttl, extra_connection=extra_connection
    ) as c:
        for i in range(workers):
            c.spawn(f"w{i}")
        for n, (name, fault) in enumerate(faults):
            target = (n + 1) * total // (len(faults) + 2)
            wait_until(lambda t=target: completed_steps(c.marks) >= t, 60, f"{target} steps", c)
            assert not c.dead(), c.dead()
            times.append((name, *fault(c)))
        wait_settled(url, 120, c)
        died = c.dead()  # exited before they were asked to
        c.stop()
        assert not died, died
        bad_exits = [e for e in c.exits if e[2] != 0 and e[1] not in c.deaths]
        assert not bad_exits, (bad_exits, c.logs())
        logs = c.logs()
    snap = snapshot(url, run_ids(work))
    execs = read_executions(c.marks)
    broken = violations(work, snap, execs, c.deaths)
    assert not broken, "\n".join(broken[:30]) + f"\n({len(broken)} in all)\n{logs}"
    out = []
    for name, t_fault, t_up in times:
        worst, per = recovery(histories(snap), execs, t_fault, t_up)
        print(f"FIGURE {name}: in-flight runs {len(per)}, slowest resumed {worst:.2f} s after")
        out.append((name, worst, per))
    lags = [line for line in logs.splitlines() if "max-loop-lag" in line]
    print("FIGURE loop lag:", "; ".join(lags))
    return out


def test_server_restart_under_load(server: PgServer, tmp_path: Path) -> None:
    """``pg_ctl restart -m fast`` under load: runs resume within seconds, not a lease."""
    [(_, worst, per)] = run_scenario(
        server, tmp_path, [("restart", restart(server))], work=Workload(), lease_ttl=10.0
    )
    assert per, "no run was in flight at the restart"
    assert worst <= RECOVERY_BOUND, per


def test_every_connection_reset(server: PgServer, tmp_path: Path) -> None:
    """Every connection of every worker reset at once (each worker also has an extra async
    psycopg connection, as in the issue's harness): runs resume within seconds."""
    [(_, worst, per)] = run_scenario(
        server, tmp_path, [("reset", reset)], work=Workload(), lease_ttl=10.0,
        extra_connection=True,
    )  # fmt: skip
    assert per, "no run was in flight at the reset"
    assert worst <= RECOVERY_BOUND, per


def test_stall_longer_than_the_lease(server: PgServer, tmp_path: Path) -> None:
    """One worker's connections stall for longer than the lease: the others take its runs
    over once its leases expire, and it never goes on running their steps beside them (the
    invariants: no run executed by two processes at once, no committed step re-run)."""
    lease = 3.0
    [(_, worst, per)] = run_scenario(
        server, tmp_path, [("stall", stall("w0", 2 * lease))], work=Workload(), lease_ttl=lease
    )
    assert per, "no run was in flight at the stall"
    assert worst <= lease + RECOVERY_BOUND, per


def test_kill_9_a_worker_and_restart_it(server: PgServer, tmp_path: Path) -> None:
    """SIGKILL of a worker mid-load, restarted under its instance id: it takes its runs back
    at once (they are its own leases), the interrupted steps run again, nothing else does."""
    [(_, worst, per)] = run_scenario(
        server, tmp_path, [("kill -9", kill_and_restart("w0"))], work=Workload(),
        lease_ttl=10.0,
    )  # fmt: skip
    assert per, "no run was in flight at the kill"
    assert worst <= RECOVERY_BOUND, per


@pytest.mark.chaos
def test_long_repeated_faults(server: PgServer, tmp_path: Path) -> None:
    """A longer workload through every kind of fault, twice."""
    lease = 3.0
    faults: list[tuple[str, Fault]] = [
        ("restart", restart(server)),
        ("reset", reset),
        ("stall", stall("w1", 2 * lease)),
        ("kill -9", kill_and_restart("w2")),
        ("restart", restart(server)),
        ("reset", reset),
        ("kill -9", kill_and_restart("w0")),
        ("stall", stall("w2", 2 * lease)),
    ]
    work = Workload(plain=80, single=40, keys=5, steps=6, hold=0.1)
    results = run_scenario(server, tmp_path, faults, work=work, lease_ttl=lease)
    for name, worst, per in results:
        bound = lease + RECOVERY_BOUND if name == "stall" else RECOVERY_BOUND
        assert worst <= bound, (name, per)


@pytest.mark.chaos
def test_sigsegv_hunt_reset_with_extra_async_connections(server: PgServer, tmp_path: Path) -> None:
    """The issue's SIGSEGV: two workers died in libc 6-7 s after every connection was reset,
    in a harness with an extra psycopg async connection in each worker. Repeat that
    (``FLOWKIT_SEGV_ITERATIONS``, default 20) with faulthandler on, watching each worker for
    10 s after the reset; a worker killed by a signal fails the test with its log (the
    faulthandler traceback)."""
    iterations = int(os.environ.get("FLOWKIT_SEGV_ITERATIONS", "20"))
    work = Workload(plain=16, single=8, keys=3, steps=4, hold=0.1)
    for i in range(iterations):
        tmp = tmp_path / f"it{i}"
        tmp.mkdir()
        url = fresh_database(server.url)
        asyncio.run(start_runs(url, work, tmp / "client-marks.log"))
        with cluster(url, server.socket_path, tmp, 10.0, extra_connection=True) as c:
            for n in range(2):
                c.spawn(f"w{n}")
            wait_until(lambda: completed_steps(c.marks) >= 10, 60, "progress", c)
            for p in c.proxies():
                p.reset()
            watch_until = time.monotonic() + 10
            while time.monotonic() < watch_until and not c.dead():
                time.sleep(0.1)  # an observation window: a crash is what we look for
            died = c.dead()
            signalled = [(w, code) for w, code, _ in died if code < 0]
            assert not signalled, (i, signalled, c.logs())
            wait_settled(url, 120, c)
            c.stop()
        codes = [code for _, _, code in c.exits]
        print(f"SEGV-HUNT iteration {i}: exit codes {codes}")
        assert all(code == 0 for code in codes), (i, c.logs())
        assert -signal.SIGSEGV not in codes
