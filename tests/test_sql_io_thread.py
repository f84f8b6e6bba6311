"""Store I/O off the event loop (``_iothread``): the loop keeps ticking while a call waits on
a stalled PostgreSQL connection or another process's SQLite write lock, a call can be
cancelled (``asyncio.wait_for``), and a call stuck past ``stall_timeout`` is abandoned with
``StoreUnavailableError`` while a fresh connection serves the next calls."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_kit import T0, delta, mk, put, stats

from flowkit.errors import StoreUnavailableError
from flowkit.stores.sql import SqlStore
from flowkit_testing._netproxy import NetProxy


class Sleeper:
    """A coroutine that sleeps 1 ms at a time and records how late it wakes (the loop lag)."""

    def __init__(self) -> None:
        self.lags: list[float] = []

    async def run(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while loop.time() < end:
            t = loop.time()
            await asyncio.sleep(0.001)
            self.lags.append(loop.time() - t - 0.001)


@pytest.mark.postgres
async def test_the_loop_keeps_ticking_and_wait_for_returns_while_postgres_stalls(
    proxied: tuple[NetProxy, str],
) -> None:
    proxy, url = proxied
    s = SqlStore(url, stall_timeout=30)
    try:
        await put(s, mk("r"))
        assert await s.get_run("r") is not None  # (both connections open)
        proxy.stall()
        stalled = asyncio.ensure_future(s.get_run("r"))
        sleeper = Sleeper()
        await sleeper.run(1.0)
        assert not stalled.done()
        # the loop was never held by the stalled call (it was, for the whole stall, before)
        assert len(sleeper.lags) > 100 and max(sleeper.lags) < 0.5
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(s.get_run("r"), 0.5)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(s.claim("r", "w", T0, T0 + 30), 0.5)
        assert loop.time() - t0 < 3.0  # (≈1 s: each wait_for returned at its timeout)
        proxy.resume()
        run = await stalled  # the stalled read finishes once the link flows again
        assert run is not None and run.id == "r"
        # the cancelled claim either never ran or ran in the background: the store is usable
        again = await s.get_run("r")
        assert again is not None
    finally:
        proxy.resume()
        s.close()


@pytest.mark.postgres
async def test_a_stalled_call_is_abandoned_and_a_fresh_connection_serves_the_next(
    proxied: tuple[NetProxy, str],
) -> None:
    proxy, url = proxied
    s = SqlStore(url, stall_timeout=1.0)
    try:
        await put(s, mk("r"))
        assert await s.get_run("r") is not None
        old = {c.dbapi.info.backend_pid for c in s._db.connections()}
        assert len(old) == 2
        proxy.stall()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        read, write = await asyncio.gather(
            s.get_run("r"), s.claim("r", "w", T0, T0 + 30), return_exceptions=True
        )
        took = loop.time() - t0
        assert isinstance(read, StoreUnavailableError), read
        assert isinstance(write, StoreUnavailableError), write
        assert "stall_timeout" in str(read)
        assert 0.9 <= took < 5.0  # (abandoned at the bound, 1 s)
        # abandoned connections are never used again
        assert not old & {c.dbapi.info.backend_pid for c in s._db.connections()}
        proxy.resume()
        # the next calls run at once on fresh lanes and connections
        run = await s.get_run("r")
        assert run is not None
        # the abandoned claim may have committed meanwhile (that ambiguity is why it raised
        # StoreUnavailableError); a claim by its owner goes through either way
        # (it may land between the read above and this claim: then the claim finds the lease
        # live, and a read after it shows the abandoned claim's lease)
        got = await s.claim("r", "w", T0 + 1, T0 + 31)
        after = await s.get_run("r")
        assert got is not None or (after is not None and after.lease_owner == "w")
        assert {c.dbapi.info.backend_pid for c in s._db.connections()}.isdisjoint(old)
    finally:
        proxy.resume()
        s.close()


@pytest.mark.postgres
async def test_the_stall_timeout_comes_from_the_url_too(proxied: tuple[NetProxy, str]) -> None:
    proxy, url = proxied
    sep = "&" if "?" in url else "?"
    s = SqlStore(f"{url}{sep}flowkit_stall_timeout=0.5")
    try:
        assert s._db.stall_timeout == 0.5
        await put(s, mk("r"))
        proxy.stall()
        with pytest.raises(StoreUnavailableError):
            await s.get_run("r")
        proxy.resume()
        assert await s.get_run("r") is not None
    finally:
        proxy.resume()
        s.close()
    never = SqlStore(f"{url}{sep}flowkit_stall_timeout=0")
    assert never._db.stall_timeout == 0
    never.close()


async def test_group_commit_still_batches_on_the_io_thread(gc_backend: object) -> None:
    s = gc_backend.store  # type: ignore[attr-defined]
    for i in range(32):
        await put(s, mk(f"r{i}"))
    before = stats(s)
    got = await asyncio.gather(*(s.claim(f"r{i}", "w", T0, T0 + 30) for i in range(32)))
    assert all(r is not None and r.lease_owner == "w" for r in got)
    assert delta(s, before, "ops") == 32
    # far fewer transactions than calls: they shared batches (pipelined: the calls issued
    # while one batch was on the write lane went together in the next)
    assert delta(s, before, "write_tx") + delta(s, before, "batches") < 32
    assert delta(s, before, "batched_ops") + delta(s, before, "single_batches") > 0


_HOLDER = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN IMMEDIATE")
con.execute("UPDATE flowkit_runs SET updated_at = updated_at")
print("locked", flush=True)
sys.stdin.readline()
con.execute("COMMIT")
print("released", flush=True)
"""


def _hold_write_lock(path: Path) -> subprocess.Popen[str]:
    """Another process that takes the file's write lock and holds it until told."""
    return subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


async def test_a_write_waiting_for_another_processs_sqlite_lock_does_not_block_the_loop(
    tmp_path: Path,
) -> None:
    path = tmp_path / "locked.db"
    s = SqlStore(f"sqlite:///{path}")
    holder = None
    try:
        await put(s, mk("r"))
        holder = _hold_write_lock(path)
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "locked"
        claim = asyncio.ensure_future(s.claim("r", "w", T0, T0 + 30))
        sleeper = Sleeper()
        await sleeper.run(0.5)
        assert not claim.done()  # it waits for the other process's lock ...
        assert len(sleeper.lags) > 50 and max(sleeper.lags) < 0.25  # ... off the loop
        assert await s.get_run("r") is not None  # reads go on meanwhile (WAL, read lane)
        holder.stdin.write("\n")
        holder.stdin.flush()
        got = await claim
        assert got is not None and got.lease_owner == "w"
        assert holder.stdout.readline().strip() == "released"
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        s.close()


def test_a_store_used_from_two_event_loops_in_two_threads(tmp_path: Path) -> None:
    """Two loops (threads) share the store's I/O threads; each gets its own results."""
    import threading

    s = SqlStore(f"sqlite:///{tmp_path / 'two.db'}")
    errors: list[BaseException] = []

    def worker(prefix: str) -> None:
        async def main() -> None:
            for i in range(20):
                await put(s, mk(f"{prefix}{i}"))
            got = await asyncio.gather(
                *(s.claim(f"{prefix}{i}", prefix, T0, T0 + 30) for i in range(20))
            )
            assert [r.lease_owner if r else None for r in got] == [prefix] * 20

        try:
            asyncio.run(main())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(p,)) for p in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    s.close()
    assert errors == []
    assert all(not t.is_alive() for t in threads)


def test_timeouts_use_no_wall_clock_in_the_store() -> None:
    """(a guard) the store's I/O deadlines read the event loop's clock, not ``time``."""
    src = Path(__file__).parent.parent / "flowkit" / "stores" / "sql" / "_iothread.py"
    assert "time.monotonic" not in src.read_text() and "time.time" not in src.read_text()
    assert time.monotonic() > 0
