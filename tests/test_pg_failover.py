"""A primary failover under load (issue #19, item 9): a primary and a synchronous
streaming-replication standby (tests/pg.py ``replicated_pair``), worker processes
(tests/chaos_worker.py) on a multi-host URL with ``target_session_attrs=read-write``; the
primary is stopped with ``pg_ctl stop -m immediate`` and the standby promoted.

Asserted: every run settles; every event of the histories as they stood just before the
failover (read on the primary, and seen replayed on the standby) is still there, at the same
place; the invariants of tests/chaos_kit.py (no committed step re-run, none recorded twice, no
key with two holders, no run executed by two processes at once); and the workers reach the
new primary by themselves: the runs in flight resume within a few seconds of the promotion
(the target is the issue's 2 s, asserted as 5 s; the figure is printed with ``pytest -s``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

try:
    from chaos_kit import (
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
    from pg import PgServer, PostgresUnavailable, fresh_database, multi_host_url, replicated_pair
except ImportError:  # tests/ imported as a package
    from tests.chaos_kit import (
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
    from tests.pg import (
        PgServer,
        PostgresUnavailable,
        fresh_database,
        multi_host_url,
        replicated_pair,
    )

pytestmark = pytest.mark.postgres

RECOVERY_BOUND = 5.0


@pytest.fixture
def pair() -> Iterator[tuple[PgServer, PgServer]]:
    with contextlib.ExitStack() as stack:
        try:
            p = stack.enter_context(replicated_pair())
        except PostgresUnavailable as exc:
            if os.environ.get("FLOWKIT_REQUIRE_POSTGRES") == "1":
                pytest.fail(f"PostgreSQL required but unavailable: {exc}")
            pytest.skip(f"PostgreSQL unavailable: {exc}")
        yield p


def wait_replayed(primary: PgServer, standby: PgServer, database: str) -> None:
    """Wait until the standby has replayed everything the primary had written so far."""
    with psycopg.connect(primary.dsn.replace("dbname=postgres", f"dbname={database}")) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    lsn = row[0]
    with psycopg.connect(standby.dsn, autocommit=True) as conn:

        def replayed() -> bool:
            got = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [lsn]).fetchone()
            return bool(got and got[0])

        wait_until(replayed, 30, "the standby replays the primary's WAL")


def failover(
    pair: tuple[PgServer, PgServer], tmp_path: Path, work: Workload, lease_ttl: float
) -> tuple[float, dict[str, float]]:
    primary, standby = pair
    direct = fresh_database(primary.url)
    database = direct.rsplit("/", 1)[1].split("?", 1)[0]
    url = multi_host_url(primary, standby, database=database)
    asyncio.run(start_runs(url, work, tmp_path / "client-marks.log"))
    total = work.steps * (work.plain + work.single)
    ids = run_ids(work)
    with cluster(url, None, tmp_path, lease_ttl) as c:
        for i in range(3):
            c.spawn(f"w{i}")
        wait_until(lambda: completed_steps(c.marks) >= total // 3, 60, "progress", c)
        before = snapshot(direct, ids)
        wait_replayed(primary, standby, database)
        t_fault = time.time()
        primary.stop("immediate")
        standby.promote()
        t_up = time.time()
        print(f"FIGURE failover: primary stopped and standby promoted in {t_up - t_fault:.2f} s")
        wait_settled(url, 120, c)
        died = c.dead()
        c.stop()
        assert not died, died
        assert all(code == 0 for _, _, code in c.exits), c.logs()
        logs = c.logs()
    after = snapshot(url, ids)
    lost = []
    for run_id, (_, events) in before.items():
        now = after[run_id][1]
        kept = [(e.seq, e.type, e.at) for e in now[: len(events)]]
        if kept != [(e.seq, e.type, e.at) for e in events]:
            lost.append((run_id, [e.type for e in events], [e.type for e in now]))
    assert not lost, lost
    execs = read_executions(c.marks)
    broken = violations(work, after, execs, c.deaths)
    assert not broken, "\n".join(broken[:30]) + f"\n({len(broken)} in all)\n{logs}"
    worst, per = recovery(histories(after), execs, t_fault, t_up)
    print(f"FIGURE failover: in-flight runs {len(per)}, slowest resumed {worst:.2f} s after")
    return worst, per


def test_primary_failover_under_load(pair: tuple[PgServer, PgServer], tmp_path: Path) -> None:
    worst, per = failover(pair, tmp_path, Workload(), lease_ttl=10.0)
    assert per, "no run was in flight at the failover"
    assert worst <= RECOVERY_BOUND, per


@pytest.mark.chaos
def test_primary_failover_long(pair: tuple[PgServer, PgServer], tmp_path: Path) -> None:
    work = Workload(plain=80, single=40, keys=5, steps=6, hold=0.1)
    worst, per = failover(pair, tmp_path, work, lease_ttl=10.0)
    assert per, "no run was in flight at the failover"
    assert worst <= RECOVERY_BOUND, per
