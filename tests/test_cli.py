"""The ``flowkit`` command against a real SQLite file, run as a user would (subprocess)."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from cli_kit import flowkit

from flowkit import Engine, History, Run, RunCancelledError, SystemClock
from flowkit.cli import main
from flowkit.stores import SqlStore

WF_SOURCE = textwrap.dedent(
    """
    from flowkit import Singleton, WorkflowCtx, workflow

    def double(x: int) -> int:
        return 2 * x

    def triple(x: int) -> int:
        return 3 * x

    @workflow(name="cli-demo")
    class CliDemo:
        async def run(self, ctx: WorkflowCtx, input: int) -> int:
            return await ctx.step(double, input)

    @workflow(name="cli-demo")
    class CliDemoChanged:
        async def run(self, ctx: WorkflowCtx, input: int) -> int:
            return await ctx.step(triple, input)

    @workflow(name="cli-approval")
    class Approval:
        async def run(self, ctx: WorkflowCtx, input: str) -> str:
            decision = await ctx.wait_for_signal("approve")
            return f"{input}: {decision['by']}"

    @workflow(name="cli-lane", singleton=Singleton(key=lambda inp: f"lane:{inp}"))
    class Lane:
        async def run(self, ctx: WorkflowCtx, input: str) -> str:
            return await ctx.wait_for_signal("go")

    @workflow(name="cli-unresolved")
    class Unresolved:
        async def run(self, ctx: WorkflowCtx, input: "NoSuchModel") -> str:  # noqa: F821
            return "never"
    """
)


@pytest.fixture
async def db(tmp_path: Path) -> str:
    (tmp_path / "cliwf.py").write_text(WF_SOURCE)
    sys.path.insert(0, str(tmp_path))
    try:
        import cliwf

        url = f"sqlite:///{tmp_path / 'flowkit.db'}"
        async with Engine(SqlStore(url), [cliwf.CliDemo()], clock=SystemClock()) as engine:
            await engine.start("cli-demo", 21, "run-1")
            assert await engine.result("run-1", timeout=10) == 42
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("cliwf", None)
    return url


async def test_runs_show_and_history(db: str, tmp_path: Path) -> None:
    out = flowkit(tmp_path, "--db", db, "runs")
    assert out.returncode == 0, out.stderr
    assert "run-1" in out.stdout and "completed" in out.stdout
    out = flowkit(tmp_path, "--db", db, "show", "run-1")
    assert out.returncode == 0 and "output  42" in out.stdout
    out = flowkit(tmp_path, "--db", db, "history", "run-1")
    assert out.returncode == 0
    assert "run_started" in out.stdout and "run_completed" in out.stdout
    out = flowkit(tmp_path, "--db", db, "history", "run-1", "--json")
    hist = History.from_json(out.stdout)
    assert hist.types == ["run_started", "step_completed", "run_completed"]
    assert json.loads(out.stdout)["run_id"] == "run-1"


async def test_replay_exit_codes(db: str, tmp_path: Path) -> None:
    out = flowkit(tmp_path, "--db", db, "history", "run-1", "--json")
    (tmp_path / "h.json").write_text(out.stdout)
    ok = flowkit(tmp_path, "replay", "h.json", "--workflow", "cliwf:CliDemo")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = flowkit(tmp_path, "replay", "h.json", "--workflow", "cliwf:CliDemoChanged")
    assert bad.returncode == 1
    assert "double" in bad.stdout and "triple" in bad.stdout


async def test_errors_are_one_line(db: str, tmp_path: Path) -> None:
    for args in (
        ("--db", db, "show", "nope"),
        ("--db", f"sqlite:///{tmp_path / 'missing.db'}", "runs"),
        ("replay", "missing.json", "--workflow", "cliwf:CliDemo"),
        ("replay", "cliwf.py", "--workflow", "cliwf:CliDemo"),
        ("replay", "h.json", "--workflow", "nomodule:X"),
    ):
        (tmp_path / "h.json").write_text("{}")
        out = flowkit(tmp_path, *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stderr.startswith("flowkit: error:")


# -- cancel, signal, singleton slots ----------------------------------------------------------


@pytest.fixture
def cliwf(tmp_path: Path) -> Iterator[ModuleType]:
    """The workflow module, importable here (for the test's engine) and in the subprocess."""
    (tmp_path / "cliwf.py").write_text(WF_SOURCE)
    sys.path.insert(0, str(tmp_path))
    try:
        import cliwf

        yield cliwf
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("cliwf", None)


async def wait_for(engine: Engine, run_id: str, ok: Callable[[Run], bool]) -> Run:
    for _ in range(500):
        run = await engine.get_run(run_id)
        if ok(run):
            return run
        await asyncio.sleep(0.02)
    raise AssertionError(f"{run_id} never got there: {run}")


@pytest.fixture
def flowkit_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``flowkit`` in this process (sync tests only): the same ``main`` as the subprocess runs,
    without paying the interpreter start for every case of an error matrix."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLOWKIT_DEBUG", raising=False)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        code = main(list(args))
        cap = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, cap.out, cap.err)

    return run


def one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith("flowkit: error:")
    return out.stderr


async def test_signal_via_cli_resumes_the_run(cliwf: ModuleType, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flowkit.db'}"
    async with Engine(SqlStore(url), [cliwf.Approval()], poll_interval=0.05) as engine:
        await engine.start("cli-approval", "order-7", "ap-1")
        await wait_for(engine, "ap-1", lambda r: "approve" in r.waiting_signals)
        shown = flowkit(tmp_path, "--db", url, "show", "ap-1")
        assert "waits for signal approve" in shown.stdout, shown.stdout

        out = flowkit(tmp_path, "--db", url, "signal", "ap-1", "approve", '{"by": "ann"}')
        assert out.returncode == 0, out.stderr
        assert "delivered signal 'approve' to ap-1 (it was waiting for it)" in out.stdout
        assert await engine.result("ap-1", timeout=10) == "order-7: ann"
        hist = await engine.history("ap-1")
        assert "signal_received" in hist.types

    timeline = flowkit(tmp_path, "--db", url, "history", "ap-1")
    assert 'approve payload {"by":"ann"}' in timeline.stdout, timeline.stdout
    late = flowkit(tmp_path, "--db", url, "signal", "ap-1", "approve", '{"by": "bob"}')
    assert "is completed" in one_line_error(late)


async def test_cancel_via_cli_cancels_the_run(cliwf: ModuleType, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flowkit.db'}"
    async with Engine(SqlStore(url), [cliwf.Approval()], poll_interval=0.05) as engine:
        await engine.start("cli-approval", "order-8", "ap-2")
        await wait_for(engine, "ap-2", lambda r: "approve" in r.waiting_signals)

        out = flowkit(tmp_path, "--db", url, "cancel", "ap-2")
        assert out.returncode == 0, out.stderr
        assert "cancellation requested: ap-2 is cancelling" in out.stdout
        with pytest.raises(RunCancelledError):
            await engine.result("ap-2", timeout=10)
        assert (await engine.history("ap-2")).types[-2:] == ["cancel_requested", "run_cancelled"]

    shown = flowkit(tmp_path, "--db", url, "show", "ap-2")
    assert "[cancelled]" in shown.stdout
    again = flowkit(tmp_path, "--db", url, "cancel", "ap-2")
    assert again.returncode == 0
    assert "run 'ap-2' is already cancelled: nothing to cancel" in again.stdout
    assert "unknown run 'nope'" in one_line_error(flowkit(tmp_path, "--db", url, "cancel", "nope"))


def row(stdout: str, run_id: str) -> str:
    [line] = [ln for ln in stdout.splitlines() if ln.startswith(run_id + " ")]
    return line


async def test_runs_shows_who_holds_and_who_waits(cliwf: ModuleType, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flowkit.db'}"
    async with Engine(SqlStore(url), [cliwf.Lane()], poll_interval=0.05) as engine:
        for run_id in ("l-1", "l-2", "l-3"):
            await engine.start("cli-lane", "x", run_id)
        await wait_for(engine, "l-1", lambda r: r.admitted and "go" in r.waiting_signals)
        for run_id in ("l-2", "l-3"):
            for _ in range(500):
                if "singleton_gated" in (await engine.history(run_id)).types:
                    break
                await asyncio.sleep(0.02)

        out = flowkit(tmp_path, "--db", url, "runs")
        assert out.returncode == 0, out.stderr
        assert "lane:x" in row(out.stdout, "l-1") and "holds" in row(out.stdout, "l-1")
        assert "waits behind l-1 (#1 in queue)" in row(out.stdout, "l-2")
        assert "waits behind l-1 (#2 in queue)" in row(out.stdout, "l-3")
        assert out.stdout.splitlines()[0].split() == [
            "id", "workflow", "status", "singleton", "slot", "created", "(UTC)", "updated", "(UTC)",
            "lease",
        ]  # fmt: skip
        assert "\x1b[" not in out.stdout and "│" not in out.stdout  # plain when piped

        newest = flowkit(tmp_path, "--db", url, "runs", "--limit", "2")
        assert [ln.split()[0] for ln in newest.stdout.splitlines()[1:]] == ["l-2", "l-3"]
        shown = flowkit(tmp_path, "--db", url, "show", "l-3")
        assert "singleton lane:x: waits behind l-1 (#2 in queue)" in shown.stdout

        # cancelling the holder hands its slot to the next in line
        out = flowkit(tmp_path, "--db", url, "cancel", "l-1")
        assert out.returncode == 0, out.stderr
        await wait_for(engine, "l-2", lambda r: r.admitted)
        out = flowkit(tmp_path, "--db", url, "runs", "--workflow", "cli-lane")
        assert "cancelled" in row(out.stdout, "l-1") and "holds" not in row(out.stdout, "l-1")
        assert "holds" in row(out.stdout, "l-2")
        assert "waits behind l-2 (#1 in queue)" in row(out.stdout, "l-3")

        # a waiter that never got a slot is cancelled at once
        out = flowkit(tmp_path, "--db", url, "cancel", "l-3")
        assert out.stdout.strip() == "cancelled l-3"
        await engine.signal("l-2", "go", "done")
        assert await engine.result("l-2", timeout=10) == "done"


def test_foreign_and_unreachable_databases(
    tmp_path: Path, flowkit_here: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    (tmp_path / "empty.db").write_bytes(b"")
    (tmp_path / "text.db").write_text("hello, not a database\n" * 100)
    con = sqlite3.connect(tmp_path / "other.db")
    con.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    con.commit()
    con.close()
    cases = {
        "sqlite:///empty.db": "empty.db is not a flowkit database: it is empty",
        "sqlite:///text.db": "text.db is not a flowkit database: file is not a database",
        "sqlite:///other.db": "other.db is not a flowkit database: it has other tables (invoices)",
        "sqlite:///:memory:": "is an in-memory database",
        f"sqlite:///{tmp_path}": "is not a flowkit database: not a file",
        "mysql://u@localhost/db": "SqlStore supports sqlite:///path and postgresql",
        "no url": "not a database URL",
        "postgresql+psycopg://u@127.0.0.1:1/flowkit": "cannot connect to the flowkit database",
    }
    for url, expected in cases.items():
        err = one_line_error(flowkit_here("--db", url, "runs"))
        assert expected in err, (url, err)
    for cmd in (("show", "r"), ("history", "r"), ("cancel", "r"), ("signal", "r", "go", "1")):
        err = one_line_error(flowkit_here("--db", "sqlite:///other.db", *cmd))
        assert "other.db is not a flowkit database" in err, (cmd, err)
    for url in ("sqlite:///other.db", "postgresql+psycopg://u@127.0.0.1:1/flowkit"):
        err = one_line_error(flowkit(tmp_path, "--db", url, "runs"))  # a real process too
        assert "flowkit database" in err
    # nothing was written into somebody else's database
    con = sqlite3.connect(tmp_path / "other.db")
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    con.close()
    assert tables == ["invoices"]
    assert (tmp_path / "empty.db").stat().st_size == 0


def test_bad_json_payloads(
    tmp_path: Path, flowkit_here: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    # bad JSON is reported before the database is even opened: none exists here
    for payload, expected in (
        ("{bad", "signal payload is not valid JSON: Expecting property name"),
        ("yes", "(a string needs JSON quotes: '\"text\"')"),
        ("[1, 2", "signal payload is not valid JSON"),
    ):
        err = one_line_error(flowkit_here("signal", "run-1", "go", payload))
        assert expected in err, err
    err = one_line_error(flowkit(tmp_path, "signal", "run-1", "go", "{"))
    assert "signal payload is not valid JSON" in err
    assert not (tmp_path / "flowkit.db").exists()
    err = one_line_error(flowkit_here("runs", "--limit", "-1"))
    assert "--limit takes a count >= 0" in err


async def test_other_errors(db: str, tmp_path: Path) -> None:
    for args, expected in (
        (("signal", "nope", "go"), "unknown run 'nope'"),
        (("history", "nope"), "unknown run 'nope'"),
        (("replay", "h.json", "--workflow", "cliwf:Nothing"), "has no attribute 'Nothing'"),
        (("replay", "h.json", "--workflow", "cliwf:double"), "is not a @workflow"),
        (("replay", "h.json", "--workflow", "cliwf:Unresolved"), "NoSuchModel"),
        (("replay", "h.json", "--workflow", "cliwf"), "takes module:Class"),
    ):
        (tmp_path / "h.json").write_text("{}")
        err = one_line_error(flowkit(tmp_path, "--db", db, *args))
        assert expected in err, (args, err)


async def test_plain_timeline_and_replay_of_a_directory(db: str, tmp_path: Path) -> None:
    out = flowkit(tmp_path, "--db", db, "history", "run-1")
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["seq", "at", "pos", "event", "detail"]
    assert lines[1].split()[:4] == ["1", "+0.000s", "-", "run_started"]  # "-": no pos
    assert "cli-demo v" in lines[1] and "input 21" in lines[1]
    assert lines[2].split()[2:5] == ["1", "step_completed", "double"]
    assert lines[2].endswith("attempt 1 -> 42")
    assert lines[3].split()[2:] == ["-", "run_completed", "output", "42"]
    assert "\x1b[" not in out.stdout

    golden = tmp_path / "golden"
    golden.mkdir()
    raw = flowkit(tmp_path, "--db", db, "history", "run-1", "--json").stdout
    (golden / "run-1.json").write_text(raw)
    (golden / "run-1-copy.json").write_text(raw)
    ok = flowkit(tmp_path, "replay", "golden", "--workflow", "cliwf:CliDemo")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.splitlines()[-1].endswith("2 ok, 0 diverged, 0 errors")
    bad = flowkit(tmp_path, "replay", "golden", "--workflow", "cliwf:CliDemoChanged")
    assert bad.returncode == 1
    assert bad.stdout.count("diverged  run-1") == 2 and "triple" in bad.stdout
    (tmp_path / "nothing").mkdir()
    err = one_line_error(flowkit(tmp_path, "replay", "nothing", "--workflow", "cliwf:CliDemo"))
    assert "no *.json histories in nothing" in err


async def test_an_encrypted_store_is_read_and_signalled_with_its_codec_keys(
    cliwf: ModuleType, tmp_path: Path
) -> None:
    """A store written through ``CodecStore(AESGCMCodec(keys))``: with ``--codec-keys`` the CLI
    prints its payloads in clear and encrypts the signals it sends; without, it shows the
    envelopes; a key file without the right key, or a broken one, is a one-line error."""
    import base64

    from flowkit.stores import AESGCMCodec, CodecStore

    old, new = os.urandom(32), os.urandom(32)
    keys = tmp_path / "keys.json"
    b64 = {"old": base64.b64encode(old).decode(), "new": base64.b64encode(new).decode()}
    keys.write_text(json.dumps(b64))
    url = f"sqlite:///{tmp_path / 'flowkit.db'}"
    store = CodecStore(SqlStore(url), AESGCMCodec([("old", old), ("new", new)]))
    async with Engine(store, [cliwf.CliDemo(), cliwf.Approval()], poll_interval=0.05) as engine:
        await engine.start("cli-demo", 21, "enc-1")
        assert await engine.result("enc-1", timeout=10) == 42
        await engine.start("cli-approval", "order-9", "enc-2")
        await wait_for(engine, "enc-2", lambda r: "approve" in r.waiting_signals)

        # without the keys: refused (the database is marked encrypted), nothing written
        plain = flowkit(tmp_path, "--db", url, "signal", "enc-2", "approve", '{"by": "eve"}')
        assert plain.returncode == 2
        err = one_line_error(plain)
        assert "encrypted (aesgcm kid=new)" in err and "--codec-keys" in err
        assert await store.peek_signal("enc-2", "approve") is None
        sent = flowkit(
            tmp_path, "--db", url, "--codec-keys", str(keys), "signal", "enc-2", "approve",
            '{"by": "cy"}',
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        assert await engine.result("enc-2", timeout=10) == "order-9: cy"

    raw = (tmp_path / "flowkit.db").read_bytes()
    assert b'"cy"' not in raw and b"order-9" not in raw  # encrypted at rest, the signal too

    clear = flowkit(tmp_path, "--db", url, "--codec-keys", str(keys), "show", "enc-1")
    assert clear.returncode == 0 and "output  42" in clear.stdout, clear.stderr
    hist = flowkit(tmp_path, "--db", url, "--codec-keys", str(keys), "history", "enc-1", "--json")
    assert History.from_json(hist.stdout)[1].result == 42  # type: ignore[attr-defined]
    sealed = flowkit(tmp_path, "--db", url, "show", "enc-1")
    assert sealed.returncode == 0 and "input   <encrypted aesgcm kid=new>" in sealed.stdout
    assert "output  <encrypted aesgcm kid=new>" in sealed.stdout
    assert "payloads encrypted (aesgcm kid=new): pass --codec-keys" in sealed.stdout
    assert "output  42" not in sealed.stdout and "payloads encrypted" not in clear.stdout
    timeline = flowkit(tmp_path, "--db", url, "history", "enc-1")
    assert timeline.returncode == 0 and "(args <encrypted aesgcm kid=new>)" in timeline.stdout
    assert "-> <encrypted aesgcm kid=new>" in timeline.stdout

    only_old = tmp_path / "old.json"
    only_old.write_text(json.dumps({"old": b64["old"]}))
    wrong = flowkit(tmp_path, "--db", url, "--codec-keys", str(only_old), "show", "enc-1")
    assert "new" in one_line_error(wrong)  # the key id it lacks
    (tmp_path / "bad.json").write_text('{"k": "not base64!"}')
    bad = flowkit(tmp_path, "--db", url, "--codec-keys", str(tmp_path / "bad.json"), "runs")
    assert "not base64" in one_line_error(bad)
