"""``flowkit runs --search``, ``flowkit show``'s search attributes, the ``search_upserted``
line of ``flowkit history`` and ``flowkit prune --older-than`` against a real SQLite file,
run as a user would (subprocess)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cli_kit import flowkit

from flowkit import Engine, SystemClock, WorkflowCtx, workflow
from flowkit._core.search_terms import parse_filter
from flowkit.cli._search import UsageError, duration, search_terms
from flowkit.stores import SqlStore


@workflow(name="cli-search")
class Tagged:
    async def run(self, ctx: WorkflowCtx, input: dict[str, Any]) -> str:
        await ctx.upsert_search(stage="done", amount=input["amount"])
        return "ok"


@pytest.fixture
async def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'flowkit.db'}"
    async with Engine(SqlStore(url), [Tagged()], clock=SystemClock()) as engine:
        for i, amount in enumerate((10, 200, 300)):
            await engine.start(
                "cli-search", {"amount": amount}, f"r{i}", search={"customer": f"c-{i % 2}"}
            )
            await engine.result(f"r{i}", timeout=10)
    return url


async def test_runs_search_show_and_history(db: str, tmp_path: Path) -> None:
    out = flowkit(tmp_path, "--db", db, "runs", "--search", "customer=c-0")
    assert out.returncode == 0, out.stderr
    assert "r0" in out.stdout and "r2" in out.stdout and "r1" not in out.stdout
    out = flowkit(
        tmp_path, "--db", db, "runs", "--search", "customer=c-0", "--search", "amount>=100"
    )
    assert out.returncode == 0, out.stderr
    assert "r2" in out.stdout and "r0" not in out.stdout
    out = flowkit(tmp_path, "--db", db, "runs", "--search", "amount!=200", "--limit", "1")
    assert out.returncode == 0, out.stderr
    assert "r2" in out.stdout and "r0" not in out.stdout  # (the most recent one)
    out = flowkit(tmp_path, "--db", db, "show", "r1")
    assert out.returncode == 0, out.stderr
    assert 'search  amount=200, customer="c-1", stage="done"' in out.stdout
    out = flowkit(tmp_path, "--db", db, "history", "r1")
    assert out.returncode == 0, out.stderr
    assert "search_upserted" in out.stdout and "search stage=" in out.stdout


async def test_prune_deletes_old_settled_runs(db: str, tmp_path: Path) -> None:
    out = flowkit(tmp_path, "--db", db, "prune", "--older-than", "30d")
    assert out.returncode == 0, out.stderr
    assert "pruned 0 runs settled more than 30d ago" in out.stdout
    out = flowkit(tmp_path, "--db", db, "prune", "--older-than", "0s", "--status", "completed")
    assert out.returncode == 0, out.stderr
    assert "pruned 3 runs" in out.stdout
    assert await SqlStore(db).list_runs() == []


@pytest.mark.parametrize(
    "args",
    [
        ("prune", "--older-than", "30 days"),
        ("prune", "--older-than", "30d", "--status", "running"),
        ("runs", "--search", "no operator"),
        ("runs", "--search", "amount<true"),
    ],
)
def test_bad_arguments_are_one_line_errors(db: str, tmp_path: Path, args: tuple[str, ...]) -> None:
    out = flowkit(tmp_path, "--db", db, *args)
    assert out.returncode == 2
    assert out.stderr.count("\n") <= 3 and "Traceback" not in out.stderr


def test_durations_and_terms() -> None:
    assert duration("30d") == 30 * 86400
    assert duration("12h") == 12 * 3600
    assert duration("90m") == 5400
    assert duration("45s") == duration("45") == 45
    with pytest.raises(UsageError):
        duration("-1d")
    terms = search_terms(["a=1", "b=x", "c!='q'", "d>=2.5", "e=true", 'f="7"'])
    assert [(t.name, t.op, t.values) for t in terms] == [
        ("a", "==", (1,)),
        ("b", "==", ("x",)),
        ("c", "!=", ("'q'",)),
        ("d", ">=", (2.5,)),
        ("e", "==", (True,)),
        ("f", "==", ("7",)),
    ]
    # two terms of one attribute both hold (a range), in the CLI and in the API's form
    got = search_terms(["amount>=100", "amount<500"])
    assert [(t.name, t.op, t.values) for t in got] == [
        ("amount", ">=", (100,)),
        ("amount", "<", (500,)),
    ]
    assert parse_filter({"amount": [(">=", 100), ("<", 500)]}) == got
