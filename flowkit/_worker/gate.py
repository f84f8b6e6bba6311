"""The engine side of the singleton gate: the key of a new run, admission at creation, the
worker's admission check and parking, the release record, the hand-off of a freed slot, and
the direct cancel of a run that never got past its gate (docs/singleton.md tells the story).

The rules a store applies inside its admission transaction are ``flowkit.singleton``'s."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from .._core import limits as _limits
from .._core.clock import Clock
from .._core.ready_queue import start_next
from .._core.run import SINGLETON_TAG_PREFIX, Run, RunStatus
from .._model.definition import WorkflowDefinition
from ..errors import InvalidInputError, UnsupportedStoreError
from ..events import (
    CancelRequested,
    Event,
    RunCancelled,
    RunStarted,
    SingletonAdmitted,
    SingletonGated,
    SingletonReleased,
)
from ..stores.base import (
    Admission,
    CommitResult,
    ConflictError,
    Notify,
    QueueCap,
    RecordsAdmission,
    Store,
    Update,
    rechecks_heads,
    records_admission,
)

GATE_RETRY = 1.0
"""Seconds until a denied waiter checks the gate again (jittered by ``GATE_JITTER``)."""
GATE_JITTER = 0.25

_NOT_CANCELLING = frozenset(s for s in RunStatus if s.active and s is not RunStatus.CANCELLING)

Commit = Callable[[Run, Update], Awaitable[Run]]
"""How the gate writes during an activation: the drive's commit (wake-ups, hand-off, bus)."""
Claimed = Callable[[Run, Sequence[Event]], None]
"""Where a run handed over to this instance goes: the worker's ``run_claimed``."""


def retry_wake_at(now: float, rng: random.Random, deadline_at: float | None = None) -> float:
    """When a denied waiter re-checks: ``GATE_RETRY`` seconds on, jittered from the injected
    RNG so that waiters denied together do not all come back together; never later than the
    run's deadline (``deadline_at``: its ``execution_timeout`` cancels it then)."""
    at = round(now + GATE_RETRY + rng.uniform(-GATE_JITTER, GATE_JITTER), 6)
    return at if deadline_at is None else min(at, deadline_at)


def _last_gate_event(events: Sequence[Event]) -> str | None:
    for ev in reversed(events):
        if ev.type in (
            "singleton_gated",
            "singleton_admitted",
            "run_retried",
            "singleton_released",
        ):
            return ev.type
    return None


def needs_gated_event(events: Sequence[Event]) -> bool:
    """True unless this gating episode already recorded ``singleton_gated``."""
    return _last_gate_event(events) != "singleton_gated"


def needs_admitted_event(events: Sequence[Event]) -> bool:
    """True unless the current admission is already recorded (a recovered holder)."""
    return _last_gate_event(events) != "singleton_admitted"


# -- a new run ---------------------------------------------------------------------------------
def singleton_key(defn: WorkflowDefinition, value: Any, store: Store) -> str | None:
    """The singleton key of a new run of ``defn`` with validated input ``value`` (``None``: not
    a singleton workflow). Raises before anything is written: ``UnsupportedStoreError`` for a
    store without admission, ``InvalidInputError`` for a key that is not a usable string."""
    sg = defn.singleton
    if sg is None:
        return None
    if getattr(store, "try_admit_singleton", None) is None:
        raise UnsupportedStoreError(
            f"{type(store).__name__} has no try_admit_singleton: it cannot run "
            f"singleton workflow {defn.name!r}"
        )
    try:
        key = sg.key(value)
    except Exception as exc:
        raise InvalidInputError(defn.name, f"singleton key() raised {exc!r}") from exc
    if not isinstance(key, str) or not key:
        raise InvalidInputError(
            defn.name, f"singleton key() must return a non-empty str, got {key!r}"
        )
    problem = _limits.identifier_problem(key, _limits.MAX_SINGLETON_KEY_LENGTH)
    if problem is not None:
        raise InvalidInputError(defn.name, f"singleton key() returned a key that {problem}")
    return key


def queue_cap(defn: WorkflowDefinition, key: str | None) -> QueueCap | None:
    """``create_run``'s bound on the key's queue, when the workflow sets ``max_queue_depth``."""
    sg = defn.singleton
    if sg is None or sg.max_queue_depth is None or key is None:
        return None
    return QueueCap(defn.name, SINGLETON_TAG_PREFIX + key, key, sg.limit, sg.max_queue_depth)


# -- cancelling a run that never got past its gate --------------------------------------------
def waiting(run: Run) -> bool:
    """Whether ``run`` waits at its gate (a singleton run without a slot): no body runs yet."""
    return run.singleton_key is not None and not run.admitted


def cancel_at_once(run: Run, limit: int | None, now: float, reason: str | None = None) -> Update:
    """The commit that settles ``run`` ``cancelled`` without an activation (it never started,
    never got past its gate, or is blocked). A slot it held is released and its key's waiters
    notified; ``limit`` is the workflow's (``None``: unknown here); ``reason`` is the
    ``cancel_requested`` event's (``"execution_timeout"``: its deadline passed)."""
    tag = run.singleton_tag
    released: list[Event] = []
    if run.admitted and run.singleton_key is not None:
        released.append(SingletonReleased(key=run.singleton_key, at=now))
    return Update(
        events=[CancelRequested(at=now, reason=reason), *released, RunCancelled(at=now)],
        status=RunStatus.CANCELLED,
        expect_status=frozenset({run.status}),
        notify=None if tag is None else Notify(run.workflow, tag, limit),
    )


# -- releasing a slot --------------------------------------------------------------------------
def release_notify(run: Run, defn: WorkflowDefinition) -> Notify:
    """Notify-on-release for a settling run of ``defn`` that holds (or waits for) a slot: the
    settling commit wakes the key's oldest waiters. Its ``limit`` is the workflow's, 1 when
    the current code no longer declares the singleton."""
    tag = run.singleton_tag
    assert tag is not None
    return Notify(run.workflow, tag, _limit(defn))


def _limit(defn: WorkflowDefinition) -> int:
    return defn.singleton.limit if defn.singleton is not None else 1


def hand_off(
    update: Update,
    owner: str,
    lease_expires: float,
    max_hand_offs: int,
    versions: frozenset[str] | None = None,
) -> Update:
    """``update`` (a release: it carries ``notify``) asking the store to hand the freed slot(s)
    to the next waiter(s), admitted and leased to ``owner`` in the same transaction; only a
    waiter of one of ``versions`` (those of the workflow ``owner`` has; ``None``: any), the
    others are woken (``Notify.claim_versions``)."""
    n = update.notify
    assert n is not None
    return dataclasses.replace(
        update,
        notify=dataclasses.replace(
            n,
            claim_owner=owner,
            lease_expires=lease_expires,
            max_hand_offs=max_hand_offs,
            claim_versions=versions,
        ),
    )


async def commit_handing_off(
    store: Store, run_id: str, owner: str, now: float, update: Update, claimed: Claimed
) -> CommitResult:
    """A release that may hand runs to us, in a task of its own (started next: a release's
    latency is the handover's) that starts the runs it was handed as soon as the store
    returns, not after the turns of the loop that resuming this caller takes. Safe against
    our own cancellation (stopping): the commit still completes, and the runs it handed over
    go to ``claimed`` (the worker's ``run_claimed``, which a stopping worker gives back)."""
    commit = start_next(_commit_and_start(store, run_id, owner, now, update, claimed))
    try:
        return await asyncio.shield(commit)
    except asyncio.CancelledError:
        if not commit.done():
            with contextlib.suppress(BaseException):
                await commit
        raise


async def _commit_and_start(
    store: Store, run_id: str, owner: str, now: float, update: Update, claimed: Claimed
) -> CommitResult:
    res = await store.commit(run_id, owner, now, update)
    for h in res.handed:
        claimed(h.run, h.events)
    return res


class Gate:
    """One engine's side of the gate on one store: admission at creation for ``Engine.start``,
    and the admission check an activation passes before its body runs."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        rng: random.Random,
        notifies: Callable[[], bool] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.rng = rng
        # without notify-on-release nothing makes a waiter a head with a timer when the queue
        # moves: every denied waiter keeps its own re-check (the seed's rule)
        # (``notifies``: the engine's current ``notify_on_release``; ``None``: on)
        self._notifies = notifies
        # the store writes ``singleton_admitted`` with the admission marker (RecordsAdmission)
        self.records_admission = records_admission(store)
        # a re-check behind the heads of the queue parks without a timer (rechecks_heads)
        self._heads_only = rechecks_heads(store)

    @property
    def notify_on_release(self) -> bool:
        """Whether releases notify the key's waiters (``Engine(notify_on_release=)``)."""
        return self._notifies is None or self._notifies()

    def _rechecks(self, events: Sequence[Event]) -> bool:
        """Whether a denial of a run with ``events`` may park it without a timer behind the
        heads of the queue: it was gated before (a first denial keeps its ~1 s re-check,
        docs/singleton.md, "Deep queues"), this engine's releases arm the next heads, and the store
        decides so (``rechecks_heads``)."""
        return self.notify_on_release and self._heads_only and not needs_gated_event(events)

    # -- at creation -------------------------------------------------------------------------
    def admission(
        self, defn: WorkflowDefinition, key: str, now: float, deadline_at: float | None = None
    ) -> Admission | None:
        """What ``create_run`` needs to decide a new run's admission in its own transaction, on
        a store with ``admits_on_create`` (``None`` elsewhere: the worker admits the run).

        A queued start then costs one transaction instead of three (create, admit, park) and
        no activation; the worker's check stays the fallback (no capacity, a store without
        the capability, every re-check of a parked run)."""
        sg = defn.singleton
        if sg is None or not getattr(self.store, "admits_on_create", False):
            return None
        retry_at = retry_wake_at(now, self.rng, deadline_at)
        return Admission(
            defn.name,
            SINGLETON_TAG_PREFIX + key,
            sg.limit,
            retry_at,
            (SingletonGated(key=key, retry_at=retry_at, at=now),),
            (SingletonAdmitted(key=key, at=now),),
            self.clock.now,  # (dates the admission inside the insert's transaction)
        )

    @staticmethod
    def parked(admission: Admission | None, stored: Run) -> bool:
        """Whether ``create_run`` with ``admission`` parked the run behind the key's holders
        (unleased: a release hands it over or wakes it, else its re-check does)."""
        return admission is not None and stored.lease_owner is None

    def claimed_events(self, first: RunStarted, admission: Admission | None) -> list[Event]:
        """The history of a run created claimed by this instance, as its activation starts."""
        if admission is not None and self.records_admission:
            return [first, *admission.admitted]  # (no seq needed: it has no position)
        return [first]

    # -- before a body runs ------------------------------------------------------------------
    def admitted_record(self, run: Run, events: Sequence[Event]) -> list[Event]:
        """For a run that holds its slot already (handed over, or a recovered holder): the
        ``singleton_admitted`` record its history still lacks, to ride with the activation's
        next write instead of costing one of its own."""
        key = run.singleton_key
        if key is not None and needs_admitted_event(events):
            return [SingletonAdmitted(key=key, at=self.clock.now())]
        return []

    async def admit(
        self,
        run: Run,
        events: Sequence[Event],
        defn: WorkflowDefinition,
        notify: Notify | None,
        commit: Commit,
    ) -> list[Event] | None:
        """Ask the store for a slot for ``run`` (leased here, not admitted yet). Admitted: the
        events to record with the activation's next write. Otherwise ``None``: the run was
        parked (``singleton_gated``) or, cancelling, settled ``cancelled`` (a cancelled
        waiter never runs its body)."""
        key, tag = run.singleton_key, run.singleton_tag
        assert key is not None and tag is not None
        if run.status is RunStatus.CANCELLING:
            await commit(
                run,
                Update(
                    events=[RunCancelled(at=self.clock.now())],
                    status=RunStatus.CANCELLED,
                    notify=notify,
                ),
            )
            return None
        now = self.clock.now()
        retry_at = retry_wake_at(now, self.rng, run.deadline_at)
        limit = _limit(defn)
        if self.records_admission:  # the store writes singleton_admitted with the marker
            # (a re-check of a waiter gated before: behind the heads it parks without a
            # timer, unless no release of this engine would make it a head)
            kw = {"recheck": True} if self._rechecks(events) else {}
            ok = await cast(RecordsAdmission, self.store).try_admit_singleton(
                run.id, tag, run.workflow, limit, retry_at, admitted_at=self.clock.now, **kw
            )
            if ok:
                return []
        else:
            ok = await self.store.try_admit_singleton(run.id, tag, run.workflow, limit, retry_at)
            if ok:
                return self.admitted_record(run, events)
        await self._park(run, events, key, retry_at, notify, commit)
        return None

    async def _park(
        self,
        run: Run,
        events: Sequence[Event],
        key: str,
        retry_at: float,
        notify: Notify | None,
        commit: Commit,
    ) -> None:
        """Record a denied admission, unless a cancellation arrived during the check (the
        store never parks a cancelling run): a cancelled run is not gated, it settles."""
        now = self.clock.now()
        evs: list[Event] = []
        if needs_gated_event(events):
            evs.append(SingletonGated(key=key, retry_at=retry_at, at=now))
        park = Update(events=evs, release_lease=True, expect_status=_NOT_CANCELLING)
        try:
            await commit(run, park)
        except ConflictError:
            fresh = await self.store.get_run(run.id)
            if fresh is None or fresh.status is not RunStatus.CANCELLING:
                raise
            await commit(
                fresh,
                Update(events=[RunCancelled(at=now)], status=RunStatus.CANCELLED, notify=notify),
            )

    @staticmethod
    def released(run: Run, admitted: bool, now: float) -> list[Event]:
        """The ``singleton_released`` record of a settling run that held a slot."""
        if admitted and run.singleton_key is not None:
            return [SingletonReleased(key=run.singleton_key, at=now)]
        return []
