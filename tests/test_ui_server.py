"""``flowkit ui`` as a real process (docs/ui.md "Starting it"): the printed URL with its token,
``--port 0``, refusing a non-loopback host without a token, live ``change`` events after a write
from another process' store on the same SQLite file, and a prompt, clean exit on SIGTERM with a
browser's event stream still open."""

from __future__ import annotations

import asyncio
import http.client
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from cli_kit import ROOT, flowkit
from ui_kit import WORKFLOWS

from flowkit import Engine
from flowkit.stores import SqlStore

URL_LINE = re.compile(r"^flowkit ui: serving (http://127\.0\.0\.1:(\d+))/\?token=(\S+)$")


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A flowkit SQLite file with one run."""
    url = f"sqlite:///{tmp_path / 'ui.db'}"

    async def make() -> None:
        store = SqlStore(url)
        try:
            await Engine(store, WORKFLOWS, worker=False).start("echo", 1, "first")
        finally:
            store.close()

    asyncio.run(make())
    return url


@pytest.fixture
def server(db: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, str]]:
    """``flowkit ui --port 0`` on ``db`` without a token: the process, its base URL and the
    token it printed."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowkit.cli", "--db", db, "ui", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # (the readiness signal, flushed before serving)
        m = URL_LINE.match(line)
        assert m is not None, (line, proc.stderr.read() if proc.poll() is not None else "")
        assert int(m.group(2)) > 0 and len(m.group(3)) >= 20
        yield proc, m.group(1), m.group(3)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()


def _get_at_once(base: str, path: str = "/static/app.css") -> int:
    """One GET on a fresh connection, with no retry: the status (a refused connection
    raises). The server prints its URL only once it accepts connections."""
    parts = urlsplit(base)
    assert parts.hostname is not None and parts.port is not None
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def test_the_url_is_printed_once_it_accepts_connections(
    server: tuple[subprocess.Popen[str], str, str],
) -> None:
    _proc, base, _token = server
    # (right after the line, no retry: a connection refused fails the test)
    assert _get_at_once(base) == 200


async def test_a_token_file_keeps_the_token_off_the_command_line(db: str, tmp_path: Path) -> None:
    secret = "token-from-a-file-" + "x" * 20
    path = tmp_path / "ui-token"
    path.write_text(secret + "\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "flowkit.cli", "--db", db, "ui", "--port", "0", "--token-file", str(path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(30):
            line = (await proc.stdout.readline()).decode().strip()
        m = re.match(r"^flowkit ui: serving (http://127\.0\.0\.1:\d+)/$", line)
        assert m is not None, line  # (an operator's token is never printed)
        cmdline = await asyncio.to_thread(Path(f"/proc/{proc.pid}/cmdline").read_bytes)
        assert secret.encode() not in cmdline and str(path).encode() in cmdline
        async with httpx.AsyncClient(base_url=m.group(1)) as c:
            assert (await c.get("/runs?token=nope")).status_code == 401
            assert (await c.get(f"/runs?token={secret}")).status_code == 303
            assert (await c.get("/runs")).status_code == 200
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_a_bad_token_file_is_one_line(db: str, tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("  \n")
    for args, says in (
        (("--token-file", str(tmp_path / "missing")), "No such file"),
        (("--token-file", str(tmp_path / "empty")), "is empty"),
        (("--token-file", str(tmp_path / "empty"), "--token", "t"), "not both"),
    ):
        out = flowkit(tmp_path, "--db", db, "ui", "--port", "0", *args)
        assert out.returncode == 2, args
        assert len(out.stderr.strip().splitlines()) == 1 and says in out.stderr, out.stderr


async def test_live_change_after_another_process_writes_and_a_clean_sigterm(
    server: tuple[subprocess.Popen[str], str, str], db: str
) -> None:
    proc, base, token = server
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        r = await c.get(f"/runs?token={token}")
        assert r.status_code == 303 and r.headers["location"] == "/runs"
        page = await c.get("/runs")
        assert page.status_code == 200 and 'data-run-id="first"' in page.text
        assert page.headers["content-security-policy"] == "default-src 'self'"
        async with c.stream("GET", "/events") as events:
            assert events.status_code == 200
            assert events.headers["content-type"].startswith("text/event-stream")
            lines = events.aiter_lines()

            async def until_line(want: str) -> None:
                async with asyncio.timeout(30):
                    async for line in lines:
                        if line == want:
                            return
                raise AssertionError(f"the stream ended before {want!r}")

            await until_line(": connected")
            other = SqlStore(db)  # (another store object on the file: another process' view)
            try:
                await Engine(other, WORKFLOWS, worker=False).start("echo", 2, "second")
            finally:
                other.close()
            await until_line("event: change")
            assert 'data-run-id="second"' in (await c.get("/runs")).text
            # SIGTERM with this stream still open: the server ends it and exits 0
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                async for _ in lines:
                    pass
    rc = await asyncio.to_thread(proc.wait, 30)
    assert rc == 0, proc.stderr.read() if proc.stderr else ""


def test_a_host_other_than_loopback_needs_a_token(db: str, tmp_path: Path) -> None:
    out = flowkit(tmp_path, "--db", db, "ui", "--host", "0.0.0.0", "--port", "0")
    assert out.returncode == 2
    assert out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith("flowkit: error: --host 0.0.0.0") and "--token" in out.stderr


def test_bad_options_are_one_line(db: str, tmp_path: Path) -> None:
    for args in (("--port", "70000"), ("--token", " "), ("--host", "256.1.1.1", "--token", "t")):
        out = flowkit(tmp_path, "--db", db, "ui", *args)
        assert out.returncode == 2, args
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


async def test_a_given_token_elsewhere_and_sigint(db: str, tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "FLOWKIT_UI_TOKEN": "from-env"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "flowkit.cli",
        "--db",
        db,
        "ui",
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--read-only",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=env,
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(30):
            line = (await proc.stdout.readline()).decode().strip()
        # (an operator's token is never printed: stdout goes to logs)
        m = re.match(r"^flowkit ui: serving http://0\.0\.0\.0:(\d+)/$", line)
        assert m is not None, line
        base = f"http://127.0.0.1:{m.group(1)}"
        async with httpx.AsyncClient(base_url=base) as c:
            assert (await c.get("/runs?token=nope")).status_code == 401
            assert (await c.get("/runs?token=from-env")).status_code == 303
            page = await c.get("/runs/first")
            assert 'data-read-only="true"' in page.text and 'id="actions"' not in page.text
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_without_the_extra_it_says_so(tmp_path: Path, db: str) -> None:
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nsys.modules['uvicorn'] = None\n"  # (an import of uvicorn fails)
    )
    out = subprocess.run(
        [sys.executable, "-m", "flowkit.cli", "--db", db, "ui"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
    )
    assert out.returncode == 2
    assert "pip install 'flowkit[ui]'" in out.stderr and len(out.stderr.splitlines()) == 1
