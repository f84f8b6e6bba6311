"""``replay(history, workflow)``: re-run a body against a recorded history, side-effect free."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ._definition import definition_of
from ._history import (
    CancelRequested,
    Event,
    History,
    RunCompleted,
    RunFailed,
    RunRetried,
    RunStarted,
)
from ._replay import Activation, Completed, Diverged, Evicted, Failed, ReplayStub, Suspended
from .errors import HistoryError, NonDeterminismError, WorkflowNotFoundError
from .stores.base import InboxSignal


class _ReplayHost:
    def __init__(self, at: float) -> None:
        self._at = at

    def now(self) -> float:
        return self._at

    async def record(self, events: Sequence[Event], consume_signal: int | None = None) -> bool:
        raise AssertionError("replay-only activations never record")  # pragma: no cover

    async def peek_signal(self, name: str) -> InboxSignal | None:
        return None


async def replay_async(history: History, workflow: Any) -> None:
    """Async form of ``replay``."""
    defn = definition_of(workflow)
    if defn is None:
        raise WorkflowNotFoundError(getattr(workflow, "__name__", repr(workflow)))
    first = history.events[0] if history.events else None
    if not isinstance(first, RunStarted):
        raise HistoryError("history must start with run_started")
    if first.workflow != defn.name:
        raise HistoryError(f"history is of workflow {first.workflow!r}, not {defn.name!r}")
    instance = workflow if not isinstance(workflow, type) else _bare_instance(workflow)
    last = history.events[-1]
    act = Activation(
        defn,
        instance,
        history.run_id,
        defn.input_adapter.validate_python(first.input),
        history.events,
        _ReplayHost(last.at),
        cancel_requested=any(isinstance(e, CancelRequested) for e in history.events),
        attempt=1 + sum(isinstance(e, RunRetried) for e in history.events),
        replay_only=True,
    )
    outcome = await act.run()
    terminal = last if isinstance(last, RunCompleted | RunFailed) else None
    match outcome:
        case Diverged(err):
            raise err
        case Completed(output):
            if isinstance(terminal, RunCompleted) and terminal.output != output:
                raise NonDeterminismError(
                    "end",
                    f"run_completed#{terminal.seq}",
                    "a different output",
                    f"recorded {terminal.output!r:.80}, replay returned {output!r:.80}",
                )
            if isinstance(terminal, RunFailed):
                raise NonDeterminismError("end", f"run_failed#{terminal.seq}", "completion")
        case Failed(error):
            if isinstance(terminal, RunCompleted):
                raise NonDeterminismError(
                    "end", f"run_completed#{terminal.seq}", f"failure {error.type}: {error.message}"
                )
        case Evicted() | Suspended(_, _):
            if terminal is not None and act.replay_stopped_at is not None:
                raise NonDeterminismError(
                    act.replay_stopped_at.rsplit(" ", 1)[-1],
                    f"{terminal.type}#{terminal.seq} (the end)",
                    act.replay_stopped_at,
                )
        case _:
            pass


def _bare_instance(cls: type) -> Any:
    """``cls()`` when it needs no arguments; else an instance whose missing attributes (the
    services its constructor would inject) are ``ReplayStub``s: replay never runs steps."""
    try:
        return cls()
    except TypeError:
        pass

    def __getattr__(self: Any, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return ReplayStub(name)

    stubbed = type(cls.__name__, (cls,), {"__getattr__": __getattr__})
    return object.__new__(stubbed)


def replay(history: History | str, workflow: Any) -> None:
    """Re-run ``workflow``'s body against ``history``; raise ``NonDeterminismError`` at the
    first divergence. Steps are never executed. Call ``replay_async`` inside an event loop."""
    if isinstance(history, str):
        history = History.from_json(history)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(replay_async(history, workflow))
        return
    raise RuntimeError("replay() called inside an event loop: use `await replay_async(...)`")
