"""Branches: the lines of execution of a body, each with its own call positions, clock, RNG and
guard state. The body is branch ``""``; the ``i``-th awaitable of a ``ctx.gather`` taken at
position ``p`` is branch ``"p.i/"``, so a position never depends on timing."""

from __future__ import annotations

import contextvars
import hashlib
import random
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._core import serde as _serde

if TYPE_CHECKING:
    from .state import ActivationState


@dataclass(slots=True)
class Branch:
    """One line of execution of the body: the body itself, or one awaitable of a
    ``ctx.gather``."""

    prefix: str
    # the branch's time (``ctx.now``): its start, then the latest event it has seen
    now_at: float
    seed: int
    # the number of ctx calls made on the branch: the last position taken
    counter: int = 0
    _rng: random.Random | None = None
    # the branch's coroutine is executing (its ``Guard`` is inside ``send``): a ctx call
    # made or started while it is not comes from another task
    running: bool = False
    # ctx calls of the branch executing right now: what it yields meanwhile is theirs
    depth: int = 0
    # the branch has seen the run's cancellation (a CancelledError out of one of its ctx
    # calls): from then on its new steps run (cleanup); a gather's children inherit it
    delivered: bool = False
    # the number of the branch's oldest ctx call not yet started (calls start in the order
    # they are made: see ``guard.enter``), and that call's coroutine
    next: int = 1
    head: Coroutine[Any, Any, Any] | None = None
    # the name of the branch's last ``ctx.step`` (``ctx.logger``'s ``flowkit_step`` tag)
    step: str | None = None
    # the branch's last ctx call did something new in this activation (recorded an event),
    # or it made none yet: with the history used up, its code runs for the first time.
    # A call answered by the history clears it: the activation that recorded that answer
    # went on past it (``ctx.logger`` stays silent there)
    fresh: bool = True

    @property
    def rng(self) -> random.Random:
        """The branch's deterministic RNG, seeded on first use (most bodies never draw)."""
        if self._rng is None:
            self._rng = random.Random(self.seed)
        return self._rng

    def next_pos(self) -> str:
        """Take the next position of the branch."""
        self.counter += 1
        return f"{self.prefix}{self.counter}"

    def child(self, pos: str, i: int) -> Branch:
        """The branch of the ``i``-th awaitable of the ``ctx.gather`` at ``pos``: it starts at
        this branch's time, with a seed drawn from its RNG and its delivered cancellation."""
        return Branch(
            prefix=f"{pos}.{i}/",
            now_at=self.now_at,
            seed=self.rng.getrandbits(64),
            delivered=self.delivered,
            fresh=self.fresh,
        )


CURRENT: contextvars.ContextVar[tuple[ActivationState, Branch] | None] = contextvars.ContextVar(
    "flowkit_branch", default=None
)
"""The activation and branch the running task executes (set in each branch's own task)."""


def _current_activation() -> ActivationState | None:
    current = CURRENT.get()
    return current[0] if current is not None else None


_serde.current_activation = _current_activation


def seed(run_id: str) -> int:
    """The seed of a run's root branch: its RNG is the same on every replay."""
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:8], "big")
