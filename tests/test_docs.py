"""Every code block of README.md and docs/*.md that claims to run does run, and prints what the
page says it prints.

The conventions are in docs/README.md ("Code blocks"): a ```python block is a program, run as
``python snippet.py`` in an empty directory; a block with ``test_`` functions is a pytest file,
run by pytest in a fresh project (no pytest configuration, so pytest-asyncio is in its default
strict mode); ``<!-- fragment -->`` on the line above a block exempts it; ``<!-- output -->``
above a block makes it the exact standard output of the nearest runnable block above it;
``<!-- file: PATH -->`` makes it the exact content of PATH after that block ran. A first line
``# some/path.py`` names the file a block is saved as.

The snippets import "your own code" (``myapp``, ``mystore``) from ``tests/docs_project``, which
is on their ``PYTHONPATH``; its ``prepare.py`` writes the data files they read (``report-1.json``,
``tests/histories/``) into each snippet's directory. To keep the suite fast, every program runs
in one interpreter (``tests/docs_runner.py``) and every pytest file in one pytest run, the two
side by side."""

from __future__ import annotations

import ast
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = Path(__file__).resolve().parent / "docs_project"
RUNNER = Path(__file__).resolve().parent / "docs_runner.py"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

OPEN = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")
CLOSE = re.compile(r"^ *```\s*$")
MARKER = re.compile(r"^\s*<!--\s*(?P<text>.*?)\s*-->\s*$")
PATH_LINE = re.compile(r"^#\s*(?P<path>[\w./-]+\.py)\s*$")
RUNNERS = 2  # interpreters running the programs side by side (mostly waiting on SQLite's fsync)
# The keys a snippet finds in its environment (docs/stores.md: a CodecStore's key).
SNIPPET_ENV = {"FLOWKIT_KEY_2025_01": "00" * 32}


@dataclass
class Block:
    page: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None  # the HTML comment on the line above the fence, without <!-- -->
    checks: list[Block] = field(default_factory=list)  # output/file blocks about this one

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def slug(self) -> str:
        return f"{Path(self.page).stem}-{self.line}"

    @property
    def kind(self) -> str:
        """``program``, ``tests`` (a pytest file), ``fragment`` or ``other`` (not Python)."""
        if self.lang != "python":
            return "other"
        if self.marker == "fragment":
            return "fragment"
        try:
            tree = ast.parse(self.text)
        except SyntaxError:
            return "program"  # runs, and reports the SyntaxError with a hint
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test"
            ):
                return "tests"
            if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                return "tests"
        return "program"

    @property
    def filename(self) -> str:
        first = self.text.splitlines()[0] if self.text.strip() else ""
        named = PATH_LINE.match(first)
        if named:
            return named["path"]
        if self.kind == "tests":
            return f"test_{self.slug.replace('-', '_')}.py"
        return "snippet.py"

    def __repr__(self) -> str:  # the test ids
        return self.id


def parse(page: Path) -> tuple[list[Block], list[str]]:
    """The page's fenced code blocks, each with the marker above it, and the problems found:
    an unclosed block, a closing fence with text after it (which Markdown does not close)."""
    rel = page.relative_to(ROOT).as_posix()
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    i = 0
    while i < len(lines):
        opening = OPEN.match(lines[i])
        if opening is None:
            if lines[i].lstrip().startswith("```"):
                problems.append(f"{rel}:{i + 1}: a fence with text after it: {lines[i]!r}")
            i += 1
            continue
        start, indent = i, len(opening["indent"])
        above = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(above)
        body: list[str] = []
        i += 1
        while i < len(lines) and not CLOSE.match(lines[i]):
            if lines[i].lstrip().startswith("```"):
                problems.append(
                    f"{rel}:{i + 1}: a fence inside the block opened at line {start + 1} (does "
                    f"that block's closing fence have text after it?): {lines[i]!r}"
                )
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        if i == len(lines):
            problems.append(f"{rel}:{start + 1}: the code block is never closed")
        blocks.append(
            Block(
                rel,
                start + 1,
                opening["lang"],
                "\n".join(body) + "\n",
                marker["text"] if marker else None,
            )
        )
        i += 1
    return blocks, problems


def collect() -> tuple[list[Block], list[str]]:
    """Every block of every page, with output/file blocks attached to the block they describe;
    and every problem with the blocks and their markers."""
    blocks: list[Block] = []
    problems: list[str] = []
    for page in PAGES:
        page_blocks, page_problems = parse(page)
        problems += page_problems
        last_runnable: Block | None = None
        for block in page_blocks:
            marker = block.marker
            if block.kind in ("program", "tests"):
                last_runnable = block
            if marker is None or block.kind == "fragment":
                continue
            if marker == "fragment":
                problems.append(f"{block.id}: <!-- fragment --> is for ```python blocks")
            elif marker == "output" or marker.startswith("file:"):
                if last_runnable is None:
                    problems.append(f"{block.id}: <!-- {marker} --> with no runnable block above")
                elif marker == "output" and last_runnable.kind != "program":
                    problems.append(
                        f"{block.id}: <!-- output --> follows {last_runnable.id}, a pytest file"
                    )
                elif block.kind in ("program", "tests"):
                    problems.append(f"{block.id}: <!-- {marker} --> on a runnable block")
                else:
                    last_runnable.checks.append(block)
            else:
                problems.append(f"{block.id}: unknown marker <!-- {marker} -->")
        blocks += page_blocks
    return blocks, problems


BLOCKS, PROBLEMS = collect()
RUNNABLE = [b for b in BLOCKS if b.kind in ("program", "tests")]


def test_code_blocks_and_markers_are_well_formed() -> None:
    assert not PROBLEMS, "\n".join(PROBLEMS)
    pages = {b.page for b in RUNNABLE}
    assert {"README.md", "docs/getting-started.md", "docs/testing.md"} <= pages
    assert any(b.kind == "tests" for b in RUNNABLE)
    assert any(b.checks for b in RUNNABLE)


def test_the_parser_sees_markers_and_broken_fences(tmp_path: Path, monkeypatch: Any) -> None:
    """The conventions themselves: a fragment is not run, output attaches to the program above,
    a pytest file is told apart, and a fence with trailing text is reported."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- fragment -->\n```python\nawait x\n```\n\n"
        "```python\nprint('hi')\n```\n\nIt prints:\n\n<!-- output -->\n```text\nhi\n```\n\n"
        "```python\n# tests/test_it.py\ndef test_it():\n    pass\n```\n\n"
        "```python\nx = 1\n``` and some prose\n```\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PAGES", [page])
    blocks, problems = collect()
    assert [b.kind for b in blocks] == ["fragment", "program", "other", "tests", "program"]
    assert blocks[1].checks == [blocks[2]] and blocks[2].marker == "output"
    assert blocks[3].filename == "tests/test_it.py"
    assert problems == [
        "page.md:25: a fence inside the block opened at line 23 (does that block's closing "
        "fence have text after it?): '``` and some prose'"
    ]


# -- running the blocks ------------------------------------------------------------------------


@dataclass
class Outcome:
    ok: bool
    detail: str  # what to show when it failed
    stdout: str
    dir: Path


def _env() -> dict[str, str]:
    """A user's shell: this checkout's flowkit and the example project importable; nothing of
    the outer pytest run (its options, its plugins) or of the developer's flowkit settings."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "FLOWKIT_", "PYTHON"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(PROJECT)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in tests/docs_project
    env.update(SNIPPET_ENV)
    return env


def _selected(request: pytest.FixtureRequest) -> list[Block]:
    """The blocks whose tests this session runs (all of them unless some were deselected)."""
    ids = {
        item.callspec.params["block"].id
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.originalname == "test_doc_block"
        and hasattr(item, "callspec")
    }
    return [b for b in RUNNABLE if b.id in ids] or RUNNABLE


def _lay_out(block: Block, data: Path, parent: Path) -> Path:
    """A fresh directory for ``block``: the example data, and the block as its file."""
    directory = parent / block.slug
    shutil.copytree(data, directory)
    target = directory / block.filename
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(block.text)
    return directory


def _pytest_outcomes(
    junit: Path, output: str, dirs: dict[str, Path], blocks: list[Block]
) -> dict[str, Outcome]:
    cases: dict[str, list[tuple[str, str]]] = {b.slug: [] for b in blocks}
    if junit.exists():
        for case in ET.parse(junit).iter("testcase"):
            where = case.get("classname") or case.get("name") or ""
            slug = where.split(".")[0]
            name = f"{where}::{case.get('name')}"
            bad = [c for c in case if c.tag in ("failure", "error")]
            skipped = [c for c in case if c.tag == "skipped"]
            status = "failed" if bad else "skipped" if skipped else "passed"
            text = "\n".join((c.get("message") or "") + "\n" + (c.text or "") for c in bad)
            cases.setdefault(slug, []).append((status, f"{name}: {status}\n{text}".strip()))
    strict = re.search(r"^asyncio: mode=(Mode\.)?strict\b", output, re.M | re.I) is not None
    outcomes = {}
    for block in blocks:
        results = cases[block.slug]
        ok = (
            strict
            and any(s == "passed" for s, _ in results)
            and not any(s == "failed" for s, _ in results)
        )
        detail = "\n".join(text for _, text in results) or "no test of this file ran"
        if not strict:
            detail += "\npytest-asyncio was not in strict mode: a pytest configuration leaked in"
        outcomes[block.id] = Outcome(
            ok, f"{detail}\n\npytest output:\n{output}", "", dirs[block.id]
        )
    return outcomes


@pytest.fixture(scope="session")
def doc_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Outcome]:
    """Run the selected blocks: programs in ``docs_runner.py`` (``RUNNERS`` of them), pytest
    files in one pytest run, all at once; the outcome of each block by id."""
    blocks = _selected(request)
    base = tmp_path_factory.mktemp("docs")
    env = _env()
    data = base / "data"
    data.mkdir()
    prep = subprocess.run(
        [sys.executable, str(PROJECT / "prepare.py")],
        cwd=data,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert prep.returncode == 0, f"tests/docs_project/prepare.py failed:\n{prep.stderr}"

    programs = [b for b in blocks if b.kind == "program"]
    tests = [b for b in blocks if b.kind == "tests"]
    dirs = {b.id: _lay_out(b, data, base / "programs") for b in programs}
    dirs |= {b.id: _lay_out(b, data, base / "pytest") for b in tests}

    results_files = [base / f"results-{n}.jsonl" for n in range(RUNNERS)]
    commands = [
        [sys.executable, str(RUNNER), str(base / f"manifest-{n}.json"), str(results_files[n])]
        for n in range(RUNNERS)
    ]
    for n in range(RUNNERS):
        share = programs[n::RUNNERS]
        Path(commands[n][2]).write_text(
            json.dumps([{"id": b.id, "dir": str(dirs[b.id]), "file": b.filename} for b in share])
        )
    junit = base / "junit.xml"
    if tests:
        commands.append(
            [
                *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--snapshot-update"),
                f"--junitxml={junit}",
                *(str(dirs[b.id]) for b in tests),
            ]
        )
    logs = [base / f"output-{n}.txt" for n in range(len(commands))]
    procs = []
    for command, log in zip(commands, logs, strict=True):
        with log.open("w") as out:
            cwd = base / "pytest" if command[1] == "-m" else base
            procs.append(
                subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
            )
    try:
        for proc in procs:
            proc.wait(timeout=300)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    runner_output = "\n".join(log.read_text() for log in logs[:RUNNERS])
    pytest_output = logs[RUNNERS].read_text() if tests else ""

    outcomes: dict[str, Outcome] = {}
    lines = [line for f in results_files if f.exists() for line in f.read_text().splitlines()]
    for line in lines:
        entry = json.loads(line)
        if "ok" in entry:
            detail = (
                f"{entry['error'] or ''}\nstdout:\n{entry['stdout']}\nstderr:\n{entry['stderr']}"
            )
            outcomes[entry["id"]] = Outcome(entry["ok"], detail, entry["stdout"], dirs[entry["id"]])
    for block in programs:
        if block.id not in outcomes:
            outcomes[block.id] = Outcome(
                False,
                f"the runner stopped before this block ended:\n{runner_output}",
                "",
                dirs[block.id],
            )
    if tests:
        outcomes |= _pytest_outcomes(junit, pytest_output, dirs, tests)
    return outcomes


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip("\n").splitlines()]


HINT = (
    "\n(not meant to run on its own? put <!-- fragment --> on the line above it; "
    "conventions in docs/README.md)"
)


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
def test_doc_block(block: Block, doc_runs: dict[str, Outcome]) -> None:
    outcome = doc_runs[block.id]
    if not outcome.ok:
        pytest.fail(f"{block.id} ({block.kind}) failed:\n{outcome.detail}{HINT}", pytrace=False)
    for check in block.checks:
        assert check.marker is not None
        if check.marker == "output":
            actual, what = outcome.stdout, "its output"
        else:
            path = check.marker.removeprefix("file:").strip()
            target = outcome.dir / path
            if not target.exists():
                pytest.fail(f"{check.id}: {block.id} did not write {path}", pytrace=False)
            actual, what = target.read_text(), path
        diff = "\n".join(
            difflib.unified_diff(
                _lines(check.text), _lines(actual), f"{check.id} (the page)", what, lineterm=""
            )
        )
        if _lines(actual) != _lines(check.text):
            pytest.fail(f"{block.id}: {what} differs from {check.id}:\n{diff}", pytrace=False)
