"""Public helpers for stores that implement singleton admission (docs/singleton.md,
"Implementing admission in your own store").

A store calls these *inside* its atomic admission transaction, after it has serialized
competing claims of the key (a lock, ``BEGIN IMMEDIATE``, an advisory lock...) and read the
workflow's runs carrying the key's tag. The bundled stores use them too, so every store selects
holders and waiters the same way."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from ._core.run import ACTIVE_STATUSES, ADMITTED_TAG, RunStatus


class RunLike(Protocol):
    """What the helpers read of a run: a ``Run`` or any object with these attributes."""

    @property
    def id(self) -> str: ...
    @property
    def workflow(self) -> str: ...
    @property
    def status(self) -> Any: ...
    @property
    def tags(self) -> Any: ...
    @property
    def created_at(self) -> float: ...


def _status(run: RunLike) -> RunStatus:
    s = run.status
    return s if s.__class__ is RunStatus else RunStatus(s)  # (the enum call costs a microsecond)


def _sharing(runs: Iterable[RunLike], tag: str, workflow: str) -> list[RunLike]:
    return [
        r
        for r in runs
        if r.workflow == workflow and tag in r.tags and _status(r) in ACTIVE_STATUSES
    ]


def _order(run: RunLike) -> tuple[float, str]:
    return (run.created_at, run.id)


def check_limit(limit: object) -> int:
    """``limit`` as a slot count: an ``int`` >= 1, else ``ValueError`` (as ``Singleton(limit=)``
    says). A store checks it before it reads or writes anything: a key with no slot would
    park its runs for ever."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"a singleton limit must be an int >= 1, got {limit!r}")
    return limit


def holders(runs: Iterable[RunLike], tag: str, workflow: str) -> list[RunLike]:
    """Active runs of ``workflow`` with ``tag`` that carry the admission marker."""
    return [r for r in _sharing(runs, tag, workflow) if ADMITTED_TAG in r.tags]


def waiters(runs: Iterable[RunLike], tag: str, workflow: str) -> list[RunLike]:
    """Active, unmarked, non-cancelling runs sharing the key, oldest ``(created_at, id)`` first
    (FIFO ties by the id's code points: what a SQL store must order by too, whatever the
    database's collation)."""
    return sorted(
        (
            r
            for r in _sharing(runs, tag, workflow)
            if ADMITTED_TAG not in r.tags and _status(r) is not RunStatus.CANCELLING
        ),
        key=_order,
    )


def admission_tags(
    runs: Iterable[RunLike], run_id: str, tag: str, workflow: str, limit: int
) -> list[str] | None:
    """The tags ``run_id`` must persist to be admitted, or ``None`` when it must wait.

    Existing holders keep their slots; the ``limit - holders`` free slots go to the oldest
    waiters by ``(created_at, id)`` (ids in code-point order, as Python compares ``str``). A
    holder is re-admitted as it is (idempotent); a cancelling or terminal run is never admitted.
    A ``limit`` below 1 raises ``ValueError`` (``check_limit``)."""
    check_limit(limit)
    runs = list(runs)
    me = next((r for r in runs if r.id == run_id), None)
    if me is None or me.workflow != workflow or tag not in me.tags:
        return None
    if ADMITTED_TAG in me.tags and _status(me) in ACTIVE_STATUSES:
        return list(me.tags)
    if _status(me) not in ACTIVE_STATUSES or _status(me) is RunStatus.CANCELLING:
        return None
    free = limit - len(holders(runs, tag, workflow))
    if free <= 0:
        return None
    first = [r.id for r in waiters(runs, tag, workflow)[:free]]
    if run_id not in first:
        return None
    return [*me.tags, ADMITTED_TAG]


HEAD_RECHECK = 1.0
"""Seconds until a waiter that a release or an admission made a head re-checks its gate (the
safety net for a lost notification; a denied head re-checks after the gate's jittered
``GATE_RETRY`` instead)."""


def heads(runs: Iterable[RunLike], tag: str, workflow: str, limit: int | None) -> list[RunLike]:
    """The key's head waiters: the oldest ``limit`` (one when unknown) of ``waiters``, the only
    ones free slots can go to, so the only ones that keep a re-check timer."""
    return waiters(runs, tag, workflow)[: 1 if limit is None else max(limit, 1)]


def heads_to_arm(
    runs: Iterable[RunLike], tag: str, workflow: str, limit: int | None, at: float
) -> list[str]:
    """The head waiters (``heads``) parked without a re-check due by ``at``: a store gives
    each ``wake_at=at`` in the transaction that made it a head (a release, an admission, a
    denial, a cancelled waiter ahead of it), so that a lost notification delays a head by about
    ``HEAD_RECHECK`` at most. Waiters behind the heads hold no timer."""
    out = []
    for r in heads(runs, tag, workflow, limit):
        wake = getattr(r, "wake_at", None)
        if _status(r) is RunStatus.SUSPENDED and (wake is None or wake > at):
            out.append(r.id)
    return out


def denial_patch(
    runs: Iterable[RunLike],
    run_id: str,
    tag: str,
    workflow: str,
    retry_wake_at: float | None,
    limit: int | None = None,
) -> dict[str, Any] | None:
    """The patch that parks a denied waiter, or ``None`` when nothing may change.

    A denied active waiter becomes ``suspended``. With the key's ``limit`` (and ``runs``
    holding at least its holders and ``limit`` oldest waiters), only a head waiter
    (``heads``) gets ``wake_at=retry_wake_at``; one behind them keeps no timer (``wake_at``
    its ``deadline_at``, ``None`` without one) until a release or an admission makes it a
    head (``heads_to_arm``). Without ``limit`` every denied waiter re-checks at
    ``retry_wake_at``. A terminal or cancelling run is never touched, and without
    ``retry_wake_at`` nothing is parked."""
    if retry_wake_at is None:
        return None
    runs = list(runs)
    me = next((r for r in runs if r.id == run_id), None)
    if me is None or me.workflow != workflow or tag not in me.tags:
        return None
    status = _status(me)
    if status not in ACTIVE_STATUSES or status is RunStatus.CANCELLING:
        return None
    if ADMITTED_TAG in me.tags:
        return None
    if limit is not None and all(r.id != run_id for r in heads(runs, tag, workflow, limit)):
        deadline = getattr(me, "deadline_at", None)
        return {"status": RunStatus.SUSPENDED, "wake_at": deadline}
    return {"status": RunStatus.SUSPENDED, "wake_at": retry_wake_at}


def waiters_to_wake(
    runs: Iterable[RunLike], tag: str, workflow: str, limit: int | None
) -> list[str]:
    """Notify-on-release: the oldest gated waiters that the free slots can take now.

    ``limit=None`` (the releasing engine does not know the workflow's limit) wakes the one
    waiter the released slot can surely take; any other free slot is caught by its timer.
    Any other ``limit`` below 1 raises ``ValueError`` (``check_limit``)."""
    runs = list(runs)
    if limit is None:
        return [r.id for r in waiters(runs, tag, workflow)[:1]]
    check_limit(limit)
    free = limit - len(holders(runs, tag, workflow))
    if free <= 0:
        return []
    return [r.id for r in waiters(runs, tag, workflow)[:free]]


__all__ = [
    "HEAD_RECHECK",
    "RunLike",
    "admission_tags",
    "check_limit",
    "denial_patch",
    "heads",
    "heads_to_arm",
    "holders",
    "waiters",
    "waiters_to_wake",
]
