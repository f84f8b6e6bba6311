"""How the ``flowkit`` command prints: rich in a terminal, plain and one line per row when
piped (control characters escaped), and the readable timeline of a run's events."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .._core import serde as _serde
from .._core.limits import MAX_TIMESTAMP, MIN_TIMESTAMP
from .._core.run import Run, RunStatus
from .._core.telemetry import trace_of
from .._worker.continue_as_new import predecessor_id
from .._worker.worker import WORKER_SEEN_WINDOW, no_live_worker
from ..events import (
    CancelRequested,
    ChildCompleted,
    ChildFailed,
    ChildStarted,
    CompensationCompleted,
    CompensationFailed,
    Event,
    EventReceived,
    EventSet,
    PatchMarker,
    RunCompleted,
    RunContinued,
    RunDead,
    RunFailed,
    RunRetried,
    RunStarted,
    SearchUpserted,
    SignalReceived,
    SingletonAdmitted,
    SingletonGated,
    SingletonReleased,
    StepCompleted,
    StepFailed,
    TimerStarted,
    UpdateReceived,
    UpdateReplied,
)

VALUE_WIDTH = 80
"""Values (inputs, results, payloads) longer than this are cut in the timeline; ``--json``
prints them whole."""

STATUS_STYLE = {
    RunStatus.PENDING: "cyan",
    RunStatus.RUNNING: "blue",
    RunStatus.SUSPENDED: "cyan",
    RunStatus.BLOCKED: "bold yellow",
    RunStatus.CANCELLING: "yellow",
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "bold red",
    RunStatus.CANCELLED: "magenta",
    RunStatus.DEAD: "bold red reverse",
}


def _control_escapes() -> dict[int, str]:
    """Every character that ends or rewrites a line on a terminal or in ``str.splitlines``
    (C0 and C1 controls, DEL, the Unicode line and paragraph separators), as an escape."""
    table = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
    table.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"})
    return table


_ESCAPES = _control_escapes()
_ESCAPES_BUT_NEWLINE = {c: e for c, e in _ESCAPES.items() if c != 0x0A}


def _escape(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` on one line: newlines, tabs and other control characters as ``\\n``, ``\\t``,
    ``\\xNN`` (a pydantic ``ValidationError`` or a traceback in an error message, a newline in
    a run id or a key). ``keep_newlines`` keeps ``\\n`` (rich output lays them out itself)."""
    if keep_newlines:
        return text.replace("\r\n", "\n").translate(_ESCAPES_BUT_NEWLINE)
    return text.translate(_ESCAPES)


# -- output ----------------------------------------------------------------------------------


class Out:
    """Rich output in a terminal; plain, unwrapped text when stdout is a pipe or a file."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.rich = console.is_terminal

    def line(self, *parts: str | tuple[str, str]) -> None:
        """One line; a ``(text, style)`` part is styled in a terminal. Never parses markup.
        Piped, a newline inside a part is escaped, so that the line stays one line."""
        if self.rich:
            self.console.print(
                Text.assemble(*(_rich_part(p, keep_newlines=True) for p in parts)),
                highlight=False,
            )
        else:
            text = "".join(p if isinstance(p, str) else p[0] for p in parts)
            self.console.out(_escape(text), highlight=False)  # no markup, emoji or wrapping

    def table(
        self,
        columns: Sequence[str],
        rows: Sequence[Sequence[str | tuple[str, str]]],
        *,
        title: str | None = None,
        caption: str | None = None,
    ) -> None:
        """A table in a terminal; piped, a header line and exactly one whitespace-aligned line
        per row, newlines inside a cell escaped (no title, no caption: the output stays easy to
        grep and cut)."""
        if self.rich:
            table = Table(title=title, caption=caption, header_style="bold")
            for col in columns:
                table.add_column(col, overflow="fold")
            for row in rows:
                table.add_row(*(Text(*_rich_part(c, keep_newlines=True)) for c in row))
            self.console.print(table)
            return
        cells = [list(columns)] + [
            [_escape(c if isinstance(c, str) else c[0]) or "-" for c in row] for row in rows
        ]
        widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
        for r in cells:
            text = "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            self.console.out(text, highlight=False)


def _rich_part(part: str | tuple[str, str], *, keep_newlines: bool) -> tuple[str, str]:
    """A ``(text, style)`` part with its control characters escaped (a stored value must not
    move the cursor or change the terminal's colours)."""
    text, style = (part, "") if isinstance(part, str) else part
    return (_escape(text, keep_newlines=keep_newlines), style)


def _status(status: RunStatus) -> tuple[str, str]:
    return (str(status), STATUS_STYLE.get(status, ""))


def _fmt_time(t: float | None) -> str:
    """An instant as ``2026-01-01 12:00:00.000`` (UTC); ``never`` from ``MAX_TIMESTAMP`` on
    (an infinite one an older flowkit stored included), its number when out of range."""
    if t is None:
        return "-"
    if t >= MAX_TIMESTAMP:
        return "never"
    if not t >= MIN_TIMESTAMP:
        return f"{t!r} (out of range)"
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def encrypted(value: Any) -> str | None:
    """How a value a ``CodecStore`` encoded is shown without its keys (``<encrypted aesgcm
    kid=k1>``), or ``None`` when ``value`` is not encoded. (The ``"$codec"`` envelope, or in a
    string field (error messages, digests) the ``"$codec:"`` prefix and the envelope.)"""
    if isinstance(value, str) and value.startswith("$codec:"):
        try:
            value = _serde.loads(value[len("$codec:") :])
        except Exception:
            return "<encrypted>"
    if isinstance(value, dict) and isinstance(value.get("$codec"), str) and "data" in value:
        kid = value.get("kid")
        return f"<encrypted {value['$codec']}" + (f" kid={kid}>" if isinstance(kid, str) else ">")
    return None


def _text(text: str | None) -> str | None:
    """A string field as shown: ``<encrypted ...>`` when a codec encoded it."""
    return encrypted(text) or text


def _value(value: Any, width: int | None = VALUE_WIDTH) -> str:
    return encrypted(value) or _cut(_serde.dumps(value).decode(), width)


def _cut(text: str, width: int | None = VALUE_WIDTH) -> str:
    if width is not None and len(text) > width:
        return text[: width - 1] + "…"
    return text


def _duration(seconds: float) -> str:
    """``12.3 s``, ``4 min 12 s``, ``3 h 5 min``, ``2 d 7 h``."""
    s = abs(seconds)
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"


def _lease_expired(run: Run, now: float) -> bool:
    """Whether an active run is leased to an instance that stopped renewing the lease: the
    worker that executes it is probably gone, and the next poll of any worker recovers it."""
    return run.status.active and run.lease_owner is not None and not run.leased(now)


def _lease_left(run: Run, now: float) -> str:
    """How long the lease still holds, or since when it does not: ``expires in 12.3 s``,
    ``expired 4.0 s ago``, against ``now``."""
    if run.lease_expires is None:
        return "no expiry"
    left = run.lease_expires - now
    return f"expires in {_duration(left)}" if left > 0 else f"expired {_duration(left)} ago"


def _lease(run: Run, now: float) -> str:
    """An active run's lease as ``owner (expires in ...)``; empty when nobody holds one."""
    if not run.status.active or run.lease_owner is None:
        return ""
    return f"{run.lease_owner} ({_lease_left(run, now)})"


async def unserved(store: Any, runs: Sequence[Run], now: float) -> set[str]:
    """The ids of the active runs among ``runs`` that no worker seen in the last
    ``WORKER_SEEN_WINDOW`` seconds can run (``no_live_worker``: a store that
    ``records_workers``; otherwise, or when the store cannot say, none: nothing is claimed
    that is not known)."""
    active = [r for r in runs if r.status.active]
    if not active:
        return set()
    try:
        missing = await no_live_worker(store, active, now)
    except Exception:
        return set()
    return missing or set()


def no_worker(run: Run) -> str:
    """The marker of an active run no live worker can run (``unserved``)."""
    return f"no worker with {run.workflow} v{run.workflow_version} seen"


def lease_cell(run: Run, now: float, missing: set[str]) -> tuple[str, str]:
    """The ``lease`` column: the lease, and the marker of a run no live worker can run."""
    lease = _lease(run, now)
    if run.status.active and run.id in missing:
        return ("; ".join(x for x in (lease, no_worker(run)) if x), "bold red")
    return (lease, "bold red" if _lease_expired(run, now) else "")


def no_worker_line(run: Run) -> str:
    """``flowkit show``'s explanation of that marker."""
    return (
        f"no worker with workflow {run.workflow!r} version {run.workflow_version!r} has been"
        f" seen in the last {WORKER_SEEN_WINDOW:.0f} s: the run waits (it is not failed) until"
        " a worker with that version runs"
    )


async def chain_lines(store: Any, run: Run) -> list[str]:
    """``flowkit show``'s lines on a continue-as-new chain: the run it continued from (its
    predecessor's ``continued_as`` names it) and the run it continued as."""
    lines = []
    prev = predecessor_id(run.id)
    if prev is not None:
        before = await store.get_run(prev)
        if before is not None and before.continued_as == run.id:
            lines.append(f"  continued from {_escape(prev)}")
    if run.continued_as is not None:
        lines.append(f"  continued as {_escape(run.continued_as)} (continue-as-new)")
    return lines


def _trace_id(ev: RunStarted) -> str | None:
    """The trace id of the trace context stored with a run (its W3C ``traceparent``), else
    the carrier; ``None`` without one."""
    carrier = trace_of([ev])
    if carrier is None:
        return None
    parts = carrier.get("traceparent", "").split("-")
    return parts[1] if len(parts) == 4 else json.dumps(carrier, sort_keys=True)


def _describe(ev: Event, t0: float) -> str:
    """The readable part of one event (the timeline's last column)."""
    match ev:
        case RunStarted():
            tags = [t for t in ev.tags if not t.startswith("flowkit:")]
            return (
                f"{ev.workflow} v{ev.version} input {_value(ev.input)}"
                + (f" tags {', '.join(tags)}" if tags else "")
                + (f" trace {_escape(trace)}" if (trace := _trace_id(ev)) else "")
            )
        case SingletonGated():
            again = f", re-check at +{ev.retry_at - t0:.3f}s" if ev.retry_at is not None else ""
            return f"key {ev.key}{again}"
        case SingletonAdmitted() | SingletonReleased():
            return f"key {ev.key}"
        case StepCompleted():
            digest = f" (args {_text(ev.args_digest)})" if ev.args_digest else ""
            return f"{ev.name}{digest} attempt {ev.attempt} -> {_value(ev.result)}"
        case StepFailed():
            digest = f" (args {_text(ev.args_digest)})" if ev.args_digest else ""
            then = f"; retry at +{ev.retry_at - t0:.3f}s" if ev.retry_at is not None else "; final"
            cancelled = " (cancelled)" if ev.cancelled else ""
            message = _cut(_escape(_text(ev.error.message) or ""))
            return f"{ev.name}{digest} attempt {ev.attempt} {ev.error.type}: {message}{then}" + (
                cancelled
            )
        case CompensationCompleted():
            what = f"{ev.name} undoes step {ev.step_pos} attempt {ev.attempt}"
            return f"{what} -> {_value(ev.result)}"
        case CompensationFailed():
            then = f"; retry at +{ev.retry_at - t0:.3f}s" if ev.retry_at is not None else "; final"
            message = _cut(_escape(_text(ev.error.message) or ""))
            return (
                f"{ev.name} undoes step {ev.step_pos} attempt {ev.attempt}"
                f" {ev.error.type}: {message}{then}"
            )
        case TimerStarted():
            if ev.fire_at >= MAX_TIMESTAMP:  # (a timer that never fires)
                return f"{ev.purpose.replace('_', ' ')} never fires"
            return f"{ev.purpose.replace('_', ' ')} until +{ev.fire_at - t0:.3f}s"
        case SignalReceived():
            return f"{ev.name} payload {_value(ev.payload)}"
        case EventReceived():
            return f"{ev.name} ({ev.event_id}) payload {_value(ev.payload)}"
        case RunCompleted():
            return f"output {_value(ev.output)}"
        case RunFailed():
            return f"{ev.error.type}: {_text(ev.error.message)}"
        case RunRetried():
            return f"attempt {ev.attempt}" + (
                f" with new input {_value(ev.input)}" if ev.new_input else ""
            )
        case CancelRequested() if ev.reason is not None or ev.compensate:
            why = f"reason {ev.reason.replace('_', ' ')}" if ev.reason is not None else ""
            return "; ".join(x for x in (why, "compensate" if ev.compensate else "") if x)
        case RunDead():
            why = f" {ev.error.type}: {_text(ev.error.message)}" if ev.error is not None else ""
            return f"activation lost {ev.recoveries} times;{why}"
        case PatchMarker():
            return f"took patch {ev.patch_id}"
        case EventSet():
            return f"{_escape(ev.key)} = {_value(ev.value)}"
        case UpdateReceived():
            return f"{_escape(ev.name)} ({ev.update_id}) arg {_value(ev.arg)}"
        case UpdateReplied():
            return f"{_escape(ev.name)} ({ev.update_id}) -> {_value(ev.value)}"
        case SearchUpserted():
            return "search " + ", ".join(f"{k}={_value(v)}" for k, v in ev.attrs.items())
        case RunContinued():
            return f"continued as {_escape(ev.next_run_id)} input {_value(ev.input)}"
        case ChildStarted():
            version = f" v{ev.version}" if ev.version else ""
            return f"{ev.run_id} ({ev.workflow}{version})"
        case ChildCompleted():
            return f"{ev.run_id} -> {_value(ev.output)}"
        case ChildFailed():
            never = " (never started)" if ev.error.cause_type == "start" else ""
            message = _cut(_escape(_text(ev.error.message) or ""))
            return f"{ev.run_id}{never} {ev.error.type}: {message}"
        case _:
            return ""


EVENT_STYLE = {
    "run_completed": "green",
    "run_continued": "green",
    "run_failed": "bold red",
    "step_failed": "red",
    "compensation_completed": "yellow",
    "compensation_failed": "red",
    "run_cancelled": "magenta",
    "run_dead": "bold red",
    "cancel_requested": "magenta",
    "signal_received": "cyan",
    "event_received": "cyan",
    "patch_marker": "yellow",
    "event_set": "blue",
    "update_received": "cyan",
    "update_replied": "green",
    "search_upserted": "cyan",
    "child_started": "cyan",
    "child_completed": "green",
    "child_failed": "red",
}
