"""The gated claim (``stores.base.ClaimsGated``, issue #24) leaves alone the runs it must not
decide itself."""

from __future__ import annotations

from typing import Any

from singleton_kit import get, inp, make_lane, types

from flowkit import Engine, RunStatus
from flowkit_testing import Rule, TestEnv


async def test_a_waiter_whose_worker_died_after_its_denial_is_parked_with_its_gated_record(
    store: Any,
) -> None:
    """The worker's gate check denies a pending waiter (``try_admit_singleton`` stores it
    ``suspended`` under the worker's lease) and the worker dies before the commit that
    records ``singleton_gated`` and gives the lease back. Once that lease expires, the next
    re-check must still record the denial (docs/singleton.md: ``singleton_gated``
    once per waiting episode) and leave no lease of the dead worker: the claim cannot decide
    this run without its history."""
    lane = make_lane()
    async with TestEnv([lane], instances=2, lease_ttl=30, store=store, gate_polls=True) as env:
        await env.start("lane", inp("A", "signal"), "h")  # the holder, in its signal wait
        await env.settle()
        assert (await get(env, "h")).admitted
        client = Engine(env.store, [lane], clock=env.clock, worker=False)
        env.inject(Rule("try_admit_singleton", "crash", "after", match=lambda a, k: a[0] == "w"))
        await client.start("lane", inp("A"), "w")  # pending: a worker's gate denies it
        await env.advance(0)
        assert len(env.crashed) == 1
        dead = await get(env, "w")
        assert dead.status is RunStatus.SUSPENDED and dead.lease_owner is not None
        assert "singleton_gated" not in await types(env, "w")  # (the park never committed)
        await env.advance(35)  # the dead worker's lease expires; the waiter re-checks
        w = await get(env, "w")
        assert w.status is RunStatus.SUSPENDED and not w.admitted
        assert w.lease_owner is None, w  # no lease of a dead worker left on a parked waiter
        assert "singleton_gated" in await types(env, "w")
        await env.signal("h", "go")
        await env.advance(3)
        assert (await get(env, "w")).status is RunStatus.COMPLETED
        t = await types(env, "w")
        assert t.index("singleton_gated") < t.index("singleton_admitted")
        assert lane.body["w"] == 1
