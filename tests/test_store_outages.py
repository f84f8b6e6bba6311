"""A SqlStore on PostgreSQL through outages: a server that is down, one that accepts and never
answers, a stalled link, every connection reset, and ``pg_ctl restart -m fast`` under a loop
of calls. Only flowkit errors come out, a stuck call ends within its bounds, and what provably
did not commit is retried on a fresh connection (docs/stores.md, "Timeouts and failures").

A proxy (``flowkit_testing._netproxy``) stands between the store and the test server's unix
socket; the restart and down-server tests run their own throwaway server."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from store_kit import T0, fired, mk, put

try:
    from pg import PgServer, fresh_database, running_postgres, socket_of
except ImportError:  # tests/ imported as a package
    from tests.pg import PgServer, fresh_database, running_postgres, socket_of

from flowkit.errors import FlowkitError, RunNotFoundError, StoreUnavailableError
from flowkit.stores.base import Update
from flowkit.stores.sql import SqlStore, _errors
from flowkit_testing._netproxy import NetProxy


def _with(url: str, params: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{params}"


@pytest.fixture
def db_url(pg_server: str) -> str:
    return fresh_database(pg_server)


@pytest.fixture
def own_server() -> Iterator[PgServer]:
    """A throwaway server of the test's own, to stop and restart."""
    with running_postgres() as server:
        yield server


@pytest.fixture
def short_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries give up after 0.3 s instead of 2.5 s (a down server fails each call sooner)."""
    monkeypatch.setattr(_errors, "RETRY_BUDGET", 0.3)


def _public_calls(store: SqlStore) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Every public coroutine of the store, with plausible arguments."""
    upd = Update(events=[fired(T0 + 1)])
    return {
        "create_run": lambda: put(store, mk("new")),
        "get_run": lambda: store.get_run("a"),
        "list_runs": lambda: store.list_runs(),
        "load_events": lambda: store.load_events("a"),
        "claim": lambda: store.claim("a", "w", T0 + 1, T0 + 31),
        "release_leases": lambda: store.release_leases("w", T0 + 1),
        "renew_lease": lambda: store.renew_lease("a", "w", T0 + 40),
        "commit": lambda: store.commit("a", None, T0 + 1, upd),
        "append_events": lambda: store.append_events("a", "w", T0 + 1, [fired(T0 + 1, "9")]),
        "due_runs": lambda: store.due_runs(T0 + 1, 10),
        "next_due_at": lambda: store.next_due_at(),
        "next_due_after": lambda: store.next_due_after(T0),
        "deliver_signal": lambda: store.deliver_signal("a", "s", {"x": 1}, T0 + 1),
        "peek_signal": lambda: store.peek_signal("a", "s"),
        "try_admit_singleton": lambda: store.try_admit_singleton("a", "singleton:k", "wf", 1),
        "scoped.get_run": lambda: store.scoped("ns").get_run("a"),
    }


async def test_every_public_call_on_a_down_server_raises_only_flowkit_errors(
    own_server: PgServer, short_budget: None
) -> None:
    url = own_server.url
    warm = SqlStore(url)  # schema made, connection open: then the server goes away
    await put(warm, mk("a"))
    own_server.stop("fast")  # (a clean stop: the test server does not flush its WAL at commit)
    try:
        cold = SqlStore(url)  # never connected: the schema bootstrap fails first
        for store in (warm, cold):
            for name, call in _public_calls(store).items():
                with pytest.raises(FlowkitError) as got:
                    await call()
                assert isinstance(got.value, StoreUnavailableError), (name, got.value)
                assert got.value.__cause__ is not None, name
                assert _errors.is_database_error(got.value.__cause__), name
            unwatch = store.watch(lambda: None)  # a watcher logs and retries, never raises
            unwatch()
        with pytest.raises(StoreUnavailableError):
            SqlStore.check(url)
        warm.close()
        cold.close()  # closing a store on a dead server raises nothing
    finally:
        own_server.start()
    again = SqlStore(url)
    try:
        assert (await again.get_run("a")) is not None
    finally:
        again.close()


async def test_a_server_that_accepts_and_never_answers_fails_within_the_connect_timeout(
    db_url: str,
) -> None:
    with NetProxy(socket_of(db_url)) as proxy:
        proxy.blackhole = True
        store = SqlStore(_with(proxy.url_for(db_url), "connect_timeout=2"))
        t0 = time.monotonic()
        try:
            with pytest.raises(StoreUnavailableError, match="timeout"):
                await store.get_run("x")
        finally:
            store.close()
        # one connect of 2 s, one retry within the 2.5 s budget: generous bound
        assert time.monotonic() - t0 < 15


async def test_a_stalled_link_fails_the_call_within_the_io_timeout(
    db_url: str, short_budget: None
) -> None:
    with NetProxy(socket_of(db_url)) as proxy:
        url = _with(proxy.url_for(db_url), "flowkit_io_timeout=1&connect_timeout=2")
        store = SqlStore(url)
        try:
            await put(store, mk("a"))
            proxy.stall()
            t0 = time.monotonic()
            with pytest.raises(StoreUnavailableError):
                await store.get_run("a")  # a read: retried, but the link stays stalled
            assert time.monotonic() - t0 < 15
            with pytest.raises(StoreUnavailableError):
                await store.claim("a", "w", T0 + 1, T0 + 31)  # may have committed: not retried
            proxy.resume()
            assert (await store.get_run("a")) is not None  # a fresh connection
        finally:
            proxy.resume()
            store.close()


def _until_seen_dead(store: SqlStore) -> None:
    """Wait until the reset reached the store's own connection (the proxy closes its sockets
    asynchronously: a statement sent before the reset arrived may have been lost with it, and
    then, rightly, fails: it might have committed)."""
    deadline = time.monotonic() + 10
    for c in store._db.connections():  # (each I/O lane's)
        while not c.broken():
            assert time.monotonic() < deadline, "the reset never reached the connection"
            time.sleep(0.001)


async def test_after_every_connection_is_reset_the_next_calls_succeed(db_url: str) -> None:
    with NetProxy(socket_of(db_url)) as proxy:
        store = SqlStore(proxy.url_for(db_url))
        try:
            await put(store, mk("a"))
            await put(store, mk("b"))
            calls: list[Callable[[], Awaitable[Any]]] = [
                lambda: store.get_run("a"),  # a read
                lambda: store.claim("a", "w", T0 + 1, T0 + 31),  # one statement
                lambda: put(store, mk("c")),  # create
                lambda: store.commit("a", "w", T0 + 2, Update(events=[fired(T0 + 2)])),
                lambda: store.list_runs(),  # SQLAlchemy's pool
                lambda: store.load_events("b"),
            ]
            for call in calls:
                assert proxy.reset() >= 1
                _until_seen_dead(store)
                await call()  # no error: the dead connection was replaced before sending
            a = await store.get_run("a")
            assert a is not None and a.lease_owner == "w"
            assert [e.seq for e in await store.load_events("a")] == [1, 2]
        finally:
            store.close()


async def test_a_fast_restart_under_a_loop_of_calls(own_server: PgServer) -> None:
    """``pg_ctl restart -m fast`` while reads, starts and claims run: no raw exception; each
    call either succeeds (retried after the restart) or raises ``StoreUnavailableError``; calls
    succeed again within 2 s of the server accepting connections; the wake-up watcher
    reconnects and delivers wake-ups again."""
    store = SqlStore(own_server.url)
    woke = asyncio.Event()
    unwatch = store.watch(woke.set)
    try:
        await put(store, mk("seed"))
        hub = store._db.hub()
        assert hub is not None
        await asyncio.wait_for(hub.ready.wait(), 10)
        connects = hub.stats["connects"]
        up_at: list[float] = []

        def restart() -> None:
            own_server.restart("fast")
            up_at.append(time.monotonic())

        t = threading.Thread(target=restart)
        t.start()
        errors: list[BaseException] = []
        ok_after: list[float] = []
        i = 0
        while not (up_at and len(ok_after) >= 5):
            i += 1
            try:
                assert (await store.get_run("seed")) is not None
                await put(store, mk(f"r{i}"))
                await store.claim(f"r{i}", "w", T0 + 1, T0 + 31)
                if up_at:
                    ok_after.append(time.monotonic())
            except StoreUnavailableError as exc:
                errors.append(exc)
            except Exception as exc:  # a raw exception: the test fails with it
                raise AssertionError(f"untyped error during the restart: {exc!r}") from exc
            await asyncio.sleep(0)  # (let the watcher run)
            assert i < 100_000
        t.join()
        # the first success after the server came back, as a recovery time (target: 2 s)
        assert ok_after[0] - up_at[0] < 2.0
        print(f"restart: {i} rounds, {len(errors)} errors, back {ok_after[0] - up_at[0]:.3f} s")
        for exc in errors:
            assert _errors.is_database_error(exc.__cause__ or exc)
        # the watcher is back and delivers wake-ups again
        deadline = time.monotonic() + 10
        while hub.stats["connects"] <= connects or not hub.ready.is_set():
            assert time.monotonic() < deadline, hub.stats
            await asyncio.sleep(0.01)
        woke.clear()
        await put(store, mk("after"))
        await asyncio.wait_for(woke.wait(), 10)
    finally:
        unwatch()
        store.close()


async def test_a_missing_run_stays_run_not_found_through_a_reset(db_url: str) -> None:
    """A typed error of the store's own (not a database one) is not turned into another."""
    with NetProxy(socket_of(db_url)) as proxy:
        store = SqlStore(proxy.url_for(db_url))
        try:
            await store.get_run("x")
            proxy.reset()
            with pytest.raises(RunNotFoundError):
                await store.load_events("nope")
        finally:
            store.close()
