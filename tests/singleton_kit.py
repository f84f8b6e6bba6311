"""Shared workflows and helpers of the singleton tests (``tests/test_singleton_*.py``,
``tests/test_gate_*.py`` and more).

``make_lane`` builds a fresh singleton workflow per test (its own ``Singleton`` config and its
own probes), so no test leaks state into another."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel

from flowkit import (
    ADMITTED_TAG,
    Event,
    History,
    Run,
    RunStatus,
    Singleton,
    WorkflowCtx,
    workflow,
)
from flowkit._worker.gate import GATE_JITTER, GATE_RETRY
from flowkit.singleton import HEAD_RECHECK
from flowkit_testing import TestEnv

RETRY = 1.0
JITTER = 0.25


class LaneIn(BaseModel):
    """``key`` picks the singleton key; ``hold`` picks where an admitted run waits:
    ``signal`` ("go", the payload is returned), ``sleep`` (``seconds``), ``event`` (a step
    awaiting ``lane.gates[run_id]``, an asyncio.Event outside the engine) or nowhere."""

    key: str
    hold: Literal["none", "signal", "sleep", "event"] = "none"
    seconds: float = 0.0


def make_lane(
    name: str = "lane",
    *,
    limit: int = 1,
    max_queue_depth: int | None = None,
    key: Callable[[Any], Any] | None = None,
) -> Any:
    """A singleton workflow instance with probes:

    * ``body[run_id]``: how many activations entered the body (replays included);
    * ``entered``: run ids in the order their first step executed;
    * ``finished``: run ids in the order their last step executed (re-run after a retry);
    * ``fail``: run ids whose last step raises;
    * ``gates[run_id]``: the asyncio.Event the ``event`` hold awaits."""

    sg = Singleton(key=key or (lambda i: i.key), limit=limit, max_queue_depth=max_queue_depth)

    @workflow(name=name, singleton=sg)
    class Lane:
        def __init__(self) -> None:
            self.body: Counter[str] = Counter()
            self.entered: list[str] = []
            self.finished: list[str] = []
            self.fail: set[str] = set()
            self.gates: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

        def enter(self, run_id: str) -> str:
            self.entered.append(run_id)
            return run_id

        async def block(self, run_id: str) -> str:
            await self.gates[run_id].wait()
            return "released"

        def leave(self, run_id: str) -> str:
            if run_id in self.fail:
                raise RuntimeError(f"boom in {run_id}")
            self.finished.append(run_id)
            return run_id

        async def run(self, ctx: WorkflowCtx, input: LaneIn) -> Any:
            self.body[ctx.run_id] += 1
            await ctx.step(self.enter, ctx.run_id)
            got: Any = None
            if input.hold == "signal":
                got = await ctx.wait_for_signal("go")
            elif input.hold == "sleep":
                await ctx.sleep(input.seconds)
            elif input.hold == "event":
                await ctx.step(self.block, ctx.run_id)
            await ctx.step(self.leave, ctx.run_id)
            return got

    return Lane()


def inp(key: str = "k", hold: str = "none", seconds: float = 0.0) -> dict[str, Any]:
    return {"key": key, "hold": hold, "seconds": seconds}


async def get(env: TestEnv, run_id: str) -> Run:
    """The run as stored (read from the shared store: works while instance 0 is crashed)."""
    run = await env.store.get_run(run_id)
    assert run is not None, run_id
    return run


async def history(env: TestEnv, run_id: str) -> History:
    return History(run_id, await env.store.load_events(run_id))


async def types(env: TestEnv, run_id: str) -> list[str]:
    return (await history(env, run_id)).types


async def events_of(env: TestEnv, run_id: str, type_: str) -> list[Event]:
    return [e for e in await history(env, run_id) if e.type == type_]


class AdmissionCall(NamedTuple):
    """One admission decision of the store: ``op`` is ``"create_run"`` (admission at creation,
    ``Admission``) or ``"try_admit_singleton"`` (the worker's gate check)."""

    op: str
    run_id: str
    ok: bool
    before: dict[str, Run]  # the runs as they were before the call


def spy_admissions(env: TestEnv) -> list[AdmissionCall]:
    """Record every admission the store decides: each ``try_admit_singleton`` call, each
    ``create_run`` with an ``admission`` that created its run, and each gated waiter's
    re-check decided by a ``claim`` with ``gate`` (admitted or parked again)."""
    calls: list[AdmissionCall] = []
    store = env.store
    real = store.try_admit_singleton
    real_create = store.create_run

    async def spy(run_id: str, *args: Any, **kwargs: Any) -> bool:
        before = {r.id: r for r in await store.list_runs()}
        ok = await real(run_id, *args, **kwargs)
        calls.append(AdmissionCall("try_admit_singleton", run_id, ok, before))
        return bool(ok)

    async def spy_create(run: Run, events: Any, **kwargs: Any) -> tuple[Run, bool]:
        before = {r.id: r for r in await store.list_runs()}
        stored, created = await real_create(run, events, **kwargs)
        if created and kwargs.get("admission") is not None:
            calls.append(AdmissionCall("create_run", run.id, stored.admitted, before))
        return stored, created

    real_claim = store.claim

    async def spy_claim(run_id: str, *args: Any, **kwargs: Any) -> Any:
        before = {r.id: r for r in await store.list_runs()}
        got = await real_claim(run_id, *args, **kwargs)
        was = before.get(run_id)
        # a gated waiter's re-check decided in the claim (``ClaimsGated``): admitted, or parked
        gated = was is not None and was.singleton_key is not None and not was.admitted
        if kwargs.get("gate") is not None and gated and got is not None:
            calls.append(AdmissionCall("claim", run_id, got.admitted, before))
        return got

    store.try_admit_singleton = spy
    store.create_run = spy_create
    store.claim = spy_claim
    return calls


async def holders(env: TestEnv, workflow_name: str = "lane") -> list[str]:
    """Ids of active runs carrying the admission marker, oldest first."""
    return [
        r.id
        for r in await env.store.list_runs(workflow=workflow_name)
        if r.status.active and ADMITTED_TAG in r.tags
    ]


async def assert_gated(env: TestEnv, run_id: str) -> None:
    """The run waits at its gate: suspended, unmarked, and a ``singleton_gated`` recorded."""
    run = await get(env, run_id)
    assert run.status == "suspended", run
    assert ADMITTED_TAG not in run.tags
    t = await types(env, run_id)
    assert "singleton_gated" in t
    assert t[-1] == "singleton_gated", t


# a head's timer is never further off than a denied head's jittered re-check
SOON = max(GATE_RETRY + GATE_JITTER, HEAD_RECHECK) + 1e-6


def unarmed_heads(runs: Iterable[Run], limit: int, now: float) -> list[str]:
    """The heads of every queue (per namespace, workflow and key: the ``limit`` oldest runs
    of the key without a slot, a ``cancelling`` one included until it settles and notifies)
    that are parked without a re-check due within ``SOON``: none may exist."""
    queues: defaultdict[tuple[Any, ...], list[Run]] = defaultdict(list)
    for r in runs:
        if r.singleton_key is not None and r.status.active and ADMITTED_TAG not in r.tags:
            queues[(r.namespace, r.workflow, r.singleton_key)].append(r)
    bad = []
    for q in queues.values():
        for r in sorted(q, key=lambda r: (r.created_at, r.id))[:limit]:
            if r.status is RunStatus.SUSPENDED and (r.wake_at is None or r.wake_at > now + SOON):
                bad.append(r.id)
    return bad
