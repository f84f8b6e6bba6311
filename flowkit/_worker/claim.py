"""The claim of a due run by a worker's activation, with a gated waiter's re-check decided in
it when the store can (``stores.base.ClaimsGated``): a denied re-check then costs one
transaction that reads no history and writes the waiter's next ``wake_at`` only, instead of
a claim, a history read, ``try_admit_singleton`` and the commit that parks it again; an
admitted one is claimed with its admission, and across processes a hand-over takes two
commits (the release, this claim) instead of three. The gate's rules are unchanged
(``flowkit.singleton``; docs/singleton.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from .._core.run import Run
from ..stores.base import ClaimsGated, GateCheck, claims_gated
from . import gate as gate

if TYPE_CHECKING:
    from .port import RunnerPort


def gate_check(drive: RunnerPort, now: float) -> GateCheck:
    """What the store needs to decide a re-check for this worker: the ``limit`` of each
    ``(workflow, version)`` registered (1 where the version declares no singleton, as the
    worker-side gate takes it), the jittered retry from ``now`` (the injected RNG, one draw
    per decision as the worker-side gate's), and whether every waiter keeps a re-check
    (notify-on-release off)."""
    cfg = drive.config
    reg = cfg.registry
    limits: dict[tuple[str, str], int] = {}
    for name, version in reg.pairs():
        entry = reg.get(name, version)
        if entry is not None:
            sg = entry[0].singleton
            limits[(name, version)] = sg.limit if sg is not None else 1
    rng = cfg.rng
    return GateCheck(
        limits,
        lambda deadline: gate.retry_wake_at(now, rng, deadline),
        drive.clock.now,
        every_waiter_rechecks=not cfg.notify_on_release,
    )


async def claim(drive: RunnerPort, run_id: str, now: float) -> Run | None:
    """Claim ``run_id`` for ``drive``'s worker: the run leased here, or ``None``. A gated
    waiter the store denied comes back parked (not leased): the worker's poller is told of
    its next re-check (``ActivationRunner.follow``) and ``None`` returned."""
    cfg = drive.config
    store = drive.store
    until = now + cfg.lease_ttl
    versions = cfg.registry.pairs() if drive.by_version else None
    kw: dict[str, Any] = {} if versions is None else {"versions": versions}
    if claims_gated(store):
        kw["gate"] = gate_check(drive, now)
    if not kw:
        return await store.claim(run_id, drive.owner, now, until)
    got = await cast(ClaimsGated, store).claim(run_id, drive.owner, now, until, **kw)
    if got is not None and got.lease_owner != drive.owner:
        drive.follow(got)  # a denied re-check: parked until its next one
        return None
    return got


__all__ = ["claim", "gate_check"]
