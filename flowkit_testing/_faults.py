"""Fault and crash injection at the store seam, by rule or by seed.

Every engine instance of a ``TestEnv`` talks to the shared store through an ``InstanceStore``.
Before each store operation it may yield to the event loop a seeded number of times (so the
seed decides how instances interleave), then applies the matching rules: a *fault* raises
``InjectedFault`` before the operation (nothing written) or after it (written, but the caller
sees an error); a *crash* kills the instance right there, before or after the write, as a
real process dying around a commit would leave it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from flowkit import Run
from flowkit.errors import StoreUnavailableError
from flowkit.events import (
    ChildStarted,
    CompensationCompleted,
    StepCompleted,
    UpdateReceived,
    UpdateReplied,
)
from flowkit.stores.base import Update, claims_by_version, claims_gated, records_admission

Phase = Literal["before", "after"]

STORE_OPS = (
    "create_run",
    "get_run",
    "list_runs",
    "load_events",
    "claim",
    "renew_lease",
    "commit",
    "append_events",
    "due_runs",
    "next_due_at",
    "next_due_after",
    "deliver_signal",
    "peek_signal",
    "try_admit_singleton",
    "publish_event",
    "take_event",
    "drop_event_wait",
)
WRITE_OPS = (
    "create_run",
    "claim",
    "renew_lease",
    "commit",
    "append_events",
    "deliver_signal",
    "try_admit_singleton",
    "publish_event",
    "take_event",
    "drop_event_wait",
)


HIDDEN = ("watch",)
"""Optional store methods an ``InstanceStore`` does not expose: real-time wake-up callbacks
(``SqlStore.watch``) would poke the engines behind the virtual clock's back and make the
interleavings depend on wall-clock timing instead of the seed."""


class InjectedFault(StoreUnavailableError):
    """Raised by an ``InstanceStore`` where a ``FaultRule`` fires: a transient store failure
    (a ``StoreUnavailableError``), which the lease holder retries after a short backoff."""


class InstanceCrashed(BaseException):
    """Raised into a crashed instance's store calls: a dead process writes nothing."""


def _run_of(args: tuple[Any, ...]) -> str | None:
    """The run id a store call is about (its first argument, or the run ``create_run``
    creates), when it has one."""
    if args and isinstance(args[0], Run):
        return args[0].id
    return args[0] if args and isinstance(args[0], str) else None


def _records_step(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    update = kwargs.get("update", args[3] if len(args) > 3 else None)
    return isinstance(update, Update) and any(isinstance(e, StepCompleted) for e in update.events)


def _continues(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``commit`` of a continue-as-new (``Update.successor``)."""
    update = kwargs.get("update", args[3] if len(args) > 3 else None)
    return isinstance(update, Update) and update.successor is not None


def _appends_step(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``append_events`` (stores with ``appends_events``: how the engine records a step)."""
    events = kwargs.get("events", args[3] if len(args) > 3 else ())
    return any(isinstance(e, StepCompleted) for e in events)


def _records_undo(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A commit recording a compensation's completion (a compensating run is ``cancelling``,
    so it is never an ``append_events``)."""
    update = kwargs.get("update", args[3] if len(args) > 3 else None)
    return isinstance(update, Update) and any(
        isinstance(e, CompensationCompleted) for e in update.events
    )


Matcher = Callable[[tuple[Any, ...], dict[str, Any]], bool]
"""Decides from a store call's ``(args, kwargs)`` whether a rule or crash site applies."""


def _always(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return True


def _admits_on_create(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return kwargs.get("admission") is not None


def _created_admitted(result: Any) -> bool:
    """``create_run``'s result: the run was created, and admitted by its own transaction."""
    return bool(result[1]) and isinstance(result[0], Run) and result[0].admitted


def _creates_child(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``create_run`` of a child run (``ctx.child``/``ctx.start_child``)."""
    run = kwargs.get("run", args[0] if args else None)
    return isinstance(run, Run) and run.parent_id is not None


def _records_child(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    update = kwargs.get("update", args[3] if len(args) > 3 else None)
    return isinstance(update, Update) and any(isinstance(e, ChildStarted) for e in update.events)


def _appends_child(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    events = kwargs.get("events", args[3] if len(args) > 3 else ())
    return any(isinstance(e, ChildStarted) for e in events)


def _records(*types: type) -> Matcher:
    """A ``commit`` (or ``append_events``) whose events hold one of ``types``."""

    def match(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        update = kwargs.get("update", args[3] if len(args) > 3 else None)
        events = update.events if isinstance(update, Update) else kwargs.get("events", ())
        if not isinstance(update, Update) and not events and len(args) > 3:
            events = args[3]
        return any(isinstance(e, types) for e in events)

    return match


def _appended(result: Any) -> bool:
    """``append_events``' result: the events were written (``None``: nothing was)."""
    return result is not None


@dataclass(frozen=True)
class CrashSite:
    """One place a named crash point fires: store operation ``op``, ``phase`` of the call,
    ``match`` of its arguments and, for an ``"after"`` site, ``result`` of what it returned
    (``None``: any)."""

    op: str
    phase: Phase
    match: Matcher = _always
    result: Callable[[Any], bool] | None = None

    def hit(self, op: str, phase: Phase, args: Any, kwargs: Any, result: Any) -> bool:
        if op != self.op or phase != self.phase or not self.match(args, kwargs):
            return False
        return self.result is None or (phase == "after" and self.result(result))


#: Named crash points, each with every site where it fires (the first without ``result``).
CRASH_SITES: dict[str, tuple[CrashSite, ...]] = {
    # a step's result is computed but not yet recorded: on recovery the step runs again
    # (a step is recorded by ``commit``, or by ``append_events`` where the store has it)
    "before_step_record": (
        CrashSite("commit", "before", _records_step),
        CrashSite("append_events", "before", _appends_step),
    ),
    # the step is recorded, the next one has not started: on recovery it is not re-run
    "after_step_record": (
        CrashSite("commit", "after", _records_step),
        CrashSite("append_events", "after", _appends_step, _appended),
    ),
    # a compensation (``ctx.step(..., compensate=undo)``) ran, not yet recorded: on recovery
    # it runs again; recorded: it never runs again
    "before_compensation_record": (CrashSite("commit", "before", _records_undo),),
    "after_compensation_record": (CrashSite("commit", "after", _records_undo),),
    # ctx.continue_as_new: the run's settlement and its successor not yet committed, or
    # committed (both in one transaction) and the successor not yet run
    "before_continuation": (CrashSite("commit", "before", _continues),),
    "after_continuation": (CrashSite("commit", "after", _continues),),
    # the run was claimed (lease taken) and nothing else happened
    "after_claim": (CrashSite("claim", "after"),),
    # the singleton slot is claimed and stored, its admission event not yet recorded: by the
    # worker's gate check, or by the start's own create_run (admission at creation)
    "after_admission": (
        CrashSite("try_admit_singleton", "after"),
        CrashSite("create_run", "after", _admits_on_create, _created_admitted),
    ),
    # a parent's child call: before its child is created; after (the child exists, the
    # parent's ``child_started`` is not recorded); before that record is written. On recovery
    # the replay starts the child again by its id: one child, never two, never none
    "before_child_create": (CrashSite("create_run", "before", _creates_child),),
    "after_child_create": (CrashSite("create_run", "after", _creates_child),),
    "before_child_record": (
        CrashSite("commit", "before", _records_child),
        CrashSite("append_events", "before", _appends_child),
    ),
    # an update's receipt (``ctx.wait_for_update``) is recorded, nothing after it; its reply
    # (``upd.reply``) is recorded and the caller has not seen it yet
    "after_update_receipt": (CrashSite("commit", "after", _records(UpdateReceived)),),
    "after_update_reply": (
        CrashSite("commit", "after", _records(UpdateReplied)),
        CrashSite("append_events", "after", _records(UpdateReplied), _appended),
    ),
}

#: Named crash points as (store operation, phase, matcher of the call's arguments): the first
#: site of each (``CRASH_SITES`` lists them all; ``crash_at`` and ``FaultPlan`` use every one).
CRASH_POINTS: dict[str, tuple[str, Phase, Matcher]] = {
    name: (sites[0].op, sites[0].phase, sites[0].match) for name, sites in CRASH_SITES.items()
}


@dataclass
class Rule:
    """Fire ``action`` on ``op`` (``phase`` of the call) for instance ``instance`` (any when
    ``None``), when ``match(args, kwargs)`` holds, ``times`` times (``None``: always).

    ``also`` lists further sites the same rule fires at (a named crash point with several:
    ``CRASH_SITES``); ``times`` counts the firings at all of them."""

    op: str
    action: Literal["fault", "crash"] = "fault"
    phase: Phase = "before"
    instance: int | None = None
    times: int | None = 1
    match: Matcher | None = None
    also: tuple[CrashSite, ...] = ()
    fired: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        for op in (self.op, *(site.op for site in self.also)):
            if op not in STORE_OPS:
                raise ValueError(f"unknown store operation {op!r}; one of {STORE_OPS}")

    def applies(
        self, instance: int, op: str, phase: Phase, args: Any, kwargs: Any, result: Any = None
    ) -> bool:
        """Whether the rule fires at this call (``result``: what an ``"after"`` call
        returned)."""
        if self.instance is not None and self.instance != instance:
            return False
        if self.times is not None and self.fired >= self.times:
            return False
        own = op == self.op and phase == self.phase
        if own and (self.match is None or self.match(args, kwargs)):
            return True
        return any(site.hit(op, phase, args, kwargs, result) for site in self.also)


@dataclass
class FaultPlan:
    """Seeded random faults: each write operation fails with probability ``rate``, before or
    after the write (chosen by the seed too); with ``crash_rate`` an instance also dies at a
    named crash point (see ``CRASH_SITES``) with that probability each time it passes one."""

    rate: float = 0.0
    ops: tuple[str, ...] = WRITE_OPS
    phases: tuple[Phase, ...] = ("before", "after")
    crash_rate: float = 0.0
    crash_points: tuple[str, ...] = ("before_step_record", "after_step_record", "after_claim")


class InstanceStore:
    """One instance's window on the shared store: seeded yields, rules, crash state."""

    def __init__(self, inner: Any, index: int, env: Any) -> None:
        self._inner = inner
        self.index = index
        self._env = env
        self.crashed = False
        self.calls = 0

    @property
    def records_admission(self) -> bool:
        """The shared store's, judged on the store itself (this proxy's ``try_admit_singleton``
        takes any keyword)."""
        return records_admission(self._inner)

    @property
    def claims_by_version(self) -> bool:
        """The shared store's, judged on the store itself (this proxy's ``claim`` and
        ``due_runs`` take any keyword)."""
        return claims_by_version(self._inner)

    @property
    def claims_gated(self) -> bool:
        """The shared store's, judged on the store itself (this proxy's ``claim`` takes any
        keyword)."""
        return claims_gated(self._inner)

    def __getattr__(self, name: str) -> Any:
        if name in HIDDEN:
            raise AttributeError(f"{type(self).__name__} does not expose {name!r}")
        attr = getattr(self._inner, name)
        if name not in STORE_OPS or attr is None:
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self._call(name, attr, args, kwargs)

        return call

    async def _call(self, op: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        env = self._env
        if self.crashed:
            raise InstanceCrashed(op)
        for _ in range(env.rng.randrange(env.max_yields + 1) if env.max_yields else 0):
            await asyncio.sleep(0)  # the seed picks how instances interleave here
            if self.crashed:
                raise InstanceCrashed(op)
        self.calls += 1
        self._apply(op, "before", args, kwargs)
        result = await fn(*args, **kwargs)
        self._apply(op, "after", args, kwargs, result)
        return result

    def _apply(
        self,
        op: str,
        phase: Phase,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        result: Any = None,
    ) -> None:
        env = self._env
        for rule in env.rules:
            if rule.applies(self.index, op, phase, args, kwargs, result):
                rule.fired += 1
                env.fired.append((self.index, op, phase, rule.action, _run_of(args)))
                if rule.action == "crash":
                    self.crashed = True
                    env._crash_soon(self.index)
                    raise InstanceCrashed(f"{op} ({phase})")
                raise InjectedFault(f"injected fault in {op} ({phase})")
        plan: FaultPlan | None = env.fault_plan
        if plan is None:
            return
        rng: random.Random = env.rng
        if plan.crash_rate > 0:
            for point in plan.crash_points:
                hit = any(s.hit(op, phase, args, kwargs, result) for s in CRASH_SITES[point])
                if hit and rng.random() < plan.crash_rate:  # the seed draws only at a point
                    env.fired.append((self.index, op, phase, "crash", _run_of(args)))
                    self.crashed = True
                    env._crash_soon(self.index)
                    raise InstanceCrashed(f"seeded crash at {point}")
        eligible = plan.rate > 0 and op in plan.ops and phase in plan.phases
        if eligible and rng.random() < plan.rate / len(plan.phases):
            env.fired.append((self.index, op, phase, "fault", _run_of(args)))
            raise InjectedFault(f"seeded fault in {op} ({phase})")
