"""``samples/deploy/``: the worker image and the systemd unit of docs/deploying.md. A Docker
engine is not on every machine (CI has only the client), so the Dockerfile is built and run
only where ``docker info`` answers; everywhere it is linted instead: pinned base image, exec
form ``CMD`` and a non-root ``USER``, every ``COPY`` source present in the build context, and
the image's command itself run as a real worker process (the same argv, environment and
working directory as in the container) that serves the sample's workflow and drains on
SIGTERM. The systemd unit's ``ExecStart`` is checked the same way."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flowkit import Engine, RunStatus
from flowkit.cli import build_parser
from flowkit.stores import SqlStore

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "samples" / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
BOUND = 60.0


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions as ``(KEYWORD, arguments)``, continuation lines joined
    and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    assert not pending, "a continuation line runs off the end of the Dockerfile"
    return out


def _env_of(steps: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in steps:
        if keyword == "ENV":
            for pair in shlex.split(args):
                name, _, value = pair.partition("=")
                env[name] = value
    return env


def _cmd(steps: list[tuple[str, str]]) -> list[str]:
    cmds = [args for keyword, args in steps if keyword == "CMD"]
    assert len(cmds) == 1, "one CMD"
    argv = json.loads(cmds[0])  # exec form: a JSON array (shell form would not pass SIGTERM)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    return argv


def test_the_dockerfile_lints() -> None:
    steps = instructions(DOCKERFILE.read_text())
    keywords = [k for k, _ in steps]
    assert keywords[0] == "FROM"
    image = steps[0][1].split()[0]
    _name, _, tag = image.partition(":")
    assert tag and tag != "latest" and any(c.isdigit() for c in tag), (
        f"pin the base image's version: {image}"
    )
    # the last USER is not root: a worker needs no privileges
    users = [args for k, args in steps if k == "USER"]
    assert users and users[-1] not in ("root", "0"), "run as an unprivileged user"
    assert keywords.index("USER") < keywords.index("CMD")
    assert ("STOPSIGNAL", "SIGTERM") in steps
    assert "ADD" not in keywords, "COPY, not ADD (no remote URLs, no implicit unpacking)"
    # every COPY source exists in the build context (the repository root)
    for keyword, args in steps:
        if keyword == "COPY":
            *sources, _dest = shlex.split(args)
            for src in sources:
                assert not src.startswith("--"), f"unexpected COPY flag in {args}"
                assert (ROOT / src).exists(), f"COPY {src}: not in the build context"
    argv = _cmd(steps)
    assert argv[:2] == ["flowkit", "worker"]
    args = build_parser().parse_args(argv[1:])  # a command flowkit accepts
    assert args.cmd == "worker" and args.app == "app:WORKFLOWS"
    env = _env_of(steps)
    assert float(env["FLOWKIT_GRACE"]) > 0
    assert env["FLOWKIT_LOG_FORMAT"] == "json"
    exposed = [args for k, args in steps if k == "EXPOSE"]
    assert exposed == [env["FLOWKIT_METRICS_PORT"]], "EXPOSE the metrics port"


def test_the_dockerignore_keeps_the_context_small() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for heavy in (".venv", ".git"):
        assert heavy in ignored


def unit_file(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit's sections, each key with all its values in order (``Environment=``
    repeats, so configparser would keep only the last one)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"a setting before any section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_the_systemd_unit_runs_a_worker_that_drains() -> None:
    unit = unit_file((DEPLOY / "flowkit-worker@.service").read_text())
    service = unit["Service"]
    assert service["KillSignal"] == ["SIGTERM"]
    assert service["KillMode"] == ["mixed"]
    env = dict(e.split("=", 1) for e in service["Environment"])
    assert float(service["TimeoutStopSec"][0]) > float(env["FLOWKIT_GRACE"]), (
        "SIGKILL only after the drain's grace"
    )
    assert "%i" in env["FLOWKIT_INSTANCE_ID"], "a stable instance id per unit instance"
    argv = shlex.split(service["ExecStart"][0])
    assert Path(argv[0]).name == "flowkit"
    args = build_parser().parse_args(argv[1:])
    assert args.cmd == "worker" and args.app == "app:WORKFLOWS"
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


async def _until_settled(engine: Engine, run_id: str) -> str:
    return str(await engine.result(run_id, timeout=BOUND))


async def test_the_images_command_serves_the_sample_and_drains(tmp_path: Path) -> None:
    """What ``docker run`` would do, without Docker: the CMD's argv with the image's ENV (and
    ``FLOWKIT_DB`` from the deployment), run from a folder holding only ``app.py`` as the
    image's WORKDIR does; it finishes an invoice, then SIGTERM makes it exit 0."""
    steps = instructions(DOCKERFILE.read_text())
    argv = _cmd(steps)
    workdir = tmp_path / "srv-app"
    workdir.mkdir()
    shutil.copy(DEPLOY / "app.py", workdir / "app.py")
    url = f"sqlite:///{tmp_path / 'deploy.db'}"
    env = {
        **os.environ,
        **_env_of(steps),
        "FLOWKIT_DB": url,
        "FLOWKIT_METRICS_PORT": "",  # (the port is the image's; here any test may run beside)
        "PYTHONPATH": f"{workdir}{os.pathsep}{ROOT}",
    }
    log = (tmp_path / "worker.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "flowkit.cli",
        *argv[1:],
        cwd=workdir,
        env=env,
        stdout=log,
        stderr=log,
    )
    store = SqlStore(url)
    try:
        sys.path.insert(0, str(workdir))
        try:
            import app  # the sample module, as the worker imports it
        finally:
            sys.path.remove(str(workdir))
        engine = Engine(store, app.WORKFLOWS, worker=False)
        run = await engine.start(app.Invoice, {"invoice_id": "inv-1", "lines": [1200, 800]})
        await engine.signal(run.id, "paid", "alice")
        result = await asyncio.wait_for(_until_settled(engine, run.id), BOUND)
        assert result == "inv-1: 2000 cents paid by alice"
        assert (await engine.get_run(run.id)).status == RunStatus.COMPLETED
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), BOUND) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log.close()
        store.close()
        sys.modules.pop("app", None)
    lines = (tmp_path / "worker.log").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert any(r.get("message") == "waiting for the payment of inv-1" for r in records), lines


def _docker_engine() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _docker_engine(), reason="no Docker engine here: the Dockerfile is linted")
def test_the_image_builds_and_knows_its_command() -> None:
    tag = "flowkit-worker-test:ci"
    subprocess.run(
        ["docker", "build", "-q", "-f", str(DOCKERFILE), "-t", tag, str(ROOT)],
        check=True,
        timeout=900,
    )
    try:
        out = subprocess.run(
            ["docker", "run", "--rm", tag, "flowkit", "worker", "--help"],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        assert "--grace" in out
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)
