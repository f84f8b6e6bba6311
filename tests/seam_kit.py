"""The seam suite's harness (tests/test_seams.py): one small scenario per pair of features
that touch the same run, run once without a crash (the baseline), then once per crash point
and pass of it, and checked against the baseline.

A scenario is a list of workflows built on an ``Effects`` object (every side effect of a
step or a compensation goes through it and is counted there, outside the store) and a
``drive`` coroutine that talks to the runs through a ``Driver``: a client engine that is
not an instance of the ``TestEnv`` (an outside caller: it never crashes), and the
environment's clock.

What each crashed variant must show (``check``):

* **exactly-once effects**: no execution of a step or compensation begins once its outcome
  is recorded (the effect looks for its own record in the store before it acts); every
  recorded effect was executed; an effect executed twice only where a crash hit between its
  execution and its record (at most once per crash); and each run records the same effects
  (steps, compensations, signals, updates, events, children, continuations, patches, its
  terminal event) as many times as the baseline did;
* **the same outcome**: the same runs (no second child, successor or scheduled run), each
  with the baseline's status and output, and the same replies to ``engine.update``;
* **no stranded run**: every run settled, or parked where the scenario says it parks; no
  singleton waiter without a timer and without a holder;
* **histories that replay**: gap-free, and ``flowkit.replay_async`` accepts each one with
  its workflow's code.

The crash points are enumerated from ``flowkit_testing._faults.CRASH_SITES``: a probe rule
counts how many times the baseline passes each one, and each variant crashes the instance
that passes point ``p`` for the ``n``-th time (whichever instance that is), then restarts
it and lets the environment recover."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import flowkit
from flowkit import ADMITTED_TAG, Engine, History, Run, RunStatus
from flowkit._model.definition import definition_of
from flowkit.events import (
    ChildCompleted,
    ChildFailed,
    ChildStarted,
    CompensationCompleted,
    CompensationFailed,
    Event,
    EventReceived,
    PatchMarker,
    RunCancelled,
    RunCompleted,
    RunContinued,
    RunFailed,
    SignalReceived,
    StepCompleted,
    StepFailed,
    UpdateReceived,
    UpdateReplied,
)
from flowkit_testing import InstanceCrashed, TestEnv
from flowkit_testing._faults import CRASH_SITES, Rule

CRASH_POINTS = tuple(CRASH_SITES)
"""Every named crash point the harness exposes, in its own order."""


class Boom(Exception):
    """A step's planned failure; its message is the effect's key."""


# -- effects, counted outside the store ----------------------------------------------------


class Effects:
    """Every side effect of the scenario's steps and compensations, counted by key.

    ``do`` is a step: it records its execution, checks it was not recorded already, and, for
    a singleton run, that its run is its key's only holder. ``fail`` makes it fail its first
    ``fail`` attempts (the attempt is read from the store: one more than the failures
    recorded for this effect, so a re-execution after a crash is the same attempt)."""

    def __init__(self) -> None:
        self.env: TestEnv | None = None
        self.executed: Counter[str] = Counter()
        self.violations: list[str] = []

    async def _events(self, run_id: str) -> list[Event]:
        assert self.env is not None
        events: list[Event] = await self.env.store.load_events(run_id)
        return events

    async def do(self, run_id: str, label: str, attempt: int = 1, fail: int = 0) -> str:
        """A step's effect: returns its key ``run_id|label|r<attempt>``."""
        fx = f"{run_id}|{label}|r{attempt}"
        events = await self._events(run_id)
        if any(isinstance(e, StepCompleted) and e.result == fx for e in events):
            self.violations.append(f"{fx} executed again after its step_completed")
        tries = 1 + sum(1 for e in events if isinstance(e, StepFailed) and e.error.message == fx)
        self.executed[f"{fx}#{tries}"] += 1
        await self._only_holder(run_id, fx)
        if tries <= fail:
            raise Boom(fx)
        return fx

    async def do_io(self, run_id: str, label: str, attempt: int = 1, fail: int = 0) -> str:
        """``do`` behind real async I/O (a little real time before and after the effect, as
        an HTTP call takes): a step's ``timeout=`` must not be reached by time skipping."""
        await asyncio.sleep(0.01)  # the request
        fx = await self.do(run_id, label, attempt, fail)
        await asyncio.sleep(0.01)  # the response
        return fx

    async def undo(self, result: str) -> str:
        """A compensation of ``do``'s effect ``result``; one whose label ends with ``~`` fails
        its first attempt."""
        run_id, label, _ = result.rsplit("|", 2)
        fx = f"undo {result}"
        events = await self._events(run_id)
        if any(isinstance(e, CompensationCompleted) and e.result == fx for e in events):
            self.violations.append(f"{fx} executed again after its compensation_completed")
        tries = 1 + sum(
            1 for e in events if isinstance(e, CompensationFailed) and e.error.message == fx
        )
        self.executed[f"{fx}#{tries}"] += 1
        await self._only_holder(run_id, fx)
        if tries == 1 and label.endswith("~"):
            raise Boom(fx)
        return fx

    async def _only_holder(self, run_id: str, fx: str) -> None:
        """A singleton run's effect happens while its run is its key's only holder."""
        assert self.env is not None
        run = await self.env.store.get_run(run_id)
        if run is None or run.singleton_key is None:
            return
        key = run.singleton_key
        holders = [
            r.id
            for r in await self.env.store.list_runs(tag=f"singleton:{key}")
            if ADMITTED_TAG in r.tags and r.status.active
        ]
        if holders != [run_id]:
            self.violations.append(f"{fx} executed while {key}'s holders were {holders}")


# -- crash rules ---------------------------------------------------------------------------


@dataclass
class Probe(Rule):
    """Never fires: counts how often each crash point is passed (``passes``)."""

    passes: Counter[str] = field(default_factory=Counter)

    def applies(
        self, instance: int, op: str, phase: Any, args: Any, kwargs: Any, result: Any = None
    ) -> bool:
        for point, sites in CRASH_SITES.items():
            if any(s.hit(op, phase, args, kwargs, result) for s in sites):
                self.passes[point] += 1
        return False


@dataclass
class CrashAtPass(Rule):
    """Crash whichever instance passes crash point ``point`` for the ``nth`` time."""

    point: str = ""
    nth: int = 1
    seen: int = 0

    def applies(
        self, instance: int, op: str, phase: Any, args: Any, kwargs: Any, result: Any = None
    ) -> bool:
        if self.fired:
            return False
        if any(s.hit(op, phase, args, kwargs, result) for s in CRASH_SITES[self.point]):
            self.seen += 1
            return self.seen == self.nth
        return False


# -- driving -------------------------------------------------------------------------------


class Driver:
    """What a scenario's ``drive`` talks to the runs through: an outside client engine on the
    environment's store and clock (it never crashes), and the environment's time."""

    def __init__(self, env: TestEnv, workflows: list[Any], seed: int) -> None:
        self.env = env
        self.client = Engine(
            env.store,
            workflows,
            clock=env.clock,
            worker=False,
            bus=env.bus,
            rng=random.Random(f"client:{seed}"),
            poll_interval=None,
        )
        self.replies: dict[str, Any] = {}
        self._calls: dict[str, asyncio.Task[Any]] = {}
        self.errors: dict[str, str] = {}

    async def _recover(self) -> None:
        """Bring crashed instances back (a crash rule fired meanwhile)."""
        await self.env.settle()
        for i in list(self.env.crashed):
            await self.env.restart(i)

    async def idle(self) -> None:
        """Run until nothing can move, restarting crashed instances on the way."""
        for _ in range(20):
            await self._recover()
            await self.env.run_until_idle(max_jumps=5_000)
            if not self.env.crashed:
                return
        raise AssertionError("instances kept crashing")

    async def advance(self, seconds: float) -> None:
        await self._recover()
        await self.env.advance(seconds)
        await self._recover()

    async def wait(
        self, run_id: str, *, status: str | None = None, event: str | None = None
    ) -> None:
        """Move time (a second at a time) until ``run_id`` exists, with ``status`` and an
        ``event`` of that type in its history when given: what the next action of the
        scenario needs, which a crash may delay (its run is recovered once the dead
        instance's lease expires). The baseline usually finds it so at once."""
        for _ in range(300):
            run = await self.env.store.get_run(run_id)
            if run is not None and (status is None or run.status.value == status):
                events = await self.env.store.load_events(run_id) if event else []
                if event is None or any(e.type == event for e in events):
                    return
            await self.advance(1)
        raise AssertionError(f"{run_id} never got to {status or ''} {event or ''}")

    async def start(self, workflow: Any, input: Any, run_id: str, **kw: Any) -> Run:
        run = await self.client.start(workflow, input, run_id, **kw)
        self.env._poke()
        await self._recover()
        return run

    async def signal(self, run_id: str, name: str, payload: Any = None) -> None:
        """``engine.signal``; a refusal is recorded under ``signal <run_id> <name>``."""
        try:
            await self.client.signal(run_id, name, payload)
        except flowkit.FlowkitError as exc:
            self.errors[f"signal {run_id} {name}"] = type(exc).__name__
        self.env._poke()
        await self._recover()

    async def cancel(self, run_id: str, *, compensate: bool = False) -> None:
        await self.client.cancel(run_id, compensate=compensate)
        self.env._poke()
        await self._recover()

    async def retry(self, run_id: str) -> None:
        """``engine.retry``; a refusal is recorded under ``retry <run_id>`` in ``errors``."""
        try:
            await self.client.retry(run_id)
        except flowkit.FlowkitError as exc:
            self.errors[f"retry {run_id}"] = type(exc).__name__
        self.env._poke()
        await self._recover()

    async def publish(self, name: str, payload: Any, event_id: str) -> None:
        await self.client.publish_event(name, payload, event_id=event_id)
        self.env._poke()
        await self._recover()

    async def update(self, label: str, run_id: str, name: str, arg: Any = None) -> None:
        """Send an update in the background; its reply (or the error's type) lands in
        ``replies[label]`` by the end of the scenario."""
        self._calls[label] = asyncio.ensure_future(self.client.update(run_id, name, arg))
        await self.env.settle()
        self.env._poke()
        await self._recover()

    async def finish(self) -> None:
        await self.idle()
        for label, task in self._calls.items():
            try:
                self.replies[label] = await asyncio.wait_for(task, 10)
            except (flowkit.FlowkitError, TimeoutError) as exc:
                self.replies[label] = type(exc).__name__


# -- scenarios -----------------------------------------------------------------------------

ActivationRunner = Callable[[Driver], Awaitable[None]]


@dataclass
class Scenario:
    """A pair's scenario: ``build(effects)`` returns its workflows; ``drive`` plays it;
    ``expect`` maps run ids to the status (and, with a tuple, the output) the baseline must
    reach; ``parked`` lists runs that legitimately stay suspended at the end, ``absent``
    runs that must never be started; ``errors`` and ``replies`` what ``Driver.errors`` and
    ``Driver.replies`` must hold under those labels."""

    pair: tuple[str, str]
    build: Callable[[Effects], list[Any]]
    drive: ActivationRunner
    expect: dict[str, Any]
    parked: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    instances: int = 2
    errors: dict[str, str] = field(default_factory=dict)
    note: str = ""
    replies: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return "x".join(self.pair)


@dataclass
class Outcome:
    """What one play of a scenario left: runs, histories, replies, effects, crashes."""

    runs: dict[str, Run]
    histories: dict[str, History]
    replies: dict[str, Any]
    errors: dict[str, str]
    effects: Effects
    crashes: int
    passes: Counter[str]
    replay_failures: list[str]


def _effect_events(events: Iterable[Event]) -> Counter[tuple[Any, ...]]:
    """The events that stand for an effect or a message taken, with what identifies them."""
    out: Counter[tuple[Any, ...]] = Counter()
    for e in events:
        match e:
            case StepCompleted():
                out[(e.type, e.pos, e.result)] += 1
            case StepFailed():
                out[(e.type, e.pos, e.error.message, e.retry_at is None)] += 1
            case CompensationCompleted() | CompensationFailed():
                out[(e.type, e.step_pos)] += 1
            case SignalReceived():
                out[(e.type, e.name, repr(e.payload))] += 1
            case UpdateReceived():
                out[(e.type, e.name, repr(e.arg))] += 1
            case UpdateReplied():
                out[(e.type, e.name, repr(e.value))] += 1
            case EventReceived():
                out[(e.type, e.name, e.event_id)] += 1
            case ChildStarted() | ChildCompleted() | ChildFailed():
                out[(e.type, e.run_id)] += 1
            case RunContinued():
                out[(e.type, e.next_run_id)] += 1
            case PatchMarker():
                out[(e.type, e.patch_id)] += 1
            case RunCompleted() | RunFailed() | RunCancelled():
                out[(e.type,)] += 1
            case _:
                pass
    return out


def _by_version(workflows: list[Any]) -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], Any] = {}
    for wf in workflows:
        defn = definition_of(wf)
        assert defn is not None, wf
        out[(defn.name, defn.version)] = wf
    return out


async def play(
    sc: Scenario,
    make_store: Callable[[], Any],
    seed: int,
    crash: tuple[str, int] | None = None,
) -> Outcome:
    """Play ``sc`` once on a fresh store, crashing at ``crash`` (point, pass) if given."""
    fx = Effects()
    workflows = sc.build(fx)
    store = make_store()
    probe = Probe("claim")
    try:
        async with TestEnv(workflows, instances=sc.instances, seed=seed, store=store) as env:
            fx.env = env
            env.inject(probe)
            if crash is not None:
                env.inject(CrashAtPass("claim", "crash", point=crash[0], nth=crash[1]))
            d = Driver(env, workflows, seed)
            await sc.drive(d)
            await d.finish()
            crashes = sum(1 for f in env.fired if f[3] == "crash")
            # (``list_runs`` leaves the output out: each run is read whole)
            ids = [r.id for r in await env.store.list_runs()]
            runs = {rid: run for rid in ids if (run := await env.store.get_run(rid)) is not None}
            histories = {rid: await env.history(rid) for rid in runs}
            replay_failures = []
            code = _by_version(workflows)
            for rid, h in histories.items():
                run = runs[rid]
                try:
                    await flowkit.replay_async(h, code[(run.workflow, run.workflow_version)])
                except Exception as exc:
                    replay_failures.append(f"{rid}: {type(exc).__name__}: {exc}")
            return Outcome(
                runs, histories, d.replies, d.errors, fx, crashes, probe.passes, replay_failures
            )
    finally:
        inner = getattr(store, "inner", None)  # (a CodecStore's)
        close = getattr(store, "close", None) or getattr(inner, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()


def _summary(run: Run) -> tuple[Any, ...]:
    err = run.error or {}
    return (run.status.value, repr(run.output), err.get("type"))


def check(sc: Scenario, got: Outcome, base: Outcome | None) -> list[str]:
    """Every broken invariant of ``got`` (see the module docstring); empty when all hold."""
    out = [f"effect: {v}" for v in got.effects.violations]
    out += [f"replay: {f}" for f in got.replay_failures]
    # the baseline's expectations (the scenario's intent)
    for rid, want in sc.expect.items():
        run = got.runs.get(rid)
        status, output = want if isinstance(want, tuple) else (want, None)
        if run is None:
            out.append(f"{rid}: missing")
            continue
        if run.status.value != status:
            out.append(f"{rid}: {run.status.value}, expected {status} ({run.error})")
        elif isinstance(want, tuple) and run.output != output:
            out.append(f"{rid}: output {run.output!r}, expected {output!r}")
    out += [f"{rid}: started" for rid in sc.absent if rid in got.runs]
    for what, err in sc.errors.items():
        if got.errors.get(what) != err:
            out.append(f"{what}: {got.errors.get(what)}, expected {err}")
    for label, reply in sc.replies.items():
        if got.replies.get(label) != reply:
            out.append(f"{label}: replied {got.replies.get(label)!r}, expected {reply!r}")
    # no stranded run
    for rid, run in got.runs.items():
        if run.status.terminal:
            continue
        if rid in sc.parked and run.status is RunStatus.SUSPENDED:
            continue
        out.append(f"{rid} stranded: {run.status.value} (wake_at {run.wake_at})")
    for rid, run in got.runs.items():
        if run.singleton_key is None or run.admitted or run.status.terminal:
            continue
        holders = [
            r.id
            for r in got.runs.values()
            if r.singleton_key == run.singleton_key and r.admitted and r.status.active
        ]
        if run.wake_at is None and not holders:
            out.append(f"{rid}: singleton waiter without a timer and without a holder")
    # histories: gap-free
    for rid, h in got.histories.items():
        if [e.seq for e in h] != list(range(1, len(h) + 1)):
            out.append(f"{rid}: history seqs {[e.seq for e in h]}")
    # effects: recorded ones executed; at most one extra execution per crash
    executed = {k.rsplit("#", 1)[0] for k in got.effects.executed}
    for rid, h in got.histories.items():
        for e in h:
            recorded = isinstance(e, StepCompleted) and isinstance(e.result, str)
            if recorded and "|" in e.result and e.result not in executed:
                out.append(f"{rid}: {e.result} recorded but never executed")
            if isinstance(e, CompensationCompleted) and e.result not in executed:
                out.append(f"{rid}: {e.result} recorded but never executed")
    for k, n in got.effects.executed.items():
        if n > 1 + got.crashes:
            out.append(f"{k} executed {n} times with {got.crashes} crash(es)")
    if base is None:
        return out
    # the same runs, outcomes, replies and recorded effects as the baseline
    if set(got.runs) != set(base.runs):
        out.append(f"runs {sorted(got.runs)} != baseline {sorted(base.runs)}")
    for rid in set(got.runs) & set(base.runs):
        if _summary(got.runs[rid]) != _summary(base.runs[rid]):
            out.append(f"{rid}: {_summary(got.runs[rid])} != baseline {_summary(base.runs[rid])}")
        mine = _effect_events(got.histories[rid])
        theirs = _effect_events(base.histories[rid])
        if mine != theirs:
            out.append(f"{rid}: recorded {sorted((mine - theirs).items())} more and "
                       f"{sorted((theirs - mine).items())} fewer than the baseline")  # fmt: skip
    if got.replies != base.replies:
        out.append(f"replies {got.replies} != baseline {base.replies}")
    if got.errors != base.errors:
        out.append(f"errors {got.errors} != baseline {base.errors}")
    return out


def crash_plan(passes: Counter[str], every: bool, seed: int) -> list[tuple[str, int]]:
    """The (point, pass) crashes to try: one pass of each point passed, the seed choosing
    which; with ``every``, every pass (at most ``MAX_PASSES`` of a point: the first, the
    last, and others spread between them)."""
    rng = random.Random(seed)
    plan: list[tuple[str, int]] = []
    for point in CRASH_POINTS:
        n = passes.get(point, 0)
        if n == 0:
            continue
        if not every:
            plan.append((point, rng.randint(1, n)))
            continue
        picks = range(1, n + 1) if n <= MAX_PASSES else _spread(n, MAX_PASSES)
        plan += [(point, k) for k in picks]
    return plan


MAX_PASSES = 12
"""The most passes of one crash point an exhaustive exploration crashes at (a parent that
waits an hour for its child is claimed every minute: the claims are much alike)."""


def _spread(n: int, k: int) -> list[int]:
    """``k`` of ``1..n``: both ends and evenly spaced ones between."""
    return sorted({1 + round(i * (n - 1) / (k - 1)) for i in range(k)})


async def explore(
    sc: Scenario, make_store: Callable[[], Any], seed: int, every: bool = False
) -> tuple[list[str], Counter[str]]:
    """The baseline, then one crashed play per (point, pass) of ``crash_plan``: every
    failure (prefixed by the crash), and the crash points the baseline passed."""
    base = await play(sc, make_store, seed)
    failures = [f"baseline: {f}" for f in check(sc, base, None)]
    if failures:
        return failures, base.passes
    for point, nth in crash_plan(base.passes, every, seed):
        try:
            got = await play(sc, make_store, seed, (point, nth))
        except (Exception, InstanceCrashed) as exc:
            failures.append(f"{point}#{nth}: raised {type(exc).__name__}: {exc}")
            continue
        if not got.crashes:
            failures.append(f"{point}#{nth}: the crash never fired")
        failures += [f"{point}#{nth}: {f}" for f in check(sc, got, base)]
    return failures, base.passes
