"""``flowkit retry`` (``Engine.retry`` from the command line: ``--input`` validated by the
schema the run's workers recorded, or by ``--app``'s code; every error one line, exit 2,
nothing written) and the checks ``flowkit worker`` makes of its options and app before it
opens a store (docs/deploying.md). The worker's drain:
tests/test_worker_drain.py."""

from __future__ import annotations

import asyncio
import json
import logging
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa
from cli_kit import flowkit

from flowkit import Engine, WorkflowCtx, WorkflowFailedError, workflow
from flowkit.cli import main
from flowkit.logging import JsonFormatter
from flowkit.stores import SqlStore

APP = """
from flowkit import WorkflowCtx, workflow

@workflow(name="double")
class Double:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        if n < 0:
            raise ValueError("negative")
        return 2 * n

WORKFLOWS = [Double]
NOT_WORKFLOWS = [print]

def make():
    return [Double]
"""


@workflow(name="double")
class Double:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        if n < 0:
            raise ValueError("negative")
        return 2 * n


@pytest.fixture
def failed(tmp_path: Path) -> tuple[Path, str, str]:
    """A SQLite file with a failed run of ``double`` (input -1), and ``retry_app.py``."""
    (tmp_path / "retry_app.py").write_text(textwrap.dedent(APP))
    url = f"sqlite:///{tmp_path / 'f.db'}"

    async def fail() -> str:
        store = SqlStore(url)
        try:
            async with Engine(store, [Double], poll_interval=0.05) as engine:
                run = await engine.start(Double, -1)
                with pytest.raises(WorkflowFailedError):
                    await engine.result(run.id, timeout=30)
                return run.id
        finally:
            store.close()

    return tmp_path, url, asyncio.run(fail())


def _status(url: str, run_id: str) -> tuple[str, int]:
    async def read() -> tuple[str, int]:
        store = SqlStore(url)
        try:
            run = await store.get_run(run_id)
            assert run is not None
            return str(run.status), run.attempt
        finally:
            store.close()

    return asyncio.run(read())


def test_retry_with_a_new_input(failed: tuple[Path, str, str]) -> None:
    """Without ``--app`` the input is validated against the schema the run's worker recorded
    (docs/cli.md, "flowkit retry"); with it, by the workflow's code."""
    tmp, url, run_id = failed
    bad = flowkit(tmp, "--db", url, "retry", run_id, "--input", '"x"')
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == (
        "flowkit: error: invalid input for workflow 'double': input: 'x' is not of type 'integer'\n"
    )
    wrong = flowkit(
        tmp, "--db", url, "retry", run_id, "--input", '"x"', "--app", "retry_app:WORKFLOWS"
    )
    assert wrong.returncode == 2 and len(wrong.stderr.splitlines()) == 1, wrong.stderr
    assert wrong.stderr.startswith("flowkit: error: ") and "double" in wrong.stderr
    not_json = flowkit(tmp, "--db", url, "retry", run_id, "--input", "x")
    assert not_json.returncode == 2 and "--input is not valid JSON" in not_json.stderr
    assert _status(url, run_id) == ("failed", 1)  # nothing written
    assert _history(url, run_id) == ["run_started", "run_failed"]
    ok = flowkit(tmp, "--db", url, "retry", run_id, "--input", "5")
    assert ok.returncode == 0, ok.stderr
    assert (
        ok.stdout == f"retried {run_id} with a new input: pending (attempt 2); "
        "a worker running double v1 picks it up\n"
    )

    async def finish() -> int:
        store = SqlStore(url)
        try:
            async with Engine(store, [Double], poll_interval=0.05) as engine:
                out: int = await engine.result(run_id, timeout=30)
                return out
        finally:
            store.close()

    assert asyncio.run(finish()) == 10
    again = flowkit(tmp, "--db", url, "retry", run_id)
    assert again.returncode == 2
    assert again.stderr.startswith("flowkit: error: ") and "completed" in again.stderr
    assert len(again.stderr.splitlines()) == 1


def _history(url: str, run_id: str) -> list[str]:
    async def read() -> list[str]:
        store = SqlStore(url)
        try:
            return [e.type for e in await store.load_events(run_id)]
        finally:
            store.close()

    return asyncio.run(read())


def test_retry_input_without_recorded_schemas_needs_the_app(
    failed: tuple[Path, str, str],
) -> None:
    """A database no worker of this flowkit recorded the version's schemas in: nothing to
    validate ``--input`` by without ``--app``, so the workflow is reported unknown."""
    tmp, url, run_id = failed
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM flowkit_workflow_schemas"))
    engine.dispose()
    bad = flowkit(tmp, "--db", url, "retry", run_id, "--input", "5")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "flowkit: error: unknown workflow 'double' version '1'\n"
    assert _status(url, run_id) == ("failed", 1)
    ok = flowkit(tmp, "--db", url, "retry", run_id, "--input", "5", "--app", "retry_app:make")
    assert ok.returncode == 0, ok.stderr


def test_retry_without_an_app(failed: tuple[Path, str, str]) -> None:
    tmp, url, run_id = failed
    ok = flowkit(tmp, "--db", url, "retry", run_id)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"retried {run_id}: pending (attempt 2)")
    assert _status(url, run_id) == ("pending", 2)
    missing = flowkit(tmp, "--db", url, "retry", "nope")
    assert missing.returncode == 2 and "nope" in missing.stderr


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["retry_app"], {}, "expected MODULE:ATTR, got 'retry_app'"),
        (["retry_app:nothing"], {}, "'retry_app' has no attribute 'nothing'"),
        (["no_such_mod:X"], {}, "cannot import 'no_such_mod'"),
        (["retry_app:NOT_WORKFLOWS"], {}, "which is not a @workflow class or instance"),
        (["retry_app:WORKFLOWS", "--concurrency", "0"], {}, "--concurrency takes a count >= 1"),
        (["retry_app:WORKFLOWS", "--grace", "-1"], {}, "--grace takes seconds >= 0"),
        (
            ["retry_app:WORKFLOWS"],
            {"FLOWKIT_CONCURRENCY": "many"},
            "$FLOWKIT_CONCURRENCY must be a number",
        ),
        (
            ["retry_app:WORKFLOWS"],
            {"FLOWKIT_LOG_FORMAT": "xml"},
            "$FLOWKIT_LOG_FORMAT must be text or json",
        ),
    ],
)
def test_worker_checks_its_options_before_serving(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    env: dict[str, str],
    says: str,
) -> None:
    (tmp_path / "retry_app.py").write_text(textwrap.dedent(APP))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    db = tmp_path / "never.db"
    assert main(["worker", *args, "--db", f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flowkit: error: ") and says in err and len(err.splitlines()) == 1
    assert not db.exists()  # (checked before any store opens)


def test_json_log_lines() -> None:
    rec = logging.LogRecord("flowkit.worker", logging.INFO, __file__, 1, "hello %s", ("x",), None)
    rec.run_id = "r1"
    data = json.loads(JsonFormatter().format(rec))
    assert data["message"] == "hello x" and data["level"] == "INFO" and data["run_id"] == "r1"
    assert data["logger"] == "flowkit.worker" and data["time"].endswith("+00:00")
