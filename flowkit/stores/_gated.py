"""The rules of ``claim_gated`` (``base.ClaimsGated``) every bundled store applies: which due
run is a gated waiter decided in its claim, and what the decision stores. The gate itself is
``flowkit.singleton``'s (``admission_tags``, ``denial_patch``), exactly as
``try_admit_singleton`` applies it; only the claim around it is new."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from .. import singleton as _sg
from .._core.run import ADMITTED_TAG, Run, RunStatus
from ..events import Event
from ._capabilities import GateCheck
from .rules import admitted_event, claimable


def gated_waiter(run: Run, now: float) -> bool:
    """Whether ``run`` is a due gated waiter: ``suspended``, tagged, not admitted, unleased,
    claimable at ``now``, its deadline not passed (a passed one is claimed, to be cancelled). A SQL
    store's plain claim in ``claim_gated`` leaves these out, by the same rule in SQL."""
    return (
        run.status is RunStatus.SUSPENDED
        and run.singleton_tag is not None
        and ADMITTED_TAG not in run.tags
        # (a lease left by a worker that died between its denial and the park that records
        # ``singleton_gated``: the plain claim and the worker's gate finish that park)
        and run.lease_owner is None
        and (run.deadline_at is None or run.deadline_at > now)
        and claimable(run, now)
    )


def gated_limit(run: Run, now: float, gate: GateCheck) -> int | None:
    """The key's ``limit`` when ``claim_gated`` decides ``run``'s re-check itself (a
    ``gated_waiter`` of a pair in ``gate.limits``), else ``None`` (a plain claim)."""
    if not gated_waiter(run, now):
        return None
    return gate.limits.get((run.workflow, run.workflow_version))


@dataclass(frozen=True)
class Decision:
    """A gated re-check decided: ``run`` as it must be stored (claimed and admitted, or parked
    again), the ``events`` to append (``singleton_admitted`` when admitted), and the instant
    the key's heads without a timer get (``heads_to_arm``)."""

    run: Run
    events: Sequence[Event]
    admitted: bool
    arm_at: float


def decide(
    run: Run,
    sharing: Sequence[Run],
    limit: int,
    gate: GateCheck,
    owner: str,
    now: float,
    lease_expires: float,
) -> Decision:
    """Decide ``run``'s re-check over ``sharing`` (the key's holders and its ``limit`` oldest
    waiters, and ``run``), under the key's serialization: admitted, it is claimed by ``owner``
    (as ``Store.claim`` would) with the marker and its ``singleton_admitted``; denied, it
    stays ``suspended`` with ``denial_patch``'s ``wake_at`` (every waiter's re-check when
    ``gate.every_waiter_rechecks``, as the engine's park without notify-on-release)."""
    tag = run.singleton_tag
    assert tag is not None
    retry = gate.retry_wake_at(run.deadline_at)
    tags = _sg.admission_tags(sharing, run.id, tag, run.workflow, limit)
    if tags is not None:
        new = dataclasses.replace(
            run,
            tags=tuple(tags),
            status=RunStatus.RUNNING,
            wake_at=None,
            lease_owner=owner,
            lease_expires=lease_expires,
            updated_at=now,
        )
        return Decision(new, [admitted_event(tag, gate.admitted_at())], True, retry)
    patch = _sg.denial_patch(sharing, run.id, tag, run.workflow, retry, limit) or {}
    if patch and gate.every_waiter_rechecks:
        patch["wake_at"] = retry
    return Decision(dataclasses.replace(run, **patch), (), False, retry)


def parked(run: Run) -> Run:
    """What ``claim_gated`` answers for a denied waiter: the run as parked, without payloads
    (``input``, ``output`` and ``error`` are ``None``, as ``list_runs`` returns them)."""
    return dataclasses.replace(run, input=None, output=None, error=None)


__all__ = ["Decision", "decide", "gated_limit", "gated_waiter", "parked"]
