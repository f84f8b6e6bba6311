"""The ``flowkit`` command: list runs, show one, print or replay histories, cancel and signal
runs, run the demo.

Output is rich (colours, tables) in a terminal and plain text when piped: no colours, no box
drawing, no wrapping, one record per line (a newline or other control character inside a value
or message is escaped: ``\\n``). Every error is one line on stderr
(``flowkit: error: ...``) and exit status 2, never a traceback (``FLOWKIT_DEBUG=1`` shows the
traceback of an unexpected one). ``replay`` exits 1 when a history diverges."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from .._client import browse as _browse
from .._client.engine import Engine
from .._client.serve import catch_stop_signals, release_stop_signals
from .._core.clock import SystemClock
from .._core.run import Run, RunStatus
from .._model.definition import definition_of
from .._model.history import History
from .._replay.children import WAKE_PREFIX as CHILD_WAKE
from .._replay.replayer import (
    ReplayResult,
    patches_taken,
    pick_version,
    replay_async,
    replay_dir_async,
)
from .._worker.continue_as_new import chain_end
from .._worker.worker import WORKER_SEEN_WINDOW
from ..errors import FlowkitError, NonDeterminismError
from ..singleton import holders, waiters
from . import _search as _cli_search
from . import _ui_command as _cli_ui
from . import _worker as _cli_worker
from ._common import CliError, import_attr
from ._out import (
    EVENT_STYLE,
    Out,
    _describe,
    _fmt_time,
    _lease_expired,
    _lease_left,
    _status,
    _value,
    chain_lines,
    encrypted,
    lease_cell,
    no_worker_line,
    unserved,
)
from ._schedules import schedules

DEFAULT_DB = "sqlite:///flowkit.db"


# -- the store -------------------------------------------------------------------------------


def _open_store(url: str) -> Any:
    """A ``SqlStore`` on an existing flowkit database, or ``CliError``. Nothing is written to
    a database that is not flowkit's (``SqlStore.check``)."""
    from ..errors import FlowkitError, NotAFlowkitDatabaseError
    from ..stores.sql import SqlStore

    try:
        SqlStore.check(url)
    except FlowkitError as exc:
        missing = isinstance(exc, NotAFlowkitDatabaseError) and exc.missing
        raise CliError(f"{exc}{' (set --db or FLOWKIT_DB)' if missing else ''}") from None
    return SqlStore(url)


async def _plain_marker(store: Any) -> str | None:
    """The encryption marker of a database read without its keys (``None``: in clear, or
    read through a ``CodecStore``)."""
    from ..stores.codec import CodecStore

    read = getattr(store, "codec_marker", None)
    if read is None or isinstance(store, CodecStore):
        return None
    marker: str | None = await read()
    return marker


async def _get_run(store: Any, run_id: str) -> Run:
    run: Run | None = await store.get_run(run_id)
    if run is None:
        raise CliError(f"unknown run {run_id!r}")
    return run


async def _lanes(store: Any, runs: Sequence[Run]) -> dict[str, str]:
    """For each singleton run: its slot state (``holds``, ``waits behind <holders>``)."""
    sharing: dict[tuple[str, str], list[Run]] = {}
    lanes: dict[str, str] = {}
    for r in runs:
        tag = r.singleton_tag
        if tag is None or r.status.terminal:
            continue
        if (r.workflow, tag) not in sharing:
            sharing[(r.workflow, tag)] = await store.list_runs(workflow=r.workflow, tag=tag)
        lane = sharing[(r.workflow, tag)]
        if r.admitted:
            lanes[r.id] = "holds"
        elif r.status is RunStatus.CANCELLING:
            lanes[r.id] = "cancelling (never admitted)"
        else:
            held = [h.id for h in holders(lane, tag, r.workflow)]
            queue = [w.id for w in waiters(lane, tag, r.workflow)]
            place = f" (#{queue.index(r.id) + 1} in queue)" if r.id in queue else ""
            lanes[r.id] = (f"waits behind {', '.join(held)}" if held else "waits") + place
    return lanes


# -- commands --------------------------------------------------------------------------------


async def _runs(args: argparse.Namespace, out: Out, store: Any) -> int:
    status = RunStatus(args.status) if args.status else None
    more = {"search": args.search_terms} if args.search_terms else {}
    runs: list[Run]
    beyond = False  # (more runs than ``_browse.COUNT_LIMIT`` of a status: not all counted)
    if args.limit > 0:
        # the most recent (one query on a store that browses), still printed oldest first
        terms = args.search_terms or ()
        runs = await _browse.page_runs(
            store,
            workflow=args.workflow,
            status=status,
            tag=args.tag,
            search=terms,
            limit=args.limit,
        )
        runs.reverse()
        total = len(runs)
        if total == args.limit:  # (maybe more: count them, bounded: ``_browse.COUNT_LIMIT``)
            counts = await _browse.count_runs(
                store, workflow=args.workflow, tag=args.tag, search=terms, limit=_browse.COUNT_LIMIT
            )
            if status is not None:
                counts = {status: counts[status]}
            total = sum(min(n, _browse.COUNT_LIMIT) for n in counts.values())
            beyond = any(n > _browse.COUNT_LIMIT for n in counts.values())
    else:
        runs = await store.list_runs(workflow=args.workflow, status=status, tag=args.tag, **more)
        total = len(runs)
    lanes = await _lanes(store, runs)
    now = args.clock.now()
    missing = await unserved(store, runs, now)
    rows = [
        (
            r.id,
            r.workflow,
            _status(r.status),
            r.singleton_key or "",
            lanes.get(r.id, ""),
            _fmt_time(r.created_at),
            _fmt_time(r.updated_at),
            lease_cell(r, now, missing),
        )
        for r in runs
    ]
    caption = None
    if len(runs) < total:
        of = f"more than {total}" if beyond else str(total)
        caption = f"the {len(runs)} most recent of {of} runs (--limit 0 shows all)"
    elif not runs:
        caption = "no runs"
    if missing and any(r.status.active for r in runs):
        note = f"no worker seen: none in the last {WORKER_SEEN_WINDOW:.0f} s has that version"
        caption = note if caption is None else f"{caption}; {note}"
    out.table(
        (
            "id",
            "workflow",
            "status",
            "singleton",
            "slot",
            "created (UTC)",
            "updated (UTC)",
            "lease",
        ),
        rows,
        title=f"runs in {args.db}",
        caption=caption,
    )
    return 0


def _lists_children(store: Any) -> bool:
    """Whether ``store.list_runs`` takes ``parent_id`` (every bundled store does)."""
    try:
        return "parent_id" in inspect.signature(store.list_runs).parameters
    except (TypeError, ValueError):
        return False


async def _show(args: argparse.Namespace, out: Out, store: Any) -> int:
    run = await _get_run(store, args.run)
    out.line(
        (run.id, "bold"),
        f"  {run.workflow} v{run.workflow_version}  [",
        _status(run.status),
        "]",
    )
    out.line(f"  created {_fmt_time(run.created_at)}  updated {_fmt_time(run.updated_at)} (UTC)")
    now = args.clock.now()
    if run.status.active and run.lease_owner is not None:
        expired = _lease_expired(run, now)
        until = f" until {_fmt_time(run.lease_expires)}" if run.lease_expires is not None else ""
        left = (f" ({_lease_left(run, now)})", "bold red" if expired else "")
        out.line("  lease   ", (run.lease_owner, "bold"), until, left)
        if expired:
            out.line(
                "  ",
                (
                    f"lease expired: {run.lease_owner} is probably gone; any worker running "
                    f"{run.workflow} recovers the run at its next poll",
                    "bold red",
                ),
            )
    elif run.status is RunStatus.RUNNING:
        out.line(f"  lease   none: any worker running {run.workflow} claims it at its next poll")
    if run.id in await unserved(store, [run], now):
        out.line("  ", (no_worker_line(run), "bold red"))
    if run.wake_at is not None and run.status.active:
        out.line(f"  wakes   {_fmt_time(run.wake_at)}")
    if run.attempt > 1:
        out.line(f"  attempt {run.attempt}")
    if run.deadline_at is not None and run.status.active:
        out.line(f"  deadline {_fmt_time(run.deadline_at)} (execution_timeout)")
    if run.recoveries:
        out.line(f"  recovered {run.recoveries} times (activations lost: their worker died)")
    for line in await chain_lines(store, run):
        out.line(line)
    if run.singleton_key is not None:
        lane = (await _lanes(store, [run])).get(run.id, "")
        out.line(f"  singleton {run.singleton_key}" + (f": {lane}" if lane else ""))
    signals = [n for n in run.waiting_signals if not n.startswith(CHILD_WAKE)]
    if signals and run.status.active:
        out.line(f"  waits for signal {', '.join(signals)}")
    if run.parent_id is not None:
        out.line(f"  parent  {run.parent_id}")
    kids = await store.list_runs(parent_id=run.id) if _lists_children(store) else []
    for kid in kids:
        out.line(
            f"  child   {kid.id}  {kid.workflow} v{kid.workflow_version}  [",
            _status(kid.status),
            "]",
        )
    tags = [t for t in run.tags if not t.startswith("flowkit:") and t != run.singleton_tag]
    if tags:
        out.line(f"  tags    {', '.join(tags)}")
    if run.search:
        out.line(f"  search  {_cli_search.shown(run.search)}")
    out.line(f"  input   {_value(run.input, None)}")
    marker = await _plain_marker(store)
    if marker is not None:
        out.line(f"  payloads encrypted ({marker}): pass --codec-keys FILE to read them")
    if run.status is RunStatus.COMPLETED:
        out.line(f"  output  {_value(run.output, None)}")
    if run.error:
        message = run.error.get("message")
        text = f"{run.error.get('type')}: {encrypted(message) or message}"
        if out.rich:  # a multi-line message (a ValidationError) under its first line
            text = text.replace("\r\n", "\n").replace("\n", "\n" + " " * len("  error   "))
        out.line("  error   ", (text, "red"))
    return 0


async def _history(args: argparse.Namespace, out: Out, store: Any) -> int:
    run = await _get_run(store, args.run)
    hist = History(run.id, await store.load_events(run.id))
    if args.json:
        sys.stdout.write(hist.to_json() + "\n")
        return 0
    t0 = hist[0].at if len(hist) else 0.0
    rows = [
        (
            str(ev.seq),
            f"+{ev.at - t0:.3f}s",
            getattr(ev, "pos", None) or "",
            (ev.type, EVENT_STYLE.get(ev.type, "")),
            _describe(ev, t0),
        )
        for ev in hist
    ]
    out.table(
        ("seq", "at", "pos", "event", "detail"),
        rows,
        title=f"history of {run.id} ({run.workflow}), started {_fmt_time(t0)} UTC",
        caption=f"{len(hist)} events, {run.status}",
    )
    return 0


def _load_workflow(spec: str) -> Any:
    obj = import_attr(spec, "--workflow takes module:Class")
    try:
        defn = definition_of(obj)
    except TypeError as exc:  # an annotation of run() that cannot be resolved
        raise CliError(f"{spec}: {exc}") from None
    if defn is None:
        raise CliError(f"{spec} is not a @workflow class or instance")
    return obj


def _report_lines(exc: NonDeterminismError) -> list[str]:
    """``exc.report()`` as its lines: the message as one line even when it holds newlines (a
    body that now fails with a ``ValidationError``), then the recorded events around it."""
    message = str(exc)
    report = exc.report()
    if not report.startswith(message):  # pragma: no cover - report() starts with the message
        return report.split("\n")
    return [message, *report[len(message) :].split("\n")[1:]]


def _result_lines(r: ReplayResult) -> tuple[str, list[str]]:
    """One ``replay_dir`` result: its line, and the indented report of a divergence."""
    text = r.describe()
    if isinstance(r.error, NonDeterminismError) and r.status == "diverged":
        body = "\n".join("    " + line for line in r.error.report().splitlines())
        if text.endswith("\n" + body):
            return text[: -len(body) - 1], ["    " + line for line in _report_lines(r.error)]
    first, *rest = text.split("\n")
    return first, rest


async def _replay(args: argparse.Namespace, out: Out, store: Any) -> int:
    path = Path(args.path)
    workflows: list[Any] = args.workflows
    if path.is_dir():
        report = await replay_dir_async(path, workflows)
        if not report.results:
            raise CliError(f"no *.json histories in {path}")
        for r in report.results:
            label = {"ok": ("ok", "green"), "diverged": ("diverged", "red")}.get(
                r.status, ("error", "bold red")
            )
            first, rest = _result_lines(r)
            out.line(label, first[len(r.status) :])
            for line in rest:
                out.line(line)
        out.line(report.summary().split("\n")[0])
        return 0 if report.passed else 1
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    hist = History.from_json(raw)
    by_name: dict[str, dict[str, Any]] = {}
    for w in workflows:
        if (d := definition_of(w)) is not None:
            by_name.setdefault(d.name, {}).setdefault(d.version, w)
    versions = by_name.get(hist.workflow or "")
    # (the history's own version; one it lacks is a VersionMismatchError, exit 2)
    wf = workflows[0] if versions is None else pick_version(hist, versions)
    try:
        await replay_async(hist, wf)
    except NonDeterminismError as exc:
        first, *rest = _report_lines(exc)
        out.line(("diverged", "red"), f": {first}")
        for line in rest:
            out.line(line)
        return 1
    took = "".join(f", patch {p!r}" for p in patches_taken(hist))
    out.line(("ok", "green"), f": {len(hist)} events of {hist.run_id!r} replay{took}")
    return 0


async def _cancel(args: argparse.Namespace, out: Out, store: Any) -> int:
    before = await _get_run(store, args.run)
    if before.status.terminal:
        out.line(f"run {before.id!r} is already {before.status}: nothing to cancel")
        return 0
    if before.status is RunStatus.CANCELLING:
        out.line(f"run {before.id!r} is already cancelling: a worker delivers it to the body")
        return 0
    run = await Engine(store, worker=False).cancel(before.id)
    if run.status is RunStatus.CANCELLED:
        out.line(("cancelled", "magenta"), f" {run.id}")
    elif run.status is RunStatus.CANCELLING:
        out.line(
            ("cancellation requested", "magenta"),
            f": {run.id} is cancelling; a worker delivers it to the running body",
        )
    else:  # settled some other way meanwhile
        out.line(f"run {run.id!r} is {run.status}")
    return 0


def _payload(raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        hint = " (a string needs JSON quotes: '\"text\"')" if raw[:1].isalpha() else ""
        raise CliError(
            f"signal payload is not valid JSON: {exc.msg} at column {exc.colno}{hint}"
        ) from None


async def _signal(args: argparse.Namespace, out: Out, store: Any) -> int:
    payload = args.payload_value
    # (a run that continued as new passes it on to the last run of its chain: named here)
    before = await chain_end(store, await _get_run(store, args.run))
    await Engine(store, worker=False).signal(before.id, args.name, payload)
    waiting = args.name in before.waiting_signals
    out.line(
        ("delivered", "green"),
        f" signal {args.name!r} to {before.id} ("
        + ("it was waiting for it)" if waiting else f"{before.status}; buffered until it waits)"),
    )
    return 0


async def _demo(args: argparse.Namespace, out: Out, store: Any) -> int:
    root = Path(__file__).resolve().parents[2] / "samples" / "demo.py"
    if not root.exists():
        raise CliError("the demo ships with the source tree (samples/demo.py)")
    proc = await asyncio.create_subprocess_exec(sys.executable, str(root), *args.rest)
    return await proc.wait()


Command = Callable[[argparse.Namespace, Out, Any], Coroutine[Any, Any, int]]
# name -> (handler, needs the store)
COMMANDS: dict[str, tuple[Command, bool]] = {
    "runs": (_runs, True),
    "show": (_show, True),
    "history": (_history, True),
    "replay": (_replay, False),
    "cancel": (_cancel, True),
    "signal": (_signal, True),
    "demo": (_demo, False),
    "schedules": (schedules, True),
    "prune": (_cli_search.prune, True),
    "worker": (_cli_worker.worker, False),  # (it opens its store itself: SqlStore(--db))
    "retry": (_cli_worker.retry, True),
    "ui": (_cli_ui.ui, True),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flowkit", description="Inspect, replay and steer flowkit runs."
    )
    p.add_argument(
        "--db",
        default=os.environ.get("FLOWKIT_DB", DEFAULT_DB),
        help=f"store URL (default: $FLOWKIT_DB, else {DEFAULT_DB})",
    )
    p.add_argument(
        "--codec-keys",
        metavar="FILE",
        default=os.environ.get("FLOWKIT_CODEC_KEYS") or None,
        help="a store written through CodecStore(AESGCMCodec(keys)): a JSON file of key id -> "
        "base64 key, oldest first; payloads are decrypted to print and signals encrypted "
        "(default: $FLOWKIT_CODEC_KEYS)",
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    r = sub.add_parser("runs", help="list runs (the most recent, oldest first)")
    r.add_argument("--workflow", help="only runs of this workflow")
    r.add_argument("--status", choices=[s.value for s in RunStatus])
    r.add_argument("--tag", help="only runs carrying this tag")
    r.add_argument("--limit", type=int, default=50, help="the N most recent (0: all; default 50)")
    r.add_argument(
        "--search",
        action="append",
        metavar="KEY=VALUE",
        help="only runs with this search attribute (repeat: all of them; also !=, <, <=, >, >=)",
    )
    s = sub.add_parser("show", help="one run's state, input, output or error")
    s.add_argument("run")
    h = sub.add_parser("history", help="a run's events as a timeline")
    h.add_argument("run")
    h.add_argument("--json", action="store_true", help="print exactly History.to_json()")
    rp = sub.add_parser("replay", help="replay a history file (or a directory of them)")
    rp.add_argument("path", metavar="FILE", help="a History.to_json() file, or a directory")
    rp.add_argument(
        "--workflow",
        required=True,
        action="append",
        help="module:Class or module:instance (repeat for a directory of several workflows)",
    )
    c = sub.add_parser("cancel", help="cancel a run")
    c.add_argument("run")
    sg = sub.add_parser("signal", help="send a signal to a run")
    sg.add_argument("run")
    sg.add_argument("name")
    sg.add_argument("payload", nargs="?", metavar="JSON", help="the payload (default null)")
    sub.add_parser("schedules", help="list durable schedules with their next fire time")
    _cli_search.add_prune_parser(sub)
    _cli_worker.add_parsers(sub)
    _cli_ui.add_parser(sub)
    d = sub.add_parser("demo", help="the live demo of singleton lanes")
    d.add_argument("rest", nargs=argparse.REMAINDER)
    return p


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, CliError | FlowkitError):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _load_codec(path: str) -> Any:
    """The ``AESGCMCodec`` of a key file: a JSON object mapping key ids to base64 AES keys
    (16, 24 or 32 bytes), oldest first, as the application's ``AESGCMCodec(keys)`` has them."""
    import base64
    import binascii

    from ..stores.codec import AESGCMCodec

    try:
        raw = Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read the codec key file {path}: {exc.strerror}") from None
    try:
        data = json.loads(raw)
    except ValueError:
        raise CliError(f"the codec key file {path} is not JSON") from None
    if not isinstance(data, dict) or not data:
        raise CliError(f"the codec key file {path} must hold a JSON object of key id -> base64 key")
    keys: list[tuple[str, bytes]] = []
    for kid, text in data.items():
        try:
            keys.append((kid, base64.b64decode(str(text), validate=True)))
        except (binascii.Error, ValueError):
            raise CliError(f"key {kid!r} in {path} is not base64") from None
    try:
        return AESGCMCodec(keys)
    except (ValueError, TypeError) as exc:
        raise CliError(f"the codec key file {path}: {exc}") from None


def _prepare(args: argparse.Namespace) -> None:
    """Checks and imports that need no database, done before the event loop starts (a user's
    module may run its own event loop when imported)."""
    args.codec = _load_codec(args.codec_keys) if args.codec_keys else None
    args.clock = SystemClock()  # the workers' clock: lease expiry is compared against it
    if args.cmd == "runs" and args.limit < 0:
        raise CliError(f"--limit takes a count >= 0 (0: all runs), got {args.limit}")
    if args.cmd == "runs":
        args.search_terms = _cli_search.search_terms(args.search)
    if args.cmd == "prune":
        _cli_search.duration(args.older_than)  # (a bad one fails before the store opens)
    if args.cmd == "ui":
        _cli_ui.prepare(args)
    if args.cmd in ("worker", "retry"):
        _cli_worker.prepare(args)
    if args.cmd == "signal":
        args.payload_value = _payload(args.payload)  # bad JSON fails before the store opens
    if args.cmd == "replay":
        args.workflows = [_load_workflow(spec) for spec in args.workflow]


async def _dispatch(args: argparse.Namespace, out: Out) -> int:
    handler, needs_store = COMMANDS[args.cmd]
    store = _open_store(args.db) if needs_store else None
    if store is not None and args.codec is not None:
        from ..stores.codec import CodecStore

        store = CodecStore(store, args.codec)
    try:
        return await handler(args, out, store)
    finally:
        if store is not None:
            store.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Out(Console())
    # (a worker catches SIGTERM/SIGINT first thing: one that comes while it starts stops it
    # cleanly, exit 0, instead of killing it)
    if args.cmd != "worker":
        release_stop_signals()
    caught = catch_stop_signals() if args.cmd == "worker" else contextlib.nullcontext()
    try:
        with caught:
            _prepare(args)
            return asyncio.run(_dispatch(args, out))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if os.environ.get("FLOWKIT_DEBUG") and not isinstance(exc, CliError):
            raise
        sys.stdout.flush()
        sys.stderr.write(f"flowkit: error: {_one_line(exc)}\n")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
