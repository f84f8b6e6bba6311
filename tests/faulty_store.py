"""``FaultyStore``: a wrapper around any store that fails, or stalls, chosen calls.

A rule names store operations and (optionally) a predicate over the call's arguments. It
raises an error *before* delegating (nothing written) or *after* (written, the caller sees
an error: an ambiguous commit that did land), ``times`` times or always; or it stalls the
call, before or after delegating, until the test releases it. Everything else passes
through, attributes included (``appends_events``, ``records_admission``, ``group_commit``,
``inner`` for ``TestEnv``)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from flowkit.errors import StoreUnavailableError
from flowkit.events import Event, StepCompleted
from flowkit.stores.base import Update
from flowkit_testing._faults import STORE_OPS

Phase = Literal["before", "after"]
Match = Callable[[tuple[Any, ...]], bool]

OPS = frozenset({*STORE_OPS, "release_leases"})


def _always(args: tuple[Any, ...]) -> bool:
    return True


@dataclass(eq=False)
class FaultRule:
    """Fail (``error`` set) or stall (``error`` None) the matching calls of ``ops``."""

    ops: frozenset[str]
    phase: Phase
    match: Match
    times: int | None
    error: Callable[[], BaseException] | None
    fired: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)
    stalled: int = 0  # calls waiting in this stall right now

    def applies(self, op: str, phase: Phase, args: tuple[Any, ...]) -> bool:
        return (
            op in self.ops
            and phase == self.phase
            and (self.times is None or self.fired < self.times)
            and (not self.released.is_set() or self.error is not None)
            and self.match(args)
        )

    def release(self) -> None:
        """Let the stalled calls (and any later ones) go on."""
        self.released.set()


class FaultyStore:
    """Delegates to ``inner``; applies the rules added with ``fail`` and ``stall``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.rules: list[FaultRule] = []
        # (op, phase, args) of every call a rule failed
        self.failed: list[tuple[str, Phase, tuple[Any, ...]]] = []

    def fail(
        self,
        *ops: str,
        times: int | None = 1,
        phase: Phase = "before",
        match: Match = _always,
        error: Callable[[], BaseException] = lambda: StoreUnavailableError("injected outage"),
    ) -> FaultRule:
        """Raise ``error()`` in the matching calls of ``ops`` (``after``: once the call
        has done its work)."""
        return self._add(FaultRule(_ops(ops), phase, match, times, error))

    def stall(self, *ops: str, phase: Phase = "before", match: Match = _always) -> FaultRule:
        """Hold the matching calls of ``ops`` until ``rule.release()`` (``after``: the call
        has done its work, its answer is held)."""
        return self._add(FaultRule(_ops(ops), phase, match, None, None))

    def _add(self, rule: FaultRule) -> FaultRule:
        self.rules.append(rule)
        return rule

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in OPS or attr is None:
            return attr

        @functools.wraps(attr)
        async def call(*args: Any, **kwargs: Any) -> Any:
            await self._apply(name, "before", args)
            result = await attr(*args, **kwargs)
            await self._apply(name, "after", args)
            return result

        return call

    async def _apply(self, op: str, phase: Phase, args: tuple[Any, ...]) -> None:
        for rule in self.rules:
            if not rule.applies(op, phase, args):
                continue
            rule.fired += 1
            if rule.error is not None:
                self.failed.append((op, phase, args))
                raise rule.error()
            rule.stalled += 1
            try:
                await rule.released.wait()
            finally:
                rule.stalled -= 1


def _ops(ops: tuple[str, ...]) -> frozenset[str]:
    unknown = set(ops) - OPS
    if unknown:
        raise ValueError(f"unknown store operations {sorted(unknown)}")
    return frozenset(ops)


def written(args: tuple[Any, ...]) -> list[Event]:
    """The events a ``commit`` or ``append_events`` call writes (its fourth argument)."""
    if len(args) < 4:
        return []
    what = args[3]
    return list(what.events) if isinstance(what, Update) else list(what)


def records_step(name: str, run_id: str | None = None) -> Match:
    """A write that records the completion of step ``name`` (of ``run_id``)."""

    def match(args: tuple[Any, ...]) -> bool:
        if run_id is not None and (not args or args[0] != run_id):
            return False
        return any(isinstance(e, StepCompleted) and e.name == name for e in written(args))

    return match


def by_owner(owner: str) -> Match:
    """A call made under ``owner``'s lease (``claim``, ``commit``, ``renew_lease``, ...)."""
    return lambda args: len(args) > 1 and args[1] == owner


def of_run(run_id: str) -> Match:
    return lambda args: bool(args) and args[0] == run_id
