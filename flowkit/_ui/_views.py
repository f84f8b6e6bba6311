"""The dashboard's reads: each page's template context, built from ``flowkit._browse`` (runs
newest first, counts, lanes) and the store's ``get_run`` / ``load_events`` /
``list_runs(parent_id=...)``. A filter that does not parse becomes the page's error message,
not an exception."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote as _quote
from urllib.parse import urlencode

from .. import _browse, _retry
from .._cli_common import CliError
from .._cli_search import search_terms
from .._run import Run, RunStatus
from ..errors import FlowkitError
from ..events import event_to_json
from ._fmt import compact, offset, pretty

__all__ = [
    "Filters",
    "lane_context",
    "lanes_context",
    "quote",
    "run_context",
    "runs_context",
]

MAX_LIMIT = 500
COUNT_LIMIT = _browse.COUNT_LIMIT  # (more runs of a status show as ``10000+``)
DEFAULT_LIMIT = 50


@dataclass
class Filters:
    """The runs page's query: what the form shows back, and the parsed values."""

    workflow: str = ""
    status: str = ""
    tag: str = ""
    search: str = ""
    before: str = ""
    limit: int = DEFAULT_LIMIT

    def query(self, **changes: Any) -> str:
        """``/runs`` with these filters (``changes`` applied; empty values dropped)."""
        values = {
            "workflow": self.workflow,
            "status": self.status,
            "tag": self.tag,
            "search": self.search,
            "before": self.before,
            "limit": "" if self.limit == DEFAULT_LIMIT else str(self.limit),
        }
        values.update({k: str(v) for k, v in changes.items()})
        kept = [(k, v) for k, v in values.items() if v]
        return "/runs" + ("?" + urlencode(kept) if kept else "")


def quote(segment: str) -> str:
    """A path segment (a run id, a workflow, a key) as it goes into a URL."""
    return _quote(segment, safe="")


def _filters(params: Any) -> tuple[Filters, list[str]]:
    f = Filters(
        workflow=params.get("workflow", "").strip(),
        status=params.get("status", "").strip(),
        tag=params.get("tag", "").strip(),
        search=params.get("search", "").strip(),
        before=params.get("before", "").strip(),
    )
    errors = []
    raw_limit = params.get("limit", "").strip()
    if raw_limit:
        try:
            f.limit = int(raw_limit)
            if not 1 <= f.limit <= MAX_LIMIT:
                raise ValueError
        except ValueError:
            errors.append(f"limit takes a count from 1 to {MAX_LIMIT}, got {raw_limit!r}")
            f.limit = DEFAULT_LIMIT
    return f, errors


def _before(text: str) -> tuple[float, str]:
    stamp, sep, run_id = text.partition(":")
    if not sep or not run_id:
        raise ValueError
    at = float(stamp)
    if not math.isfinite(at):  # (NaN orders differently in each database: refuse it)
        raise ValueError
    return at, run_id


async def runs_context(store: Any, params: Any) -> dict[str, Any]:
    """The runs page: one page of runs newest first, the counts per status, the paging links."""
    f, errors = _filters(params)
    status: RunStatus | None = None
    if f.status:
        try:
            status = RunStatus(f.status)
        except ValueError:
            errors.append(f"unknown status {f.status!r}")
    terms: tuple[Any, ...] = ()
    if f.search:
        try:
            terms = search_terms([t.strip() for t in f.search.split(",") if t.strip()])
        except CliError as exc:
            errors.append(f"search: {exc}")
    before = None
    if f.before:
        try:
            before = _before(f.before)
        except ValueError:
            errors.append(f"before takes <created_at>:<run id>, got {f.before!r}")
    runs: list[Run] = []
    counts = dict.fromkeys(RunStatus, 0)
    more = False
    if not errors:
        common: dict[str, Any] = {"workflow": f.workflow or None, "tag": f.tag or None}
        if terms:
            common["search"] = terms
        try:
            got = await _browse.page_runs(
                store, status=status, before=before, limit=f.limit + 1, **common
            )
            counts = await _browse.count_runs(store, limit=COUNT_LIMIT, **common)
        except FlowkitError as exc:
            errors.append(" ".join(str(exc).split()))
        else:
            more = len(got) > f.limit
            runs = got[: f.limit]
    last = runs[-1] if runs else None
    return {
        "page": "runs",
        "filters": f,
        "statuses": list(RunStatus),
        "errors": errors,
        "runs": runs,
        "counts": [
            (s, _shown(counts.get(s, 0)), f.query(status=s.value, before="")) for s in RunStatus
        ],
        "total": _total(counts.values()),
        "total_url": f.query(status="", before=""),
        "next_url": f.query(before=f"{last.created_at!r}:{last.id}") if more and last else None,
        "first_url": f.query(before="") if f.before else None,
        "workflows": sorted({r.workflow for r in runs}),
    }


def _shown(n: int) -> int | str:
    """A count of one status as the runs page shows it: ``10000+`` past ``COUNT_LIMIT``."""
    return f"{COUNT_LIMIT}+" if n > COUNT_LIMIT else n


def _total(counts: Iterable[int]) -> int | str:
    """The sum of the counts per status, ``+`` after it when one of them was cut."""
    counts = list(counts)
    total = sum(min(n, COUNT_LIMIT) for n in counts)
    return f"{total}+" if any(n > COUNT_LIMIT for n in counts) else total


@dataclass
class Member:
    """One run of a lane as listed: its role and its position (0: holder, 1..n: waiter)."""

    run: Run
    role: str
    position: int


def _members(lane: _browse.Lane) -> list[Member]:
    out = [Member(r, "holder", 0) for r in lane.holders]
    out += [Member(r, "waiter", i + 1) for i, r in enumerate(lane.waiters)]
    return out


async def run_context(store: Any, run: Run) -> dict[str, Any]:
    """A run's page: its state and payloads, history timeline, lane, parent and children."""
    events = await store.load_events(run.id)
    first = events[0].at if events else 0.0
    timeline = []
    for e in events:
        body = event_to_json(e)
        for k in ("seq", "type", "at"):
            body.pop(k, None)
        timeline.append(
            {
                "seq": e.seq,
                "type": e.type,
                "at": e.at,
                "offset": offset(e.at - first),
                "body": compact(body) if body else "",
            }
        )
    children = await store.list_runs(parent_id=run.id)
    lane = None
    if run.singleton_key is not None:
        lane = await _browse.lane(store, run.workflow, run.singleton_key)
    return {
        "page": "run",
        "run": run,
        "input": pretty(run.input),
        "output": None if run.output is None else pretty(run.output),
        "error": None if run.error is None else pretty(run.error),
        "error_line": _error_line(run.error),
        "tags": [t for t in run.tags if not t.startswith("flowkit:")],
        "search": sorted(run.search.items()),
        "timeline": timeline,
        "children": children,
        "lane": lane,
        "members": _members(lane) if lane is not None else [],
        # (no Retry for a run whose compensations ran: ``engine.retry`` refuses it)
        "retry_refused": (
            _retry.retry_refusal(run, events) if _retry.compensations_ran(events) else None
        ),
    }


def _error_line(error: Any) -> str | None:
    """A stored error's headline: ``ValueError: message`` (and the step that raised it)."""
    if not isinstance(error, dict):
        return None
    head = f"{error.get('type') or 'Error'}: {error.get('message') or ''}".strip()
    if error.get("step"):
        head += f" (step {error['step']})"
    return head


async def lanes_context(store: Any) -> dict[str, Any]:
    """The lanes page: every singleton lane with active runs."""
    return {"page": "lanes", "lanes": await _browse.lanes(store)}


async def lane_context(store: Any, workflow: str, key: str) -> dict[str, Any]:
    """One lane in full: holders then waiters in FIFO order."""
    lane = await _browse.lane(store, workflow, key)
    return {"page": "lanes", "lane": lane, "members": _members(lane), "run": None}
