"""The run-state rules every store applies, public for custom stores (docs/stores.md).

``MemoryStore`` applies them directly; ``SqlStore`` decides its general paths with them and
mirrors ``claimable``/``due_time`` in SQL, next to its claim statement."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .. import singleton as _sg
from .._core.run import ACTIVE_STATUSES, ADMITTED_TAG, SINGLETON_TAG_PREFIX, Run, RunStatus
from .._core.search_terms import merged
from ..errors import ConflictError, LeaseLostError
from ..events import Event, SingletonAdmitted
from .base import UNSET, Admission, Notify, Update


def apply_update(run: Run, u: Update, now: float, inbox_names: set[str]) -> Run:
    """The run after ``u``: shared by stores so the sticky-cancel and terminal rules agree."""
    changes: dict[str, Any] = {"updated_at": now}
    status = u.status
    if status is not None:
        if run.status is RunStatus.CANCELLING and status.active:
            if status is RunStatus.SUSPENDED and u.wake_at is not UNSET:
                changes["wake_at"] = now  # deliver the cancellation at once
            status = RunStatus.CANCELLING
        changes["status"] = status
    if u.output is not UNSET:
        changes["output"] = u.output
    if u.error is not UNSET:
        changes["error"] = u.error
    if u.wake_at is not UNSET and "wake_at" not in changes:
        changes["wake_at"] = u.wake_at
    if u.waiting_signals is not None:
        changes["waiting_signals"] = u.waiting_signals
        if inbox_names & set(u.waiting_signals):  # a signal arrived while it ran: due now
            changes["wake_at"] = now
    if u.attempt is not None:
        changes["attempt"] = u.attempt
    if u.input is not UNSET:
        changes["input"] = u.input
    if u.deadline_at is not UNSET:
        changes["deadline_at"] = u.deadline_at
    if u.recoveries is not None:
        changes["recoveries"] = u.recoveries
    if u.successor is not None:
        changes["continued_as"] = u.successor.run.id
    search = u.search if u.search is not None else merged(run.search, u.events)
    if search is not None:
        changes["search"] = dict(search)
    if u.release_lease:
        changes["lease_owner"] = None
        changes["lease_expires"] = None
    if status is not None and not status.active:
        changes.update(
            tags=tuple(t for t in run.tags if t != ADMITTED_TAG),
            lease_owner=None,
            lease_expires=None,
            wake_at=None,
            waiting_signals=(),
        )
    return dataclasses.replace(run, **changes)


def admit_new(
    run: Run, events: Sequence[Event], admission: Admission, sharing: Sequence[Run]
) -> tuple[Run, list[Event]]:
    """Admission at creation, for every store: the new ``run`` as it must be stored and its
    events, decided over ``sharing`` (the active runs of the admission's workflow carrying its
    tag, read under the key's serialization) with the shared helpers. Admitted: the run with
    the admission marker. Denied: parked as ``denial_patch`` says (a first denial: a timer
    wherever it stands in the queue), without a lease, with
    ``admission.gated`` after ``events``. A run the helpers neither admit nor park (a
    cancelling or settled one) is stored as passed."""
    if run.workflow != admission.workflow or admission.tag not in run.tags:
        raise ValueError(
            f"admission of run {run.id!r} ({run.workflow!r}, tags {list(run.tags)!r}) for "
            f"{admission.workflow!r} / {admission.tag!r}: the run does not carry the key"
        )
    runs = [r for r in sharing if r.id != run.id]
    runs.append(run)
    wf, tag = admission.workflow, admission.tag
    tags = _sg.admission_tags(runs, run.id, tag, wf, admission.limit)
    if tags is not None:
        admitted = admission.admitted
        if admission.clock is not None:  # dated now, inside the transaction (Admission.clock)
            at = admission.clock()
            admitted = tuple(e.model_copy(update={"at": at}) for e in admitted)
        return dataclasses.replace(run, tags=tuple(tags)), [*events, *admitted]
    patch = _sg.denial_patch(runs, run.id, tag, wf, admission.retry_wake_at)
    if not patch:
        return run, list(events)
    parked = dataclasses.replace(run, **patch, lease_owner=None, lease_expires=None)
    return parked, [*events, *admission.gated]


def admitted_event(tag: str, at: float) -> SingletonAdmitted:
    """The ``singleton_admitted`` record a store with ``records_admission`` appends when it
    sets a run's admission marker for ``tag`` (``"singleton:" + key``)."""
    return SingletonAdmitted(key=tag.removeprefix(SINGLETON_TAG_PREFIX), at=at)


def check_commit(run: Run, owner: str | None, now: float, update: Update) -> None:
    """``commit``'s preconditions, for every store, checked before anything is written: the
    caller's lease (``owner``), or no live lease unless ``ignore_lease``, and the expected
    status."""
    if owner is not None:
        if run.lease_owner != owner:
            raise LeaseLostError(run.id)
    elif not update.ignore_lease and run.leased(now):
        raise ConflictError(f"run {run.id!r} is leased by {run.lease_owner!r}")
    if update.expect_status is not None and run.status not in update.expect_status:
        raise ConflictError(f"run {run.id!r} is {run.status}")


def plan_release(sharing: Sequence[Run], n: Notify, now: float) -> list[tuple[Run, Run | None]]:
    """Notify-on-release inside the releasing transaction, for every store: each waiter the
    freed slots go to, oldest first, paired with its admitted and claimed snapshot when the
    slot is handed over (``n.claim_owner`` set, the limit known, the waiter not leased and of
    one of ``n.claim_versions``), else ``None`` (stamp ``wake_at=now``; it admits itself). A
    store that can lose the race for a waiter's row (PostgreSQL) applies the claim
    conditionally and wakes it on a miss."""
    runs = list(sharing)
    plan: list[tuple[Run, Run | None]] = []
    for wid in _sg.waiters_to_wake(runs, n.tag, n.workflow, n.limit):
        w = next(r for r in runs if r.id == wid)
        tags = None
        room = n.max_hand_offs is None or sum(a is not None for _, a in plan) < n.max_hand_offs
        if (
            n.claim_owner is not None
            and n.limit is not None
            and room
            and hand_off_ok(w, now)
            and (n.claim_versions is None or w.workflow_version in n.claim_versions)
        ):
            tags = _sg.admission_tags(runs, wid, n.tag, n.workflow, n.limit)
        if tags is None:
            plan.append((w, None))
            continue
        admitted = dataclasses.replace(
            w,
            tags=tuple(tags),
            status=RunStatus.RUNNING,
            wake_at=None,
            lease_owner=n.claim_owner,
            lease_expires=n.lease_expires,
            updated_at=now,
        )
        runs = [admitted if r.id == wid else r for r in runs]
        plan.append((w, admitted))
    return plan


def hand_off_ok(run: Run, now: float) -> bool:
    """A waiter a release may claim: not cancelling, no live lease (its wake time, the gate's
    re-check, is what the release brings forward)."""
    return run.status in (
        RunStatus.PENDING,
        RunStatus.RUNNING,
        RunStatus.SUSPENDED,
    ) and not run.leased(now)


def of_versions(run: Run, versions: Sequence[tuple[str, str]] | None) -> bool:
    """Whether a worker with ``versions`` (``base.ClaimsByVersion``; ``None``: any) may claim
    ``run``: its ``(workflow, workflow_version)`` is one of them."""
    return versions is None or (run.workflow, run.workflow_version) in versions


def lost_activation(run: Run) -> bool:
    """Whether taking ``run``'s lease away from its owner (a claim of an expired lease, or
    ``release_leases`` of a restarted worker) takes over an activation that died: the run was
    ``running`` or ``cancelling`` under a lease nobody gave back. Stores count these in
    ``Run.recoveries``, atomically with the claim (``max_recovery_attempts``); a graceful
    stop gives its leases back first, so it never counts. (A release's hand-off takes only
    singleton waiters, whose body never ran: it counts nothing.)"""
    return run.lease_owner is not None and run.status in (
        RunStatus.RUNNING,
        RunStatus.CANCELLING,
    )


def claimable(run: Run, now: float) -> bool:
    """The claim rule every store applies (see ``Store.claim``)."""
    if run.status not in ACTIVE_STATUSES or run.leased(now):
        return False
    if run.status in (RunStatus.PENDING, RunStatus.RUNNING):
        return True
    if run.status is RunStatus.CANCELLING and run.wake_at is None:
        return True
    return run.wake_at is not None and run.wake_at <= now


def due_time(run: Run) -> float | None:
    """When an active run becomes claimable (its lease expiry or wake time)."""
    if run.lease_owner is not None and run.lease_expires is not None:
        t = run.lease_expires
        if run.status not in (RunStatus.PENDING, RunStatus.RUNNING) and run.wake_at is not None:
            t = max(t, run.wake_at)
        return t
    if run.status is RunStatus.PENDING:
        return run.created_at
    if run.status is RunStatus.RUNNING or (
        run.status is RunStatus.CANCELLING and run.wake_at is None
    ):
        return run.updated_at
    return run.wake_at


__all__ = [
    "admit_new",
    "admitted_event",
    "apply_update",
    "check_commit",
    "claimable",
    "due_time",
    "hand_off_ok",
    "lost_activation",
    "of_versions",
    "plan_release",
]
