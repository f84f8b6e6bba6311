"""The runner port: what the modules an activation runner calls may use of it (``RunnerPort``),
and the record of one try of an activation (``Try``) its commits take.

``ActivationRunner`` (``_worker/runner.py``) implements the port and passes itself to the
helpers it calls (``deadlines``, ``continue_as_new``, ``children``, ``claim``,
``store_window``); they name the port, never the runner, so they reach only what it lists."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._core.clock import Clock
from .._core.run import Run
from .._replay import Outcome
from ..events import Event
from ..stores.base import AppendsEvents, Notify, Store, Update
from .config import Settled, WorkerConfig, WorkerHooks
from .recovery import LeaseProof

__all__ = ["RunnerPort", "Steps", "Try"]


@dataclass(eq=False)
class Try:
    """What one try of an activation got to: where it failed (``op``, named in a give-up's
    error) and what a final commit needs (the run, its admission, its release)."""

    proof: LeaseProof
    op: str = "claim"
    run: Run | None = None
    admitted: bool = False
    notify: Notify | None = None
    releasing: Notify | None = None  # a commit releasing a slot is in flight
    pending: list[Event] = field(default_factory=list)  # the outcome commit's step records


class Steps(Protocol):
    """The threads sync steps run in (``store_window.StepRunner``)."""

    def submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> asyncio.Future[Any]:
        """Call ``fn`` in a step thread: the future of its outcome, on the event loop."""
        ...


class RunnerPort(Protocol):
    """What the helpers of an activation runner use of it: its configuration, store, clock and
    lease owner, its in-process bookkeeping (timers, step attempts in flight), the worker it
    runs for (``hooks``), and its commit, settle and follow-up (``ActivationRunner``)."""

    @property
    def config(self) -> WorkerConfig:
        """The worker's configuration."""
        ...

    @property
    def store(self) -> Store:
        """The worker's store."""
        ...

    @property
    def clock(self) -> Clock:
        """The configured clock."""
        ...

    @property
    def owner(self) -> str:
        """The lease owner: the worker's instance id."""
        ...

    @property
    def by_version(self) -> bool:
        """The store claims by (workflow, version)."""
        ...

    @property
    def appends(self) -> AppendsEvents | None:
        """The store as one that records steps with ``append_events``, or ``None``."""
        ...

    @property
    def timers(self) -> dict[object, float]:
        """The in-process deadlines of the activations here, by a token of their own."""
        ...

    @property
    def in_flight(self) -> set[object]:
        """The step attempts running their function here now, by a token each."""
        ...

    step_ended: asyncio.Future[None] | None
    """A future resolved when a step attempt in flight ends (``TestEnv`` waits on it)."""

    @property
    def steps(self) -> Steps:
        """The threads sync steps run in."""
        ...

    @property
    def hooks(self) -> WorkerHooks:
        """The worker this runner runs activations for."""
        ...

    @property
    def settled(self) -> Settled:
        """Tell ``Engine.result`` waiters of a run that settled (or left here: ``None``)."""
        ...

    async def commit(self, run: Run, update: Update, t: Try) -> Run:
        """Commit ``update`` under this worker's lease and act on what the commit says."""
        ...

    async def settle(
        self,
        run: Run,
        outcome: Outcome,
        admitted: bool,
        notify: Notify | None,
        pending: Sequence[Event],
        t: Try,
    ) -> None:
        """Commit the activation's outcome, together with its deferred step records."""
        ...

    def follow(self, new: Run | None) -> None:
        """Act on what a fresh read or a commit says of a run this runner holds no more."""
        ...
