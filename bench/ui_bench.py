"""The dashboard's time to first byte (``flowkit ui``, docs/ui.md) with 100,000 runs, on a
SQLite file and a throwaway PostgreSQL: a real ``flowkit ui`` process per database, real HTTP
requests on loopback (``http.client``), the time from sending a request to its status line.

Pages: the runs page (``/runs``: 50 newest rows and the counts per status), the runs page
filtered by workflow and status, a run's page (its history and lane), the lanes page, and a
static file (``/static/app.css``: the server's own floor). The same-run baseline is the same
pages served from an EMPTY database of the same kind (ratio full / empty: what 100,000 runs
cost). Figures in ms, median of ``REPEAT`` requests after a warm-up. Run
``python bench/ui_bench.py [--smoke]`` (also part of ``bench/run.py``); smoke: 2,000 runs,
SQLite only."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from _seed import WORKFLOWS, seed_runs  # noqa: E402

REPEAT = 15
TOKEN = "bench-token"


@contextlib.contextmanager
def served(url: str) -> Iterator[tuple[str, int]]:
    """``flowkit ui`` on ``url`` in a process of its own; yields its host and port."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowkit.cli", "--db", url, "ui", "--port", "0", "--token", TOKEN],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "http://" not in line:
            raise RuntimeError(f"flowkit ui did not print its URL: {line!r}")
        parts = urlsplit(line[line.index("http://") :].split()[0])
        assert parts.hostname is not None and parts.port is not None
        host, port = parts.hostname, parts.port
        end = time.monotonic() + 30
        while True:
            try:
                _get(host, port, "/static/app.css", "")
                break
            except OSError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)
        yield host, port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _get(host: str, port: int, path: str, cookie: str) -> tuple[float, int, str]:
    """One GET on a new connection: (seconds to the status line, status, Set-Cookie)."""
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.connect()
        t = time.perf_counter()
        conn.request("GET", path, headers={"Cookie": cookie} if cookie else {})
        resp = conn.getresponse()
        ttfb = time.perf_counter() - t
        resp.read()
        return ttfb, resp.status, resp.getheader("Set-Cookie") or ""
    finally:
        conn.close()


def _login(host: str, port: int) -> str:
    _t, status, set_cookie = _get(host, port, f"/runs?token={TOKEN}", "")
    assert status in (302, 303, 307), status
    return set_cookie.split(";")[0]


def _ms(host: str, port: int, path: str, cookie: str) -> float:
    _get(host, port, path, cookie)
    times = []
    for _ in range(REPEAT):
        t, status, _c = _get(host, port, path, cookie)
        assert status == 200, (path, status)
        times.append(t * 1000)
    return round(statistics.median(times), 2)


def _pages(url: str) -> dict[str, str]:
    """The paths to time on ``url``'s data: a run with a lane when there is one."""
    from flowkit._client import browse as _browse
    from flowkit.stores import SqlStore

    async def pick() -> dict[str, str]:
        store = SqlStore(url)
        try:
            pages = {
                "runs": "/runs",
                "runs_filtered": f"/runs?workflow={WORKFLOWS[1]}&status=completed",
                "lanes": "/lanes",
                "static": "/static/app.css",
            }
            lanes = await _browse.lanes(store, limit=1)
            if lanes:
                lane = await _browse.lane(store, lanes[0].workflow, lanes[0].key, limit=1)
                member = (lane.waiters or lane.holders)[0]
                pages["run_in_lane"] = f"/runs/{member.id}"
            else:
                newest = await _browse.page_runs(store, limit=1)
                if newest:
                    pages["run_in_lane"] = f"/runs/{newest[0].id}"
            return pages
        finally:
            store.close()

    return asyncio.run(pick())


def measure(url: str, empty_url: str, n: int) -> dict[str, Any]:
    t = time.perf_counter()
    seed_runs(url, n)
    out: dict[str, Any] = {"runs": n, "seed_s": round(time.perf_counter() - t, 1)}
    pages = _pages(url)
    seed_runs(empty_url, 0)  # (the schema only)
    for label, u in (("full", url), ("empty", empty_url)):
        with served(u) as (host, port):
            cookie = _login(host, port)
            for name, path in pages.items():
                if label == "empty" and name == "run_in_lane":
                    continue  # (no such run there)
                out[f"{name}_{label}_ms"] = _ms(host, port, path, cookie)
    for name in pages:
        empty = out.get(f"{name}_empty_ms")
        if empty:
            out[f"{name}_ratio_full_vs_empty"] = round(out[f"{name}_full_ms"] / empty, 2)
    return out


async def main(smoke: bool, pg_url: str | None, tmp: Path) -> dict[str, Any]:
    n = 2_000 if smoke else 100_000
    results: dict[str, Any] = {}
    # (blocking HTTP and subprocesses: in a thread, off the caller's event loop)
    results["sqlite"] = await asyncio.to_thread(
        measure, f"sqlite:///{tmp / 'ui-full.db'}", f"sqlite:///{tmp / 'ui-empty.db'}", n
    )
    if pg_url is not None and not smoke:
        from tests.pg import fresh_database

        results["postgres"] = await asyncio.to_thread(
            measure,
            fresh_database(pg_url, prefix="flowkit_ui_full"),
            fresh_database(pg_url, prefix="flowkit_ui_empty"),
            n,
        )
    print(json.dumps({"ui_ttfb": results}, indent=1))
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--postgres", action="store_true", help="also on a throwaway PostgreSQL")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="flowkit-ui-bench-") as tmp:
        if args.postgres:
            from store_bench import postgres_server

            with postgres_server() as pg:
                asyncio.run(main(args.smoke, pg, Path(tmp)))
        else:
            asyncio.run(main(args.smoke, None, Path(tmp)))
