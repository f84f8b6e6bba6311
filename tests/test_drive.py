"""One activation (``flowkit._worker.runner.ActivationRunner``) against a recording worker seat:
what it tells
the worker and the bus as it claims, passes the gate, replays and settles; and the layering
of the engine modules (the worker never sees the ``Engine``; no import circle)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from singleton_kit import inp, make_lane
from test_layering import GRAPH

import flowkit
from flowkit import Event, Run, RunStatus, WorkflowCtx, workflow
from flowkit._model.definition import definition_of
from flowkit._worker.runner import ActivationRunner, Registry, WorkerConfig
from flowkit.events import RunStarted
from flowkit.stores import MemoryStore
from flowkit_testing import VirtualClock

T0 = 1_767_225_600.0


class WorkerHooks:
    """A worker seat that records what the drive asks of it."""

    def __init__(self, room: int = 10) -> None:
        self.running = True
        self._room = room
        self.calls: list[tuple[str, Any]] = []

    def room(self) -> int:
        return self._room

    def attach(self, run_id: str, act: Any) -> None:
        self.calls.append(("attach", run_id))

    def run_claimed(self, run: Run, events: Sequence[Event]) -> None:
        self.calls.append(("run_claimed", (run.id, [e.type for e in events])))

    def dispatch(self, run_id: str) -> None:
        self.calls.append(("dispatch", run_id))

    def again(self, run_id: str) -> None:
        self.calls.append(("again", run_id))

    def wake_by(self, at: float) -> None:
        self.calls.append(("wake_by", at))

    def poke(self) -> None:
        self.calls.append(("poke", None))

    def track(self, run_id: str, proof: Any) -> None:
        pass  # (no renewals here: the proof of the claim is enough)

    def executing(self, run_id: str) -> bool:
        return False

    def resume(self, run_id: str) -> None:
        self.calls.append(("resume", run_id))


@workflow(name="nap")
class Nap:
    async def run(self, ctx: WorkflowCtx, seconds: float) -> str:
        await ctx.step(lambda: "a", name="a")
        await ctx.sleep(seconds)
        return "rested"


def _drive(
    store: MemoryStore, workflows: list[Any], seat: WorkerHooks
) -> tuple[ActivationRunner, list[Any]]:
    registry = Registry()
    for wf in workflows:
        defn = definition_of(wf)
        assert defn is not None
        registry.add(defn, wf)
    settled: list[Any] = []
    config = WorkerConfig(store, VirtualClock(T0), random.Random(3), "me", registry)
    return ActivationRunner(config, seat, lambda rid, run: settled.append((rid, run))), settled


async def _create(
    store: MemoryStore, run_id: str, workflow: str, input: Any, version: str = "1", **kw: Any
) -> None:
    tags = tuple(f"singleton:{kw['singleton_key']}" for _ in [0] if "singleton_key" in kw)
    run = Run(
        id=run_id,
        workflow=workflow,
        workflow_version=version,
        status=RunStatus.PENDING,
        input=input,
        tags=tags,
        created_at=T0,
        updated_at=T0,
        **kw,
    )
    started = RunStarted(at=T0, workflow=workflow, version=version, input=input, tags=list(tags))
    await store.create_run(run, [started])


async def test_a_suspending_activation_asks_the_worker_to_poll_by_its_wake_time() -> None:
    store, seat = MemoryStore(), WorkerHooks()
    drive, settled = _drive(store, [Nap()], seat)
    await _create(store, "n", "nap", 5.0)
    await drive.run("n")
    assert seat.calls == [("attach", "n"), ("wake_by", T0 + 5)]
    run = await store.get_run("n")
    assert run is not None and (run.status, run.lease_owner) == (RunStatus.SUSPENDED, None)
    assert settled == []  # not settled: the worker tells result() when the activation ends

    drive.clock.jump(T0 + 5)  # type: ignore[attr-defined]
    await drive.run("n")
    assert seat.calls[2:] == [("attach", "n")]
    ((rid, snapshot),) = settled
    assert rid == "n" and snapshot.status is RunStatus.COMPLETED and snapshot.output == "rested"


class _NoVersionClaims(MemoryStore):
    """A store without ``claims_by_version``: the drive claims, then gives back."""

    claims_by_version = False


async def test_a_run_claimed_elsewhere_or_of_a_workflow_not_here_is_left_alone() -> None:
    store, seat = MemoryStore(), WorkerHooks()
    drive, settled = _drive(store, [Nap()], seat)
    await _create(store, "other", "elsewhere", None)
    await drive.run("other")  # not claimed: the claim itself asks for this worker's versions
    run = await store.get_run("other")
    assert run is not None and (run.status, run.lease_owner) == (RunStatus.PENDING, None)
    await _create(store, "v2", "nap", 1.0, version="2")  # (Nap is version "1")
    await drive.run("v2")
    run = await store.get_run("v2")
    assert run is not None and (run.status, run.lease_owner) == (RunStatus.PENDING, None)
    old = _NoVersionClaims()
    drive_old, _ = _drive(old, [Nap()], WorkerHooks())
    await _create(old, "other", "elsewhere", None)
    await drive_old.run("other")  # claimed, then its lease given back at once
    run = await old.get_run("other")
    assert run is not None and (run.status, run.lease_owner) == (RunStatus.RUNNING, None)
    await _create(store, "n", "nap", 1.0)
    assert await store.claim("n", "someone", T0, T0 + 30) is not None
    await drive.run("n")  # not claimable: nothing happens
    assert seat.calls == [] and settled == []


async def test_a_denied_run_is_parked_and_the_release_hands_the_slot_over_here() -> None:
    lane = make_lane()
    store, seat = MemoryStore(), WorkerHooks()
    drive, settled = _drive(store, [lane], seat)
    await _create(store, "h", "lane", inp("A", "signal"), singleton_key="A")
    await _create(store, "w", "lane", inp("A"), singleton_key="A")
    await drive.run("h")  # admitted; suspends on its signal
    await drive.run("w")  # denied: parked, never attached
    assert [c for c in seat.calls if c[0] == "attach"] == [("attach", "h")]
    w = await store.get_run("w")
    assert w is not None and w.status is RunStatus.SUSPENDED and not w.admitted
    assert seat.calls[-1] == ("wake_by", w.wake_at)  # its re-check: the poller must not miss it

    await store.deliver_signal("h", "go", "done", T0)
    seat.calls.clear()
    await drive.run("h")  # completes: its release hands w over, leased here
    assert seat.calls == [
        ("attach", "h"),
        ("run_claimed", ("w", ["run_started", "singleton_gated", "singleton_admitted"])),
    ]
    assert [s.status for _, s in settled] == [RunStatus.COMPLETED]
    w = await store.get_run("w")
    assert w is not None and w.admitted and w.lease_owner == "me"


async def test_without_room_the_release_only_wakes_the_waiter() -> None:
    lane = make_lane()
    store, seat = MemoryStore(), WorkerHooks(room=-1)
    drive, _ = _drive(store, [lane], seat)
    await _create(store, "h", "lane", inp("A"), singleton_key="A")
    await _create(store, "w", "lane", inp("A"), singleton_key="A")
    assert await store.try_admit_singleton("h", "singleton:A", "lane", 1, T0 + 1)
    assert not await store.try_admit_singleton("w", "singleton:A", "lane", 1, T0 + 1)
    await drive.run("h")
    assert ("dispatch", "w") in seat.calls
    assert not any(c[0] == "run_claimed" for c in seat.calls)


# -- layering ---------------------------------------------------------------------------------

ORDER = [
    "flowkit._core.clock",
    "flowkit._worker.settlements",
    "flowkit._worker.gate",
    "flowkit._worker.runner",
    "flowkit._worker.worker",
    "flowkit._client.engine",
]
"""The engine, bottom up: a module imports only modules before it."""


def test_the_engine_layer_imports_only_downwards() -> None:
    for i, module in enumerate(ORDER):
        upward = set(GRAPH[module]) & set(ORDER[i:])
        assert not upward, f"{module} imports {sorted(upward)}"
    engine = "flowkit._client.engine"
    assert engine not in {*GRAPH[ORDER[2]], *GRAPH[ORDER[3]], *GRAPH[ORDER[4]]}
    assert not (
        Path(flowkit.__file__).parent / "_singleton.py"
    ).exists()  # (now ``_worker/gate.py``)
