"""Optional store capabilities, re-exported by ``flowkit.stores.base`` (the protocol's home)
and kept apart so that each module stays readable: ``ClaimsByVersion`` and ``RecordsWorkers``
(docs/writing-workflows.md, versions), those of docs/updates.md: ``LatestEvent`` (a run's newest
event of a kind, for ``get_event`` and ``update``), ``PublishesEvents`` (published events,
delivered or
buffered atomically) and ``PrunesRuns`` (retention), and those of the dashboard (docs/ui.md):
``BrowsesRuns`` (its reads, pushed down) and ``ChangeStamp`` (a cheap "anything written?")."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .._core.browse_types import EventPage, Lane, LaneSummary
from .._core.event_keys import TakenEvent
from .._core.run import Run, RunStatus
from .._core.search_terms import Term
from ..events import Event


def takes(fn: Any, keyword: str) -> bool:
    """Whether the callable ``fn`` accepts the keyword argument ``keyword``."""
    if fn is None:
        return False
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class PrunesRuns(Protocol):
    """The optional method ``prune_runs`` (``MemoryStore``, ``SqlStore``; ``CodecStore`` when
    the store it wraps has it): retention (``engine.prune``, ``Engine(retention=...)``)."""

    async def prune_runs(
        self,
        settled_before: float,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        limit: int = 500,
    ) -> int:
        """Delete at most ``limit`` visible terminal runs (of ``workflow``, of ``status``)
        whose ``updated_at`` is before ``settled_before``, with everything that belongs to
        them (events, inbox signals, search attributes and any other per-run data the store
        keeps), in one short transaction; how many it deleted (fewer than ``limit``: no
        more are left). Never an active run, nor the child of an active parent
        (``Run.parent_id``); a run that becomes active meanwhile is left alone."""
        ...


def prunes_runs(store: Any) -> bool:
    """Whether ``store`` has ``prune_runs`` (``PrunesRuns``)."""
    return callable(getattr(store, "prune_runs", None))


def lists_by_search(store: Any) -> bool:
    """Whether ``store.list_runs`` takes ``search`` and ``after`` (every bundled store)."""
    return takes(getattr(store, "list_runs", None), "search") and takes(
        getattr(store, "list_runs", None), "after"
    )


class LatestEvent(Protocol):
    """The optional ``latest_event`` method (``MemoryStore``, ``SqlStore``, ``CodecStore``):
    one event of a run found without loading its whole history. ``engine.get_event`` reads
    a run's newest ``event_set`` of a key with it, ``engine.update`` its reply; a store
    without it has the whole history loaded and searched instead (``_history_wait``)."""

    async def latest_event(self, run_id: str, type: str, field: str, value: str) -> Event | None:
        """The run's newest event (highest ``seq``) of ``type`` whose string field ``field``
        equals ``value``, with its ``seq``; ``None`` when there is none or no such run
        (visible to this store's namespace). One read; writes nothing."""
        ...


@dataclass(frozen=True)
class PublishedEvent:
    """What ``publish_event`` did with one event: ``delivered`` to these waiting runs (their
    ids, in waiting order), else ``buffered`` for the first later matching waiter; a
    ``duplicate`` (its ``event_id`` was published before) delivered and buffered nothing.
    ``started``: the runs ``Engine.publish_event`` started for ``@workflow(on_event=...)``
    (the store leaves it empty)."""

    event_id: str
    duplicate: bool = False
    delivered: tuple[str, ...] = ()
    buffered: bool = False
    started: tuple[str, ...] = ()


class PublishesEvents(Protocol):
    """The optional capability ``publishes_events`` (``MemoryStore``, ``SqlStore``;
    ``CodecStore`` when the store it wraps has it): published events (docs/events.md), delivered
    to waiting runs or buffered, atomically. Both methods are serialized per event ``name``
    (PostgreSQL: a transaction-scoped advisory lock; SQLite: its write lock), so a publish and
    a waiter registering cannot miss each other: the event is delivered or buffered, never
    lost in between.

    Matching: ``keys`` maps each top-level key of the payload to a digest of its value
    (``flowkit._client.publish.digests``); a waiter's ``match`` maps keys to digests; a waiter
    matches when every one of its ``match`` items is among ``keys``. Stores compare digests
    only, so a ``CodecStore`` payload stays opaque."""

    publishes_events: bool

    async def publish_event(
        self, name: str, payload: Any, event_id: str, keys: dict[str, str], now: float
    ) -> PublishedEvent:
        """Atomically: when ``event_id`` was published before in this namespace, nothing
        (``duplicate``). Else remember it; deliver the event to every registered waiter of
        ``name`` whose run is active and not cancelling and whose ``match`` matches (the
        waiter is removed, the run's inbox gets the signal ``event_mark(pos)``, and a run
        suspended waiting for it becomes due at ``now``); waiters of settled or cancelling runs
        are dropped. When none matched, buffer it (oldest first) for ``take_event``."""
        ...

    async def take_event(
        self,
        run_id: str,
        pos: str,
        name: str,
        match: dict[str, str],
        now: float,
        *,
        wait: bool = True,
    ) -> TakenEvent | None:
        """Atomically, for the wait at ``pos`` of ``run_id``: the event delivered to it, if
        any; else the oldest buffered event of ``name`` that ``match`` matches, taken out of
        the buffer and delivered to it; else ``None`` after registering the wait
        (``wait=True``) or removing its registration (``wait=False``: a timeout, exclusive
        with a delivery). Again after a crash, it answers the same event until the record of
        ``event_received`` consumes its mark. ``RunNotFoundError`` for an unknown run."""
        ...

    async def drop_event_wait(
        self, run_id: str, pos: str, name: str, now: float
    ) -> tuple[str, ...]:
        """Atomically (serialized with the calls above, per ``name``), for the wait at ``pos``
        of ``run_id``, abandoned without receiving (the run's cancellation left it): remove its
        registration; when an event was delivered to it and its mark is still in the run's
        inbox (not received), remove the mark and offer the event again as ``publish_event``
        would (no dedupe: its id stays published): to the registered waiters it matches, else
        to the buffer (as its newest event). The ids of the runs it reached. Nothing for a wait
        that is not registered, or whose event was received."""
        ...


def publishes_events(store: Any) -> bool:
    """Whether ``store`` has published events (``PublishesEvents``)."""
    return bool(getattr(store, "publishes_events", False))


class BrowsesRuns(Protocol):
    """The optional methods ``browse_runs``, ``count_runs``, ``lanes`` and ``lane``
    (``MemoryStore``, ``SqlStore``; ``CodecStore`` when the store it wraps has them): what
    the dashboard reads (``flowkit._client.browse``), each answered in one or two indexed queries
    instead of ``list_runs`` reading every run. A store without them still works there, slowly.
    Every method sees only this store's namespace and returns runs without payloads
    (``input``, ``output`` and ``error`` are ``None``, as ``list_runs`` returns them)."""

    async def browse_runs(
        self,
        *,
        workflow: str | None,
        status: RunStatus | None,
        tag: str | None,
        search: Sequence[Term],
        before: tuple[float, str] | None,
        limit: int,
    ) -> list[Run]:
        """Up to ``limit`` runs passing the filters (as ``list_runs``'), newest
        ``(created_at, id)`` first (ids by code point), strictly before ``before``. One
        query."""
        ...

    async def count_runs(
        self, *, workflow: str | None, tag: str | None, search: Sequence[Term], limit: int | None
    ) -> dict[RunStatus, int]:
        """How many runs passing the filters have each status (a status may be left out
        when none has it). One query. ``limit`` (optional: a store without the keyword is
        called without it): a status with more than ``limit`` runs counts ``limit + 1``, and
        the query's work is bounded by it (the dashboard counts every page view)."""
        ...

    async def lanes(self, *, limit: int) -> list[LaneSummary]:
        """Every ``(workflow, singleton_key)`` with active runs: ``holders`` its admitted
        active runs, ``waiting`` its other active runs, ``oldest_waiting_since`` the oldest
        waiter's ``created_at``; the longest queue first, then by workflow and key (code
        points); at most ``limit``."""
        ...

    async def lane(self, workflow: str, key: str, *, limit: int) -> Lane:
        """The lane ``key`` of ``workflow``: its holders (by ``(created_at, id)``), then up
        to ``limit`` waiters in FIFO ``(created_at, id)`` order (the order the singleton
        gate admits in), and how many wait in all."""
        ...


def browses_runs(store: Any) -> bool:
    """Whether ``store`` answers the dashboard's reads itself (``BrowsesRuns``)."""
    return all(
        callable(getattr(store, m, None)) for m in ("browse_runs", "count_runs", "lanes", "lane")
    )


class PagesEvents(Protocol):
    """The optional method ``events_page`` (``MemoryStore``, ``SqlStore``; ``CodecStore`` when
    the store it wraps has it): a page of a run's history without loading all of it (the
    dashboard's run page, ``flowkit._client.browse.page_events``; a store without it has the whole
    history loaded and cut)."""

    async def events_page(
        self,
        run_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        limit: int = 100,
        types: Sequence[str] = (),
    ) -> EventPage:
        """The run's events of ``types`` (empty: every type): with ``after``, the oldest
        ``limit`` whose ``seq`` is above it; else the newest ``limit`` below ``before`` (no
        bound when ``None``); in ``seq`` order either way, with the count and the first and
        last ``seq`` of all its events of ``types``. ``RunNotFoundError`` for an unknown run
        (or one of another namespace). Reads only; indexed on ``(run_id, seq)``."""
        ...


def pages_events(store: Any) -> bool:
    """Whether ``store`` has ``events_page`` (``PagesEvents``)."""
    return callable(getattr(store, "events_page", None))


class ChangeStamp(Protocol):
    """The optional method ``change_stamp`` (``MemoryStore``, ``SqlStore``; ``CodecStore``
    when the store it wraps has it): how the dashboard knows, about once a second, whether to
    refresh (``flowkit._client.browse.watch_changes``)."""

    async def change_stamp(self) -> object:
        """A value that differs from every earlier one after any committed write to the
        store's runs (a run created, its status or steps changed, a run deleted), by this or
        any other process. It may also change without such a write (a false alarm costs one
        refresh), never miss one. Cheap: it reads no table."""
        ...


def changes_stamped(store: Any) -> bool:
    """Whether ``store`` has ``change_stamp`` (``ChangeStamp``)."""
    return callable(getattr(store, "change_stamp", None))


WorkflowVersions = Sequence[tuple[str, str]]
"""``(workflow, version)`` pairs: what a worker has registered, and so may run."""


class ClaimsByVersion(Protocol):
    """The optional capability ``claims_by_version`` (``MemoryStore``, ``SqlStore``;
    ``CodecStore`` when the store it wraps has it): a worker claims only runs whose
    ``(workflow, workflow_version)`` it has registered, in the claim itself, so a run always
    resumes on the code it started on (docs/writing-workflows.md, "Versions").

    ``claim`` and ``due_runs`` take a keyword ``versions`` (``WorkflowVersions``); ``None``
    means any run, as without the capability. A store without it (the attribute absent or
    false) is never passed ``versions``: the worker then filters ``due_runs`` by workflow
    name, claims, and gives back the lease of a run whose version it lacks (the run stays
    claimable; every such claim costs two writes, so the capability matters to mixed fleets).
    With it, the store also honours ``Notify.claim_versions``."""

    claims_by_version: bool

    async def claim(
        self,
        run_id: str,
        owner: str,
        now: float,
        lease_expires: float,
        *,
        versions: WorkflowVersions | None = None,
    ) -> Run | None:
        """``Store.claim``; with ``versions``, ``None`` (nothing written) unless the run's
        ``(workflow, workflow_version)`` is one of them."""
        ...

    async def due_runs(
        self,
        now: float,
        limit: int,
        workflows: Sequence[str] | None = None,
        *,
        versions: WorkflowVersions | None = None,
    ) -> list[str]:
        """``Store.due_runs``; with ``versions``, only runs whose ``(workflow,
        workflow_version)`` is one of them (found by index: a fleet of old and new workers
        must not scan each other's runs)."""
        ...


def claims_by_version(store: Any) -> bool:
    """Whether ``store`` claims by ``(workflow, version)`` (``ClaimsByVersion``): it says so,
    and its ``claim`` and ``due_runs`` take ``versions`` (a subclass that overrides one with
    the older signature does not: the worker then claims and gives back)."""
    if not getattr(store, "claims_by_version", False):
        return False
    return all(takes(getattr(store, m, None), "versions") for m in ("claim", "due_runs"))


@dataclass(frozen=True)
class GateCheck:
    """What ``claim_gated`` needs to decide a gated waiter's admission itself (``ClaimsGated``).

    ``limits``: the singleton ``limit`` of each ``(workflow, version)`` the worker runs (1 for
    a version that declares none: a tagged run still passes the gate); a run of another pair
    is never decided here. ``retry_wake_at(deadline_at)``: the jittered re-check of a denied
    head, never after the run's deadline (called once per decision, inside the store's
    transaction). ``admitted_at()``: the clock the ``singleton_admitted`` record is dated by
    (read once the key is serialized, as ``RecordsAdmission``'s). ``every_waiter_rechecks``:
    the engine has notify-on-release off, so a denied waiter behind the heads keeps its
    re-check too (docs/singleton.md)."""

    limits: Mapping[tuple[str, str], int]
    retry_wake_at: Callable[[float | None], float]
    admitted_at: Callable[[], float]
    every_waiter_rechecks: bool = False


class ClaimsGated(Protocol):
    """The optional capability ``claims_gated`` (``MemoryStore``, ``SqlStore``; ``CodecStore``
    when the store it wraps has it): ``claim`` takes a keyword ``gate`` (``GateCheck``) and
    decides the re-check of a gated waiter in the claim itself, under the key's
    serialization, so a denied re-check reads no history and writes only the waiter's next
    re-check: one transaction instead of four store calls (claim, history,
    ``try_admit_singleton``, the commit that parks it again), and an admitted one is claimed
    with its admission. Without it (absent or false, or a ``claim`` that does not take
    ``gate``) the worker claims, then admits (docs/singleton.md)."""

    claims_gated: bool

    async def claim(
        self,
        run_id: str,
        owner: str,
        now: float,
        lease_expires: float,
        *,
        versions: WorkflowVersions | None = None,
        gate: GateCheck | None = None,
    ) -> Run | None:
        """``Store.claim`` (``versions`` as ``ClaimsByVersion``'s); with ``gate``, a due gated
        waiter (``suspended``, tagged ``singleton:<key>``, not admitted, its deadline not
        passed) of a pair in ``gate.limits`` is decided atomically, under the key's
        serialization, by ``singleton.admission_tags``. Admitted: claimed as without ``gate``,
        with the admission marker and ``singleton_admitted`` (at ``gate.admitted_at()``)
        appended and the key's next heads armed (``heads_to_arm``). Denied: nothing is
        claimed; the run stays ``suspended`` with ``wake_at`` per ``singleton.denial_patch``
        (the key's ``limit``; without it when ``every_waiter_rechecks``) at
        ``gate.retry_wake_at(deadline_at)``, no event is written, the heads without a timer
        are armed as ``try_admit_singleton`` does, and the run is returned as parked: not
        leased, without payloads (``input``, ``output``, ``error`` are ``None``), so the worker
        knows its next re-check. Any other run is claimed as without ``gate``."""
        ...


def claims_gated(store: Any) -> bool:
    """Whether ``store`` decides a gated waiter's re-check in its claim (``ClaimsGated``): it
    says so, and its ``claim`` takes ``gate`` (a subclass that overrides it with an older
    signature does not: the worker then claims, then admits)."""
    return bool(getattr(store, "claims_gated", False)) and takes(
        getattr(store, "claim", None), "gate"
    )


@dataclass(frozen=True)
class WorkerSeen:
    """What a worker instance made known of itself (``RecordsWorkers``): the ``(workflow,
    version)`` pairs it runs, and when it last said so."""

    instance_id: str
    versions: tuple[tuple[str, str], ...]
    last_seen: float
    # the namespace of the store it works on (None: unscoped, it runs every namespace's runs)
    namespace: str | None = None


class RecordsWorkers(Protocol):
    """The optional capability ``records_workers`` (``MemoryStore``, ``SqlStore``;
    ``CodecStore`` when the store it wraps has it): workers make themselves known, so tools
    can say when no live worker has a run's version (``flowkit runs``/``show``,
    ``Engine.result``'s timeout message). Best effort on both sides: a worker logs a failed
    ``record_worker`` and goes on; without the capability nothing is said."""

    records_workers: bool

    async def record_worker(self, instance_id: str, versions: WorkflowVersions, now: float) -> None:
        """Insert or replace this store's namespace's entry of ``instance_id``: the pairs it
        runs, seen at ``now`` (none: it stopped cleanly). A store may forget entries not seen
        for a long time (days)."""
        ...

    async def workers(self) -> list[WorkerSeen]:
        """Every entry of this store's namespace, by ``instance_id``."""
        ...


def records_workers(store: Any) -> bool:
    """Whether ``store`` keeps what workers make known of themselves (``RecordsWorkers``)."""
    return bool(getattr(store, "records_workers", False))


class RecordsSchemas(Protocol):
    """The optional capability ``records_schemas`` (``MemoryStore``, ``SqlStore``;
    ``CodecStore`` when the store it wraps has it): each worker records, per ``(workflow,
    version)`` it runs, the JSON schemas of its input and declared messages
    (``flowkit._client.schemas``), so a process without the workflow's code (``flowkit signal``,
    ``flowkit retry --input``, the dashboard, ``Engine(store, [])``) validates against them
    before writing (docs/updates.md, "Callers without the code"). Without it such a caller
    validates nothing, as before."""

    records_schemas: bool

    async def put_workflow_schemas(self, schemas: Mapping[tuple[str, str], Any]) -> None:
        """Insert or replace, in one transaction, the document (a JSON object) of each
        ``(workflow, version)`` in this store's namespace ('' for none)."""
        ...

    async def workflow_schema(
        self, workflow: str, version: str, namespace: str | None = None
    ) -> Any | None:
        """The document recorded for ``(workflow, version)`` in this store's namespace (for
        a store without one: in ``namespace``, the namespace of the run it is wanted for),
        else the one recorded by a store without a namespace (an unscoped worker runs every
        namespace's runs), else ``None``. One read; writes nothing."""
        ...


def records_schemas(store: Any) -> bool:
    """Whether ``store`` keeps workers' workflow schemas (``RecordsSchemas``)."""
    return bool(getattr(store, "records_schemas", False))


__all__ = [
    "BrowsesRuns",
    "ChangeStamp",
    "ClaimsByVersion",
    "ClaimsGated",
    "GateCheck",
    "LatestEvent",
    "PagesEvents",
    "PrunesRuns",
    "PublishedEvent",
    "PublishesEvents",
    "RecordsSchemas",
    "RecordsWorkers",
    "WorkerSeen",
    "WorkflowVersions",
    "browses_runs",
    "changes_stamped",
    "claims_by_version",
    "claims_gated",
    "lists_by_search",
    "pages_events",
    "prunes_runs",
    "publishes_events",
    "records_schemas",
    "records_workers",
    "takes",
]
