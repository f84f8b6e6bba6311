"""The documented install works from a user's own project: ``pip install -e .`` into a fresh
venv, then mypy, run from another directory, finds flowkit's types (a setuptools editable
install is an import hook that mypy cannot follow: ``Cannot find implementation or library
stub for module named "flowkit"``). The regular wheel ships both packages with their
``py.typed`` markers, the ``flowkit`` script and the pytest plugin.

pip builds the package in an isolated environment, so it must reach a package index for the
build backend; without one (and outside CI) these tests skip, and ``-m "not install"``
deselects them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.install

REPO = Path(__file__).resolve().parents[1]


def run(*cmd: str | Path, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "MYPY"))}
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def pip(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The running interpreter's pip (no network needed for flowkit's own dependencies:
    ``--no-deps``); skips when the build backend cannot be fetched, except in CI."""
    out = run(sys.executable, "-m", "pip", "--disable-pip-version-check", *args, cwd=cwd)
    if out.returncode != 0:
        unreachable = ("No matching distribution found", "Could not find a version")
        if any(u in out.stderr for u in unreachable) and not os.environ.get("CI"):
            pytest.skip(f"pip cannot fetch the build backend: {out.stderr.strip()[-300:]}")
        raise AssertionError(f"pip {' '.join(map(str, args))} failed:\n{out.stdout}{out.stderr}")
    return out


USER_CODE = """\
    from flowkit import Engine, WorkflowCtx, workflow
    from flowkit.stores import MemoryStore
    from flowkit_testing import TestEnv


    @workflow(name="hello")
    class Hello:
        async def run(self, ctx: WorkflowCtx, name: str) -> str:
            return f"hello {name}"


    async def main() -> str:
        async with Engine(MemoryStore(), [Hello()]) as engine:
            await engine.start("hello", "ada", "r1")
            out: str = await engine.result("r1")
            return out


    reveal_type(Engine)
    reveal_type(TestEnv)
    wrong: int = Engine  # proves mypy sees the real class, not Any
"""


def test_editable_install_type_checks_from_another_project(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path).check_returncode()
    python = venv / "bin" / "python"
    pip("--python", python, "install", "--no-deps", "-e", REPO, cwd=tmp_path)

    site = next((venv / "lib").glob("python*/site-packages"))
    dist = next(site.glob("flowkit-*.dist-info"))
    entry_points = (dist / "entry_points.txt").read_text()
    assert "flowkit = flowkit.cli:main" in entry_points
    assert "[pytest11]" in entry_points and "flowkit_testing.pytest_plugin" in entry_points
    assert (venv / "bin" / "flowkit").exists()

    project = tmp_path / "userproject"
    project.mkdir()
    (project / "app.py").write_text(textwrap.dedent(USER_CODE))
    out = run(
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--no-incremental",
        "--python-executable",
        python,
        "app.py",
        cwd=project,
    )
    report = out.stdout + out.stderr
    assert "Cannot find implementation or library stub" not in report, report
    assert 'Revealed type is "def (store: flowkit.stores.base.Store' in report, report
    assert "-> flowkit._client.engine.Engine" in report, report
    assert "-> flowkit_testing._env.TestEnv" in report, report
    # the one deliberate error, and no other
    assert 'error: Incompatible types in assignment (expression has type "type[Engine]"' in report
    assert "Found 1 error in 1 file" in report, report


def test_wheel_ships_both_packages_typed_with_script_and_plugin(tmp_path: Path) -> None:
    pip("wheel", "--no-deps", "-w", tmp_path, REPO, cwd=tmp_path)
    (wheel,) = tmp_path.glob("flowkit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "flowkit/py.typed" in names and "flowkit_testing/py.typed" in names
    assert "flowkit/stores/sql/__init__.py" in names
    assert "flowkit_testing/conformance/__init__.py" in names
    tops = {n.split("/")[0] for n in names}
    assert tops == {"flowkit", "flowkit_testing", wheel.name.split("-py3")[0] + ".dist-info"}
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "flowkit = flowkit.cli:main" in text and "flowkit_testing.pytest_plugin" in text
