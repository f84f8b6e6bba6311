"""``flowkit worker`` stopped while it starts (docs/deploying.md): it catches SIGTERM/SIGINT
first thing, before it imports the app or opens the store, so a SIGTERM in its first second
(a deploy that changes its mind, a scaler) stops it cleanly with exit 0. It used to be killed
by the signal (exit 143) until ``Engine.serve`` installed its handlers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flowkit._core import boot as _boot

ROOT = Path(__file__).resolve().parent.parent
BOUND = 60.0

APP = """
import os, pathlib, signal, time
from flowkit import WorkflowCtx, workflow

here = pathlib.Path(__file__).parent
# (what the worker's SIGTERM handler is while it imports the app, then wait for the test)
(here / "importing").write_text(repr(signal.getsignal(signal.SIGTERM)))
while os.environ.get("EARLY_GATE") and not (here / "go").exists():
    time.sleep(0.01)

@workflow(name="noop")
class Noop:
    async def run(self, ctx: WorkflowCtx, input: None) -> None:
        return None

WORKFLOWS = [Noop]
"""


def _spawn(tmp: Path, gate: bool) -> subprocess.Popen[bytes]:
    (tmp / "early_app.py").write_text(APP)
    env = {**os.environ, "PYTHONPATH": f"{tmp}{os.pathsep}{ROOT}"}
    env.pop("EARLY_GATE", None)
    if gate:
        env["EARLY_GATE"] = "1"
    db = f"sqlite:///{tmp / 'w.db'}"
    with (tmp / "worker.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "flowkit.cli", "worker", "early_app:WORKFLOWS", "--db", db],
            env=env,
            cwd=tmp,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _until(cond: object, what: str, proc: subprocess.Popen[bytes]) -> None:
    """Poll ``cond()`` until it holds (the process is the one that makes it true)."""
    end = time.monotonic() + BOUND
    while not cond():  # type: ignore[operator]
        assert proc.poll() is None, f"the worker exited ({proc.returncode}) before {what}"
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.002)


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (``SigCgt`` of /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def test_a_sigterm_while_the_app_is_imported_stops_the_worker_cleanly(tmp_path: Path) -> None:
    proc = _spawn(tmp_path, gate=True)
    try:
        _until(lambda: (tmp_path / "importing").exists(), "the app's import", proc)
        assert "SIG_DFL" not in (tmp_path / "importing").read_text()  # caught already
        proc.send_signal(signal.SIGTERM)
        (tmp_path / "go").touch()
        code = proc.wait(BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (tmp_path / "worker.log").read_text()
    assert code == 0, log
    assert "SIGTERM while starting: stopping before serving" in log


def test_a_sigterm_at_the_first_moment_it_is_caught_exits_0(tmp_path: Path) -> None:
    """The earliest a signal can be caught at all: as soon as the process has a SIGTERM
    handler (the kernel's ``SigCgt``), it stops cleanly. ``import flowkit`` installs it
    first thing (``flowkit._core.boot``), so before that only the interpreter has started; and it
    is still starting (it used to catch SIGTERM only once it served)."""
    proc = _spawn(tmp_path, gate=False)
    try:
        _until(lambda: _catches_sigterm(proc.pid), "a SIGTERM handler", proc)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (tmp_path / "worker.log").read_text()
    assert code == 0, log
    assert "SIGTERM while starting: stopping before serving" in log


@pytest.mark.parametrize(
    ("argv", "worker"),
    [
        (["python", "-m", "flowkit.cli", "worker", "app:WF"], True),
        (["python", "-X", "importtime", "-m", "flowkit.cli", "--db", "x", "worker", "a:b"], True),
        (["/venv/bin/python", "/venv/bin/flowkit", "worker", "app:WF"], True),
        (["/venv/bin/python", "/venv/bin/flowkit", "runs"], False),
        (["python", "-m", "flowkit.cli", "show", "r1"], False),
        (["python", "-m", "myapp", "worker"], False),
        (["python", "myapp.py", "worker"], False),
        (["python", "-c", "import flowkit", "worker"], False),
        (["python"], False),
    ],
)
def test_only_a_flowkit_worker_process_catches_the_signals_at_import(
    argv: list[str], worker: bool
) -> None:
    assert _boot.worker_command(argv) is worker


def test_importing_flowkit_elsewhere_leaves_the_signals_alone() -> None:
    assert not _boot.CAUGHT
    assert signal.getsignal(signal.SIGTERM) is not _boot.caught_early
