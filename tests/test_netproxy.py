"""The test proxy (``flowkit_testing._netproxy``) the chaos tests and benchmarks rely on:
it forwards, delays, stalls, resets and blackholes, each checked against a real PostgreSQL
server's unix socket."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from pg import socket_of

from flowkit_testing._netproxy import NetProxy


def _dsn(proxy: NetProxy) -> str:
    return f"host=127.0.0.1 port={proxy.port} user=postgres dbname=postgres connect_timeout=5"


def test_forwards_and_delays(pg_server: str) -> None:
    with NetProxy(socket_of(pg_server)) as proxy:
        with psycopg.connect(_dsn(proxy)) as conn:
            assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
            t0 = time.monotonic()
            for _ in range(5):
                conn.execute("SELECT 1").fetchone()
            direct = time.monotonic() - t0
            proxy.delay = 0.02
            t0 = time.monotonic()
            for _ in range(5):
                conn.execute("SELECT 1").fetchone()
            delayed = time.monotonic() - t0
        # 5 round trips with 20 ms each way: at least 200 ms more than without
        assert delayed >= direct + 0.19
        assert proxy.connections == 1


def test_stall_holds_and_resume_releases(pg_server: str) -> None:
    with NetProxy(socket_of(pg_server)) as proxy, psycopg.connect(_dsn(proxy)) as conn:
        proxy.stall()
        done = threading.Event()
        got: list[object] = []

        def query() -> None:
            got.append(conn.execute("SELECT 2").fetchone())
            done.set()

        t = threading.Thread(target=query, daemon=True)
        t.start()
        assert not done.wait(0.5)  # nothing comes back while stalled
        proxy.resume()
        assert done.wait(10)
        t.join(10)
        assert got == [(2,)]


def test_reset_breaks_open_connections(pg_server: str) -> None:
    with NetProxy(socket_of(pg_server)) as proxy, psycopg.connect(_dsn(proxy)) as conn:
        conn.execute("SELECT 1")
        assert proxy.reset() == 1
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        # new connections go through again
        with psycopg.connect(_dsn(proxy)) as again:
            assert again.execute("SELECT 3").fetchone() == (3,)


def test_blackhole_accepts_and_never_answers(pg_server: str) -> None:
    with NetProxy(socket_of(pg_server)) as proxy:
        proxy.blackhole = True
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(_dsn(proxy).replace("connect_timeout=5", "connect_timeout=1"))
        assert proxy.connections >= 1
