"""Deep queues with engines with and without notify-on-release on one key (issue #24 item 1,
found in review): no head of a key's queue is left without a re-check timer, so that nothing
would ever admit it (docs/singleton.md: no waiter is stranded for ever).

The waiters behind the head are parked without a timer by the re-check of an engine with
notify-on-release;
a waiter ahead of them then settles on an engine *without* it (``notify_on_release=False``,
another process of the same deployment, or the same engine reconfigured): that settling
commit carries no ``Notify``, so no store arms the next head, and the holder's release on
that engine notifies nobody either."""

from __future__ import annotations

import functools
from typing import Any

from singleton_kit import get, inp, make_lane

from flowkit import RunStatus, Singleton, WorkflowCtx, workflow
from flowkit.singleton import HEAD_RECHECK
from flowkit_testing import TestEnv


async def test_a_waiter_cancelled_during_its_check_on_a_notify_off_engine_strands_the_next(
    store: Any,
) -> None:
    """e0 (notify-on-release) queues w1 (the head, with a timer), w2 and w3 (no timer) behind
    the holder h, then stops. e1 has ``notify_on_release=False``. w1 is cancelled while e1
    checks it: e1 settles it ``cancelled`` without a ``Notify`` (``Gate._park``'s conflict
    path with ``notify=None``), so w2 becomes the head with no timer. h then completes on
    e1, which wakes nobody either: w2 is never claimed again, however long we wait."""
    lane = make_lane()
    async with TestEnv([lane], instances=2, store=store, gate_polls=True) as env:
        e0, e1 = env.engines
        await e0.start("lane", inp("K", "signal"), "h")
        for w in ("w1", "w2", "w3"):
            await e0.start("lane", inp("K"), w)
        # a first denial re-checks (docs/singleton.md, "Deep queues"); a re-check behind the head
        # parks without a timer
        assert [(await get(env, w)).wake_at is None for w in ("w1", "w2", "w3")] == [False] * 3
        await env.advance(1.5)
        e1.notify_on_release = False
        assert [(await get(env, w)).wake_at is None for w in ("w1", "w2", "w3")] == [
            False,
            True,
            True,
        ]
        await env.crash(0)  # from here on only e1 (notify-off) works the queue

        real = env.store.try_admit_singleton
        cancelled: list[str] = []

        @functools.wraps(real)
        async def cancel_during_check(run_id: str, *a: Any, **kw: Any) -> Any:
            if run_id == "w1" and not cancelled:  # engine.cancel lands mid-check
                cancelled.append(run_id)
                await e1.cancel("w1")
            return await real(run_id, *a, **kw)

        env.store.try_admit_singleton = cancel_during_check
        real_claim = env.store.claim

        @functools.wraps(real_claim)
        async def cancel_during_claim(run_id: str, *a: Any, **kw: Any) -> Any:
            # (a store that decides the re-check in the claim, ``ClaimsGated``: the check is
            # the claim, and the cancellation lands just before it)
            if run_id == "w1" and kw.get("gate") is not None and not cancelled:
                cancelled.append(run_id)
                await e1.cancel("w1")
            return await real_claim(run_id, *a, **kw)

        env.store.claim = cancel_during_claim
        await env.advance(2)  # w1's re-check: cancelled during it
        assert cancelled == ["w1"]
        assert (await get(env, "w1")).status is RunStatus.CANCELLED
        await e1.signal("h", "go")
        await env.advance(60)
        assert (await get(env, "h")).status is RunStatus.COMPLETED
        w2 = await get(env, "w2")
        # the head of the queue, with a free slot: it must get it (by a re-check at least)
        assert (w2.status, w2.admitted, w2.wake_at) != (RunStatus.SUSPENDED, False, None), w2
        await env.run_until_idle()
        assert [(await get(env, w)).status for w in ("w2", "w3")] == [RunStatus.COMPLETED] * 2


TIMEOUT = 100.0


def timed_versions() -> list[Any]:
    """One singleton workflow ``timed`` (limit 1, key ``input["key"]``) in two versions: "1"
    without a deadline, "2" timing out ``TIMEOUT`` s after a start. ``hold == "signal"``:
    wait for "go"."""

    async def body(ctx: WorkflowCtx, input: dict[str, str]) -> str:
        if input.get("hold") == "signal":
            await ctx.wait_for_signal("go")
        return ctx.run_id

    sg = Singleton(key=lambda i: i["key"])

    @workflow(name="timed", version="1", singleton=sg)
    class V1:
        async def run(self, ctx: WorkflowCtx, input: dict[str, str]) -> str:
            return await body(ctx, input)

    @workflow(name="timed", version="2", singleton=sg, execution_timeout=TIMEOUT)
    class V2:
        async def run(self, ctx: WorkflowCtx, input: dict[str, str]) -> str:
            return await body(ctx, input)

    return [V1(), V2()]


async def test_a_head_timing_out_on_a_notify_off_engine_strands_the_next(store: Any) -> None:
    """The holder h (version 1: no deadline) keeps the slot; w1 (the head, with a timer), w2
    and w3 (no timer: parked by the notify-on engine e0) wait (version 2: a deadline). e0
    stops; the notify-off engine e1 claims w1 at its deadline and settles it ``cancelled``
    without a ``Notify`` (``_bounds._deadline_passed`` drops it), so w2 is a head without
    a timer. h then completes on e1, which notifies nobody: w2 (and w3 behind it) are
    never admitted."""
    async with TestEnv(timed_versions(), instances=2, store=store, gate_polls=True) as env:
        e0, e1 = env.engines
        await e0.start("timed", {"key": "K", "hold": "signal"}, "h", version="1")
        await env.advance(1)
        for w in ("w1", "w2", "w3"):  # deadlines t0 + 101, + 106, + 111
            if w != "w1":
                await env.advance(5)
            await e0.start("timed", {"key": "K"}, w, version="2")
        await env.advance(1.5)  # (their first re-checks: w2 and w3 park behind the head)
        e1.notify_on_release = False
        w2 = await get(env, "w2")
        assert w2.wake_at == w2.deadline_at  # behind the head: no timer
        await env.crash(0)  # only the notify-off engine e1 works the queue from here on
        await env.advance(TIMEOUT - 10.5 + 0.5)  # past w1's deadline (t0 + 101.5)
        assert (await get(env, "w1")).status is RunStatus.CANCELLED
        w2 = await get(env, "w2")
        assert w2.status is RunStatus.SUSPENDED and not w2.admitted
        await e1.signal("h", "go")  # the holder completes on e1: no notification
        await env.advance(1)  # (t0 + 102.5: before w2's deadline)
        assert (await get(env, "h")).status is RunStatus.COMPLETED
        w2 = await get(env, "w2")
        # the head of the queue with a free slot: due within ~1 s (here: only at its
        # deadline, where it is cancelled without ever having had the free slot)
        soon = env.clock.now() + HEAD_RECHECK + 0.25
        parked = w2.status is RunStatus.SUSPENDED and not w2.admitted
        assert not (parked and (w2.wake_at is None or w2.wake_at > soon)), w2
        await env.run_until_idle()
        assert (await get(env, "w2")).status is RunStatus.COMPLETED
