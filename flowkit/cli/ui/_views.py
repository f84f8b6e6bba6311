"""The dashboard's reads: each page's template context, built from ``flowkit._client.browse`` (runs
newest first, counts, lanes, a page of a run's history) and the store's ``get_run`` /
``list_runs(parent_id=..., after=...)``; every page is bounded (a run's timeline and children
are paged). A filter that does not parse becomes the page's error message, not an
exception."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote as _quote
from urllib.parse import urlencode

from ..._client import browse as _browse
from ..._client import retry as _retry
from ..._client import schemas as _schemas
from ..._core.run import Run, RunStatus
from ...errors import FlowkitError
from ...events import Event, event_to_json
from ...stores.base import lists_by_search
from .._common import CliError
from .._search import search_terms
from ._fmt import event_fields, offset, pretty

__all__ = [
    "EVENT_PAGE",
    "Filters",
    "LaneLimits",
    "RunQuery",
    "allowed_actions",
    "compensation_events",
    "lane_context",
    "lane_limits",
    "lanes_context",
    "queue_full",
    "quote",
    "run_context",
    "run_query",
    "runs_context",
    "state_context",
    "timeline_items",
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


EVENT_PAGE = 100
"""Events on one page of a run's timeline (the newest by default; ``?before=``/``?after=``)."""
CHILDREN_PAGE = 50
"""Children listed on one page of a run (``?children_after=``)."""
PUBLISHED_SCAN = 200
"""How many of a run's newest ``ctx.set_event`` records its page reads for the published
values."""
COMPENSATION_TYPES = ("compensation_completed", "compensation_failed")


@dataclass
class RunQuery:
    """A run page's query: which page of the timeline and of the children."""

    before: int | None = None
    after: int | None = None
    children_after: tuple[float, str] | None = None
    children_after_text: str = ""


def _seq(params: Any, name: str, errors: list[str]) -> int | None:
    raw = str(params.get(name, "")).strip()
    if not raw:
        return None
    if not raw.isdigit() or len(raw) > 15:
        errors.append(f"{name} takes an event's sequence number, got {raw!r}")
        return None
    return int(raw)


def run_query(params: Any) -> tuple[RunQuery, list[str]]:
    """The timeline and children paging of a run page (errors: what does not parse)."""
    errors: list[str] = []
    q = RunQuery(before=_seq(params, "before", errors), after=_seq(params, "after", errors))
    if q.before is not None and q.after is not None:
        errors.append("give before or after, not both")
        q.before = None
    raw = str(params.get("children_after", "")).strip()
    if raw:
        try:
            q.children_after = _before(raw)
            q.children_after_text = raw
        except ValueError:
            errors.append(f"children_after takes <created_at>:<run id>, got {raw!r}")
    return q, errors


def allowed_actions(run: Run, compensated: bool) -> list[str]:
    """The actions a run's status allows (docs/ui.md "Actions"): ``cancel`` an active run not
    already cancelling, ``retry`` a failed or dead run whose compensations did not run,
    ``signal`` an active run."""
    out = []
    if run.status.active and run.status is not RunStatus.CANCELLING:
        out.append("cancel")
    if run.status in (RunStatus.FAILED, RunStatus.DEAD) and not compensated:
        out.append("retry")
    if run.status.active:
        out.append("signal")
    return out


async def compensation_events(store: Any, run_id: str) -> list[Event]:
    """The run's compensation events (the newest 100): not empty when its compensations ran,
    so a retry would undo their effects twice (``engine.retry`` refuses it)."""
    page = await _browse.page_events(store, run_id, limit=100, types=COMPENSATION_TYPES)
    return list(page.events)


def timeline_items(events: Sequence[Event], since: float) -> list[dict[str, Any]]:
    """A timeline's rows: each event's seq, type, time, time since ``since`` (the run's
    creation) and readable fields."""
    out = []
    for e in events:
        out.append(
            {
                "seq": e.seq,
                "type": e.type,
                "at": e.at,
                "offset": offset(e.at - since),
                "fields": event_fields(event_to_json(e)),
            }
        )
    return out


@dataclass(frozen=True)
class LaneLimits:
    """A lane's limit and queue cap, from the workflow's code (``--app``) or from what its
    workers recorded in the store."""

    limit: int
    max_queue_depth: int | None


def lane_limits(definitions: Any, workflow: str, version: str | None) -> LaneLimits | None:
    """The singleton limits of ``workflow`` (at ``version`` when it is known, else its only or
    last registered version), when the dashboard has its code; ``None`` otherwise."""
    found = [d for d in definitions if d.name == workflow and d.singleton is not None]
    if version is not None:
        found = [d for d in found if d.version == version] or found
    if not found:
        return None
    sg = found[-1].singleton
    return LaneLimits(sg.limit, sg.max_queue_depth)


async def known_limits(
    store: Any,
    definitions: Any,
    workflow: str,
    version: str | None,
    namespace: str | None = None,
) -> LaneLimits | None:
    """A lane's limits: from the workflow's code (``--app``), else from what its workers
    recorded in the store (``None``: neither says)."""
    limits = lane_limits(definitions, workflow, version)
    if limits is None:
        got = await _schemas.recorded_singleton(store, workflow, version, namespace)
        if got is not None:
            limits = LaneLimits(*got)
    return limits


def queue_full(lane: _browse.Lane | _browse.LaneSummary, limits: LaneLimits | None) -> bool:
    """Whether the lane's queue is full: a new run of its key would be refused
    (``SingletonQueueFullError``)."""
    if limits is None or limits.max_queue_depth is None:
        return False
    holders = lane.holders if isinstance(lane.holders, int) else len(lane.holders)
    return holders + lane.waiting >= limits.limit + limits.max_queue_depth


async def _children(store: Any, run: Run, q: RunQuery) -> tuple[list[Run], str | None]:
    """One page of the run's children, oldest first, and the link to the next page."""
    if lists_by_search(store):
        got = await store.list_runs(
            parent_id=run.id, after=q.children_after, limit=CHILDREN_PAGE + 1
        )
    else:
        got = await store.list_runs(parent_id=run.id)
        if q.children_after is not None:
            got = [c for c in got if (c.created_at, c.id) > q.children_after]
        got = got[: CHILDREN_PAGE + 1]
    more = len(got) > CHILDREN_PAGE
    kids = got[:CHILDREN_PAGE]
    nxt = None
    if more and kids:
        last = kids[-1]
        nxt = f"/runs/{quote(run.id)}?children_after={_quote(f'{last.created_at!r}:{last.id}')}"
    return kids, nxt


async def _published(store: Any, run_id: str) -> list[dict[str, Any]]:
    """The run's published values (``ctx.set_event``): the latest of each key, newest first."""
    page = await _browse.page_events(store, run_id, limit=PUBLISHED_SCAN, types=("event_set",))
    latest: dict[str, Any] = {}
    for e in reversed(page.events):
        key = getattr(e, "key", None)
        if isinstance(key, str) and key not in latest:
            latest[key] = e
    return [
        {"key": k, "value": pretty(getattr(e, "value", None)), "at": e.at, "seq": e.seq}
        for k, e in latest.items()
    ]


async def state_context(store: Any, run: Run, q: RunQuery, definitions: Any = ()) -> dict[str, Any]:
    """The live part of a run's page: its state, payloads, published values, lane and
    children (one page), and the actions its status allows."""
    children, children_next = await _children(store, run, q)
    lane = None
    if run.singleton_key is not None:
        lane = await _browse.lane(store, run.workflow, run.singleton_key)
    limits = await known_limits(
        store, definitions, run.workflow, run.workflow_version, run.namespace
    )
    comp_events = await compensation_events(store, run.id)
    comp = bool(comp_events)
    return {
        "run": run,
        "input": pretty(run.input),
        "output": None if run.output is None else pretty(run.output),
        "error": None if run.error is None else pretty(run.error),
        "error_line": _error_line(run.error),
        "tags": [t for t in run.tags if not t.startswith("flowkit:")],
        "search": sorted(run.search.items()),
        "published": await _published(store, run.id),
        "children": children,
        "children_next": children_next,
        "children_first": f"/runs/{quote(run.id)}" if q.children_after is not None else None,
        "lane": lane,
        "limits": limits,
        "queue_full": lane is not None and queue_full(lane, limits),
        "members": _members(lane) if lane is not None else [],
        "compensated": comp,
        # (why no Retry: ``engine.retry`` refuses a run whose compensations ran)
        "retry_refused": _retry.retry_refusal(run, comp_events) if comp else None,
        "actions": allowed_actions(run, comp),
    }


async def run_context(
    store: Any, run: Run, params: Any = None, definitions: Any = ()
) -> dict[str, Any]:
    """A run's page: its live state (``state_context``) and one page of its history
    timeline (the newest ``EVENT_PAGE`` events unless ``?before=``/``?after=`` say
    otherwise), with the links to the pages around it."""
    q, errors = run_query(params or {})
    page = await _browse.page_events(
        store, run.id, after=q.after, before=q.before, limit=EVENT_PAGE
    )
    evs = page.events
    first, last = page.first_seq, page.last_seq
    at_end = not evs or evs[-1].seq == last
    at_start = not evs or evs[0].seq == first
    base = f"/runs/{quote(run.id)}"
    follow = at_end and q.before is None
    ctx = await state_context(store, run, q, definitions)
    ctx.update(
        {
            "page": "run",
            "errors": errors,
            "timeline": timeline_items(evs, run.created_at),
            "event_count": page.count,
            "follow": follow,
            "last_seq": evs[-1].seq if evs else 0,
            "earlier_url": None if at_start else f"{base}?before={evs[0].seq}",
            "first_url": None if at_start else f"{base}?after=0",
            "later_url": None if at_end else f"{base}?after={evs[-1].seq}",
            "newest_url": None if follow else base,
            "children_after": q.children_after_text,
        }
    )
    return ctx


def _error_line(error: Any) -> str | None:
    """A stored error's headline: ``ValueError: message`` (and the step that raised it)."""
    if not isinstance(error, dict):
        return None
    head = f"{error.get('type') or 'Error'}: {error.get('message') or ''}".strip()
    if error.get("step"):
        head += f" (step {error['step']})"
    return head


async def lanes_context(store: Any, definitions: Any = ()) -> dict[str, Any]:
    """The lanes page: every singleton lane with active runs, with its limit and whether its
    queue is full when the dashboard has the workflow's code."""
    rows = []
    for lane in await _browse.lanes(store):
        limits = await known_limits(store, definitions, lane.workflow, None)
        rows.append({"lane": lane, "limits": limits, "full": queue_full(lane, limits)})
    return {"page": "lanes", "lanes": rows}


async def lane_context(
    store: Any, workflow: str, key: str, definitions: Any = ()
) -> dict[str, Any]:
    """One lane in full: holders then waiters in FIFO order, its limit and queue cap."""
    lane = await _browse.lane(store, workflow, key)
    members = [*lane.holders, *lane.waiters]
    version = members[0].workflow_version if members else None
    namespace = members[0].namespace if members else None
    limits = await known_limits(store, definitions, workflow, version, namespace)
    return {
        "page": "lanes",
        "lane": lane,
        "members": _members(lane),
        "run": None,
        "limits": limits,
        "queue_full": queue_full(lane, limits),
    }
