"""The store protocol: everything the engine persists goes through these async methods.

Each method is one atomic operation; its docstring says what it guarantees. ``MemoryStore`` is
the reference implementation; the conformance kit (``flowkit_testing.conformance``) checks any
store against this contract. Some methods and capabilities are optional (``Watchable``,
``ReleasesLeases``, ``AdmitsOnCreate``, ``ClaimsByVersion``, ``RecordsWorkers``, ...): leave
one out or set it to ``None``, and wrappers expose one only when the store they wrap has it.
See docs/stores.md, "Writing a custom store"."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .._core.event_keys import EVENT_MARK_PREFIX, TakenEvent, event_mark
from .._core.run import InboxSignal, Run, RunStatus
from .._core.search_terms import Term, parse_filter
from ..errors import ConflictError
from ..events import Event
from ..singleton import check_limit
from ._capabilities import (
    BrowsesRuns,
    ChangeStamp,
    ClaimsByVersion,
    ClaimsGated,
    GateCheck,
    LatestEvent,
    PrunesRuns,
    PublishedEvent,
    PublishesEvents,
    RecordsSchemas,
    RecordsWorkers,
    WorkerSeen,
    WorkflowVersions,
    browses_runs,
    changes_stamped,
    claims_by_version,
    claims_gated,
    lists_by_search,
    prunes_runs,
    publishes_events,
    records_schemas,
    records_workers,
)


class _Unset:
    _instance: _Unset | None = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class QueueCap:
    """``create_run`` precondition: fewer than ``capacity`` active runs of ``workflow`` carry
    ``tag`` (``capacity = limit + max_queue_depth``)."""

    workflow: str
    tag: str
    key: str
    limit: int
    max_queue_depth: int

    @property
    def capacity(self) -> int:
        return self.limit + self.max_queue_depth


@dataclass(frozen=True)
class Admission:
    """``create_run`` decides a new singleton run's admission in its own transaction (stores
    with ``admits_on_create``; see ``AdmitsOnCreate``).

    Atomically with the insert (after the ``QueueCap`` check, if any), the store selects with
    ``flowkit.singleton.admission_tags`` over the active runs of ``workflow`` carrying ``tag``
    (``"singleton:" + key``) plus the new run, with ``limit`` slots. Admitted: the run is
    stored with the admission marker, otherwise as passed. Denied: it is stored parked as
    ``flowkit.singleton.denial_patch`` says (``suspended``, ``wake_at=retry_wake_at``: a first
    denial, docs/singleton.md, "Deep queues") and without a lease, and
    ``gated`` (the engine's ``singleton_gated`` record) is appended after the run's events.
    Admitted, a store with ``records_admission`` appends ``admitted`` (the
    ``singleton_admitted`` record) after them: the history shows the slot from the instant
    it was taken, whatever happens to the worker next. An existing id is returned as it is:
    no admission, nothing written."""

    workflow: str
    tag: str
    limit: int
    retry_wake_at: float
    gated: tuple[Event, ...] = ()
    admitted: tuple[Event, ...] = ()
    # read inside the transaction, once the key is serialized, to date ``admitted``: an
    # admission is never dated before a release it had to wait for
    clock: Callable[[], float] | None = None

    def __post_init__(self) -> None:
        check_limit(self.limit)  # (ValueError: a key without a slot would park every run)


@dataclass(frozen=True)
class Notify:
    """Notify-on-release, applied in the same transaction as a terminal commit: stamp
    ``wake_at=now`` on the oldest gated waiters of ``(workflow, tag)`` that free slots can take.

    With ``claim_owner`` (and a known ``limit``) a store may *hand the slot over* instead: a
    waiter that is claimable at ``now`` is admitted (``flowkit.singleton.admission_tags``) and
    claimed for ``claim_owner`` until ``lease_expires`` in the same transaction, and returned
    in ``CommitResult.handed``. The releasing engine then runs it at once, so a handover costs
    no further transaction and no cross-process wake-up. A waiter some other claimer holds is
    left to admit itself."""

    workflow: str
    tag: str
    limit: int | None  # None: unknown to the releasing engine; wake the oldest waiter
    claim_owner: str | None = None
    lease_expires: float = 0.0
    max_hand_offs: int | None = None  # at most this many waiters handed over; the rest woken
    # the versions of ``workflow`` that ``claim_owner`` has registered: a waiter of another
    # version is only woken, never handed over (``None``: any version). A store that ignores
    # this field still works: the releasing engine gives back the lease of a waiter it cannot
    # run (``ClaimsByVersion``).
    claim_versions: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.limit is not None:
            check_limit(self.limit)


@dataclass(frozen=True)
class HandOff:
    """A waiter that a release handed its slot to: admitted and leased to the releasing
    engine in the releasing transaction, with its history, ready to execute."""

    run: Run
    events: tuple[Event, ...]


@dataclass(frozen=True)
class Successor:
    """The run a continue-as-new commit creates (``Update.successor``; stores with
    ``continues_as_new``): ``run`` as it must be stored (fresh history ``events`` from seq 1,
    already admitted and leased when the engine passes its singleton slot on and runs it at
    once) in the transaction that settles its predecessor."""

    run: Run
    events: tuple[Event, ...]


@dataclass(frozen=True)
class Update:
    """One atomic change of a run: new events (the store assigns ``seq``) and field updates.

    Fields left ``UNSET`` keep their value. A terminal ``status`` also removes the admission
    marker, clears the lease, ``wake_at`` and ``waiting_signals``. ``cancelling`` is sticky: a
    non-terminal status never replaces it (a suspend then becomes due at once).

    ``input``, ``deadline_at`` and ``recoveries`` are ``engine.retry``'s: the run's new input
    (a payload, encoded by ``CodecStore``), its fresh deadline and its reset recovery count.

    ``successor`` (stores with ``continues_as_new``, ``ContinuesAsNew``) is created in the
    same transaction, and the run's ``continued_as`` names it.

    ``search`` is the run's whole new map of search attributes, replacing ``Run.search``
    and the store's index of it in the same transaction. Left ``None``, a commit whose
    ``events`` hold ``search_upserted`` merges their attributes into the run's map, in order
    (``rules.apply_update``), under the same lock: what the engine's ``ctx.upsert_search``
    relies on (``flowkit._core.search_terms.merged``)."""

    events: Sequence[Event] = ()
    status: RunStatus | None = None
    output: Any = UNSET
    error: Any = UNSET
    wake_at: Any = UNSET
    waiting_signals: tuple[str, ...] | None = None
    attempt: int | None = None
    release_lease: bool = False
    consume_signal: int | None = None
    expect_status: frozenset[RunStatus] | None = None
    ignore_lease: bool = False
    notify: Notify | None = None
    input: Any = UNSET
    deadline_at: Any = UNSET
    recoveries: int | None = None
    successor: Successor | None = None
    search: dict[str, str | int | float | bool] | None = None

    @property
    def revives(self) -> bool:
        """Whether it sets a field only a retry sets (``input``, ``deadline_at``,
        ``recoveries``) or creates a successor run: stores apply such a commit by their
        general path."""
        return (
            self.input is not UNSET
            or self.deadline_at is not UNSET
            or self.recoveries is not None
            or self.successor is not None
        )


@dataclass(frozen=True)
class CommitResult:
    run: Run
    seqs: tuple[int, ...] = ()
    woken: tuple[str, ...] = field(default=())
    handed: tuple[HandOff, ...] = field(default=())


@runtime_checkable
class Store(Protocol):
    """Durable state of runs, their histories and their signal inboxes."""

    async def create_run(
        self, run: Run, events: Sequence[Event], *, queue_cap: QueueCap | None = None
    ) -> tuple[Run, bool]:
        """Atomically create ``run`` with ``events`` (seq 1..n), or return ``(existing, False)``
        when ``run.id`` exists, writing nothing. With ``queue_cap``, the count of active runs
        sharing the tag and the insert are atomic per key; at capacity it raises
        ``SingletonQueueFullError`` and writes nothing. A store with ``admits_on_create``
        (``AdmitsOnCreate``) also takes ``admission``."""
        ...

    async def get_run(self, run_id: str) -> Run | None:
        """The run's current snapshot, or ``None``."""
        ...

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        tag: str | None = None,
        limit: int | None = None,
        parent_id: str | None = None,
        search: Sequence[Term] = (),
        after: tuple[float, str] | None = None,
    ) -> list[Run]:
        """Runs visible to this store, oldest ``(created_at, id)`` first; ``parent_id`` keeps
        the children of that run (``Run.parent_id``); ``search`` keeps the runs whose search
        attributes pass every term (``flowkit._core.search_terms.matches``); ``after`` starts
        past that ``(created_at, id)`` (keyset paging: ids compare by code point), and
        ``limit`` stops after that many. The runs listed carry no payloads: ``input``,
        ``output`` and ``error`` are ``None`` (``get_run`` has them). A store that cannot
        take ``search`` or ``after`` leaves them out of its signature: the engine then
        refuses such a filter with ``UnsupportedStoreError``."""
        ...

    async def load_events(self, run_id: str) -> list[Event]:
        """The run's events in ``seq`` order."""
        ...

    async def claim(self, run_id: str, owner: str, now: float, lease_expires: float) -> Run | None:
        """Atomically take the execution lease when the run is claimable: ``pending``;
        ``suspended``/``blocked`` with ``wake_at <= now``; ``cancelling`` or ``running`` with no
        live lease. Sets ``running`` (``cancelling`` stays), clears ``wake_at``. A claim that
        takes over the expired lease of a ``running``/``cancelling`` run (its worker died:
        ``rules.lost_activation``) adds 1 to ``recoveries`` in the same write. ``None`` when
        not claimable: two claimers never both win."""
        ...

    async def renew_lease(self, run_id: str, owner: str, lease_expires: float) -> Run | None:
        """Extend the lease to ``lease_expires`` if ``owner`` still holds it (never shorten
        it: a late renewal may land after a newer one); ``None`` when it was lost."""
        ...

    async def commit(
        self, run_id: str, owner: str | None, now: float, update: Update
    ) -> CommitResult:
        """Apply ``update`` and append its events atomically. With ``owner`` the caller must
        hold the lease (``LeaseLostError``); with ``None`` no live lease may exist unless
        ``ignore_lease``. A failed precondition raises ``ConflictError`` and writes nothing."""
        ...

    async def due_runs(
        self, now: float, limit: int, workflows: Sequence[str] | None = None
    ) -> list[str]:
        """Ids of runs (of ``workflows``, if given) a worker could claim now, most overdue
        first."""
        ...

    async def next_due_at(self, exclude_lease_owners: Sequence[str] = ()) -> float | None:
        """The earliest instant at which some active run not leased by one of
        ``exclude_lease_owners`` becomes claimable (``memory.due_time``), or ``None``. It may
        have passed already: a run claimable now counts too (see ``NextDueAfter``)."""
        ...

    async def deliver_signal(self, run_id: str, name: str, payload: Any, now: float) -> Run:
        """Append to the run's inbox and, when the run is suspended waiting for ``name``,
        make it due now, atomically. ``RunNotFoundError`` for an unknown run. A run that
        continued as new (``Run.continued_as``) is followed to the last run of its chain in
        the same transaction (for a name that ``moves_to_successor``), and the run returned
        is the one that got the signal."""
        ...

    async def peek_signal(self, run_id: str, name: str) -> InboxSignal | None:
        """The oldest unconsumed signal ``name`` in the run's inbox."""
        ...

    async def try_admit_singleton(
        self,
        run_id: str,
        tag: str,
        workflow: str,
        limit: int,
        retry_wake_at: float | None = None,
    ) -> bool:
        """Atomically claim a singleton slot (docs/singleton.md): serialize competing claims of
        the key, read only the active runs sharing ``tag``, select with ``admission_tags`` and
        persist the marker before returning ``True``; on denial park the run with
        ``denial_patch``.
        FIFO ties (same ``created_at``) go by the run ids' code points. A ``limit`` that is not
        an ``int`` >= 1 raises ``ValueError`` and writes nothing."""
        ...


AdmittedAt = float | Callable[[], float] | None
"""When an admission happened: an instant, or a clock the store reads inside its transaction."""


def admission_time(at: AdmittedAt) -> float | None:
    """The instant ``at`` names (a clock is read now: call it inside the transaction)."""
    return at() if callable(at) else at


class RecordsAdmission(Protocol):
    """The optional capability ``records_admission`` (``MemoryStore``, ``SqlStore``, and
    ``CodecStore`` over either): the store appends ``singleton_admitted`` in the very
    transaction that sets a run's admission marker, so a worker dying right after an
    admission cannot leave a holder whose history says it was admitted later (or never):

    * ``create_run(..., admission=...)`` appends ``Admission.admitted`` when it admits;
    * ``try_admit_singleton(..., admitted_at=T)`` appends ``SingletonAdmitted(key, at=T)``
      when it sets the marker (not when the run already held it). ``T`` may be a clock
      (a callable): the store then reads it inside the transaction, once the key is
      serialized, so an admission is never dated before the release it waited for;
    * ``try_admit_singleton(..., recheck=True)``: the run was gated before (a re-check, not
      its first denial): denied behind the heads of the queue (``singleton.heads``), it
      parks without a timer (``denial_patch`` with the limit) until whatever makes it a head
      arms it. A first denial (``recheck=False``, the default) parks with
      ``retry_wake_at`` as docs/singleton.md says, wherever the run stands in the queue;
    * a hand-off (``Notify.claim_owner``) appends ``SingletonAdmitted(key, at=now)`` to the
      waiter it admits, and the ``HandOff``'s events include it.

    Without it the engine records the admission with the run's next write."""

    records_admission: bool

    async def try_admit_singleton(
        self,
        run_id: str,
        tag: str,
        workflow: str,
        limit: int,
        retry_wake_at: float | None = None,
        *,
        admitted_at: AdmittedAt = None,
        recheck: bool = False,
    ) -> bool: ...


def records_admission(store: Any) -> bool:
    """Whether ``store`` writes ``singleton_admitted`` with the admission marker
    (``RecordsAdmission``): it says so, and its ``try_admit_singleton`` takes ``admitted_at``
    (a subclass that overrides it with the older signature does not: the engine then records
    the admission itself)."""
    if not getattr(store, "records_admission", False):
        return False
    fn = getattr(store, "try_admit_singleton", None)
    if fn is None:
        return False
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "admitted_at" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def rechecks_heads(store: Any) -> bool:
    """Whether ``store``'s ``try_admit_singleton`` takes ``recheck`` (``RecordsAdmission``):
    a re-check behind the heads of the queue then parks without a timer."""
    if not records_admission(store):
        return False
    try:
        params = inspect.signature(store.try_admit_singleton).parameters
    except (TypeError, ValueError):
        return False
    return "recheck" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class ReleasesLeases(Protocol):
    """The optional method ``release_leases`` (every bundled store has it)."""

    async def release_leases(self, owner: str, now: float) -> list[str]:
        """Give back every lease ``owner`` holds on an active run (a worker restarted under
        the same instance id: its old activations are gone), leaving each run claimable at
        ``now``; return their ids. Each run's release is atomic; a visible run only. A
        ``running``/``cancelling`` run's ``recoveries`` goes up by 1 with it (its activation
        was lost: ``rules.lost_activation``)."""
        ...


class AdmitsOnCreate(Protocol):
    """The optional capability ``admits_on_create`` (``MemoryStore`` and ``SqlStore`` have it;
    ``CodecStore`` when the store it wraps has it).

    Such a store's ``create_run`` takes ``admission``: the engine then starts a singleton run
    in one transaction (admitted and leased to the starting worker, or parked behind the key's
    holders) instead of three (create, ``try_admit_singleton``, and the commit that parks a
    denied run). Without it (the attribute absent or false) the engine never passes
    ``admission`` and the worker admits the run after creating it. A store with it still needs
    ``try_admit_singleton``: parked runs re-check with it."""

    admits_on_create: bool

    async def create_run(
        self,
        run: Run,
        events: Sequence[Event],
        *,
        queue_cap: QueueCap | None = None,
        admission: Admission | None = None,
    ) -> tuple[Run, bool]:
        """``Store.create_run``; with ``admission`` and a new id, the run's admission is decided
        atomically with the insert, under the same serialization of the key as
        ``try_admit_singleton`` (``Admission``): first the ``queue_cap`` check, then
        ``admission_tags`` over the key's active runs and the new run (FIFO by
        ``(created_at, id)``). Returns the run as stored and ``True``. An existing id:
        ``(existing, False)``, nothing written, no admission."""
        ...


class ContinuesAsNew(Protocol):
    """The optional capability ``continues_as_new`` (``MemoryStore``, ``SqlStore``;
    ``CodecStore`` when the store it wraps has it): ``commit`` takes ``Update.successor``.

    Atomically with the run's update (a terminal one: ``ctx.continue_as_new``), the store
    inserts ``successor.run`` (its namespace: the run's; its search attributes: the run's as
    this update leaves them) with ``successor.events`` (seq 1..n) and sets the run's
    ``continued_as`` to its id, and moves the signals and updates left in the run's inbox
    (``moves_to_successor``) to the successor's, keeping their ids (so their order). From then
    on ``deliver_signal`` of such a name to the run delivers to the last run of its chain, in
    its own transaction (docs/composing-workflows.md, "Signals and updates follow the chain").
    Every precondition is checked before anything is written:
    an existing successor id raises ``ConflictError`` (nothing written).
    A successor without a lease that is claimable now wakes the workers (``Watchable``); one
    leased to the committing worker is returned in ``CommitResult.handed`` (with its events),
    for it to run at once. Without the capability (absent or false) the engine never passes
    ``successor``: a ``continue_as_new`` fails its run with ``UnsupportedStoreError``."""

    continues_as_new: bool


STAYING_PREFIXES = (EVENT_MARK_PREFIX, "flowkit:child:")
"""The inbox signals that belong to their run, not to its chain: the mark of an event
delivered to one of the run's own waits, and the wake-up a child of the run sends it when it
settles (``flowkit._replay.children.WAKE_PREFIX``: children stay with the run that started
them)."""


def moves_to_successor(name: str) -> bool:
    """Whether an inbox signal named ``name`` follows a continue-as-new chain
    (``ContinuesAsNew``): signals and updates do (moved to the successor when the run had not
    taken them, delivered to the chain's last run when sent later); the names of
    ``STAYING_PREFIXES`` stay with the run they were sent to."""
    return not name.startswith(STAYING_PREFIXES)


def continues_as_new(store: Any) -> bool:
    """Whether ``store`` creates a continue-as-new successor in its commit
    (``ContinuesAsNew``)."""
    return bool(getattr(store, "continues_as_new", False))


class AppendsEvents(Protocol):
    """The optional capability ``appends_events`` (``MemoryStore`` and ``SqlStore`` have it;
    ``CodecStore`` when the store it wraps has it): the commit of a running step, narrowed.

    Most commits of a run's life record a step's outcome: events appended by the lease holder,
    nothing else changed. ``append_events`` is that commit alone, so a store can make it as
    cheap as one statement (SQLite: one ``INSERT``; PostgreSQL: one round trip) and skip
    returning the run. The engine calls it for such records and falls back to ``commit`` when
    it returns ``None``; without the capability (absent or false) it always commits."""

    appends_events: bool

    async def append_events(
        self, run_id: str, owner: str, now: float, events: Sequence[Event]
    ) -> tuple[int, ...] | None:
        """Atomically, when the run exists, ``owner`` holds its lease (as ``commit`` checks:
        the owner, not the expiry) and its status is ``running``: append ``events`` (at least
        one; the store assigns their seqs, returned in order) and move ``updated_at`` forward,
        never back: to ``now`` (or to the newest event's ``at``, which the engine takes just
        before) when that is later. Otherwise write nothing and return
        ``None``: the caller then commits, and ``commit`` decides (``LeaseLostError``, a
        ``cancelling`` run, an unknown run)."""
        ...


class NextDueAfter(Protocol):
    """The optional ``next_due_after`` method (``MemoryStore``, ``SqlStore``; ``CodecStore``
    when the store it wraps has it): the deadline of a worker's timer poll.

    ``next_due_at`` answers with the earliest due instant of all, which is in the past as long
    as some run is claimable already: one the poller has just dispatched and not claimed yet,
    a run of a workflow this worker does not have, a backlog beyond its capacity. An instant in
    the past is no deadline, and the future ones behind it are lost with it; the poller uses
    this method instead when the store has it. Without it, the poller falls back to its
    ``poll_interval`` while any run is overdue, so timers may fire up to that late."""

    async def next_due_after(
        self, now: float, exclude_lease_owners: Sequence[str] = ()
    ) -> float | None:
        """The earliest instant later than ``now`` at which some active run not leased by one
        of ``exclude_lease_owners`` becomes claimable (``memory.due_time``: its wake time, its
        lease expiry, its creation), or ``None``. Runs due at ``now`` or before are left out
        (``due_runs`` lists those). One read; writes nothing."""
        ...


class Watchable(Protocol):
    """The optional ``watch`` method: cross-process wake-ups (``SqlStore`` has it).

    A store that has it emits a *wake-up* with every write that leaves some run claimable now
    by any worker (a new ``pending`` run, a released lease, a signal or cancellation that makes
    a parked run due) or wakes a singleton waiter, and delivers it to the watchers of every
    store object and process on the same data. Writes that keep their lease (a step's record)
    emit nothing, except those that record an event a reader may wait for (``event_set``,
    ``update_replied``: ``engine.get_event`` and ``engine.update`` in another process).
    Wake-ups are hints, not messages: one may cover several writes, one may be delivered
    without new work, and one may be lost (a dropped connection), so the workers' timer poll
    stays the fallback and correctness never depends on them."""

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` (no arguments, on the running event loop) after wake-ups of
        this store's namespace; return the function that stops it. Never raises into the
        engine after it returned: failures are the store's to log and retry. ``Worker.start``
        subscribes its ``poke``; ``flowkit_testing.TestEnv`` hides ``watch`` (its virtual
        clock and seeded interleavings must not see real-time callbacks)."""
        ...


__all__ = [
    "EVENT_MARK_PREFIX",
    "STAYING_PREFIXES",
    "UNSET",
    "Admission",
    "AdmitsOnCreate",
    "AdmittedAt",
    "AppendsEvents",
    "BrowsesRuns",
    "ChangeStamp",
    "ClaimsByVersion",
    "ClaimsGated",
    "CommitResult",
    "ConflictError",
    "ContinuesAsNew",
    "GateCheck",
    "HandOff",
    "InboxSignal",
    "LatestEvent",
    "NextDueAfter",
    "Notify",
    "PrunesRuns",
    "PublishedEvent",
    "PublishesEvents",
    "QueueCap",
    "RecordsAdmission",
    "RecordsSchemas",
    "RecordsWorkers",
    "ReleasesLeases",
    "Store",
    "Successor",
    "TakenEvent",
    "Term",
    "Update",
    "Watchable",
    "WorkerSeen",
    "WorkflowVersions",
    "admission_time",
    "browses_runs",
    "changes_stamped",
    "claims_by_version",
    "claims_gated",
    "continues_as_new",
    "event_mark",
    "lists_by_search",
    "moves_to_successor",
    "parse_filter",
    "prunes_runs",
    "publishes_events",
    "records_admission",
    "records_schemas",
    "records_workers",
]
