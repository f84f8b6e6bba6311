"""The ``flowkit`` command: list runs, show one, print or replay histories, run the demo.

Every error is one clear line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from . import _serde
from ._history import History
from ._replayer import replay_async
from ._run import ADMITTED_TAG, RunStatus
from .errors import FlowkitError, HistoryError, NonDeterminismError

DEFAULT_DB = "sqlite:///flowkit.db"


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def _store(url: str) -> Any:
    try:
        from .stores.sql import SqlStore
    except ImportError as exc:  # pragma: no cover - packaging problem
        raise CliError(f"SQL stores are unavailable: {exc}") from None
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        path = Path(url.removeprefix("sqlite:///"))
        if not path.exists():
            raise CliError(f"no flowkit database at {path} (set --db or FLOWKIT_DB)")
    return SqlStore(url)


def _fmt_time(t: float | None) -> str:
    if t is None:
        return "-"
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


async def _runs(args: argparse.Namespace, console: Console) -> int:
    store = _store(args.db)
    status = RunStatus(args.status) if args.status else None
    runs = await store.list_runs(workflow=args.workflow, status=status, tag=args.tag)
    runs = runs[: args.limit]
    table = Table(title=f"runs in {args.db}")
    for col in ("id", "workflow", "status", "singleton", "created", "updated"):
        table.add_column(col)
    for r in runs:
        lane = "-"
        if r.singleton_key is not None:
            lane = f"{r.singleton_key} " + ("holds" if ADMITTED_TAG in r.tags else "waits")
        table.add_row(
            r.id, r.workflow, str(r.status), lane, _fmt_time(r.created_at), _fmt_time(r.updated_at)
        )
    console.print(table)
    return 0


async def _show(args: argparse.Namespace, console: Console) -> int:
    store = _store(args.db)
    run = await store.get_run(args.run)
    if run is None:
        raise CliError(f"unknown run {args.run!r}")
    console.print(f"[bold]{run.id}[/]  {run.workflow} v{run.workflow_version}  [{run.status}]")
    console.print(f"  created {_fmt_time(run.created_at)}  updated {_fmt_time(run.updated_at)}")
    if run.wake_at is not None:
        console.print(f"  wakes   {_fmt_time(run.wake_at)}")
    if run.tags:
        console.print(f"  tags    {', '.join(run.tags)}")
    console.print(f"  input   {_serde.dumps(run.input).decode()}")
    if run.status is RunStatus.COMPLETED:
        console.print(f"  output  {_serde.dumps(run.output).decode()}")
    if run.error:
        console.print(f"  error   {run.error.get('type')}: {run.error.get('message')}")
    return 0


async def _history(args: argparse.Namespace, console: Console) -> int:
    store = _store(args.db)
    if await store.get_run(args.run) is None:
        raise CliError(f"unknown run {args.run!r}")
    hist = History(args.run, await store.load_events(args.run))
    if args.json:
        sys.stdout.write(hist.to_json() + "\n")
        return 0
    t0 = hist[0].at if len(hist) else 0.0
    for ev in hist:
        detail = {
            k: v for k, v in ev.model_dump(mode="json").items() if k not in ("seq", "type", "at")
        }
        text = _serde.dumps(detail).decode() if detail else ""
        console.print(f"{ev.seq:>4}  +{ev.at - t0:9.3f}s  {ev.type:<20} {text[:120]}")
    return 0


def _load_workflow(spec: str) -> Any:
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise CliError(f"--workflow takes module:Class, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(mod_name)
    except Exception as exc:
        raise CliError(f"cannot import {mod_name!r}: {exc}") from None
    obj = getattr(module, attr, None)
    if obj is None:
        raise CliError(f"{mod_name!r} has no attribute {attr!r}")
    return obj


async def _replay(args: argparse.Namespace, console: Console) -> int:
    try:
        raw = Path(args.file).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
    hist = History.from_json(raw)
    wf = _load_workflow(args.workflow)
    try:
        await replay_async(hist, wf)
    except NonDeterminismError as exc:
        console.print("[red]diverged[/]:", end=" ")
        console.print(exc.report(), markup=False, highlight=False)
        return 1
    console.print(f"[green]ok[/]: {len(hist)} events of {hist.run_id!r} replay")
    return 0


async def _demo(args: argparse.Namespace, console: Console) -> int:
    root = Path(__file__).resolve().parent.parent / "samples" / "demo.py"
    if not root.exists():
        raise CliError("the demo ships with the source tree (samples/demo.py)")
    proc = await asyncio.create_subprocess_exec(sys.executable, str(root), *args.rest)
    return await proc.wait()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flowkit", description="Inspect and replay flowkit runs.")
    p.add_argument("--db", default=os.environ.get("FLOWKIT_DB", DEFAULT_DB), help="store URL")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("runs", help="list runs")
    r.add_argument("--workflow")
    r.add_argument("--status", choices=[s.value for s in RunStatus])
    r.add_argument("--tag")
    r.add_argument("--limit", type=int, default=100)
    s = sub.add_parser("show", help="one run's state")
    s.add_argument("run")
    h = sub.add_parser("history", help="a run's events")
    h.add_argument("run")
    h.add_argument("--json", action="store_true", help="exact History.to_json()")
    rp = sub.add_parser("replay", help="replay a history file against current code")
    rp.add_argument("file")
    rp.add_argument("--workflow", required=True, help="module:Class")
    d = sub.add_parser("demo", help="the live demo of singleton lanes")
    d.add_argument("rest", nargs=argparse.REMAINDER)
    return p


COMMANDS = {"runs": _runs, "show": _show, "history": _history, "replay": _replay, "demo": _demo}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console()
    err = Console(stderr=True)
    try:
        return asyncio.run(COMMANDS[args.cmd](args, console))
    except (CliError, HistoryError, FlowkitError, ValueError) as exc:
        err.print(f"flowkit: error: {exc}", markup=False, highlight=False)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
