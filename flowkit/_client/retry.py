"""``Engine.retry``: re-open a ``failed`` or ``dead`` run (docs/deadlines-and-dead-letters.md,
"Dead letters").

A run whose compensations ran is never re-opened (docs/composing-workflows.md, "Retrying a
compensated run"): its effects were undone, and running it again would either undo them a
second time or complete it on top of what was undone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._core.run import Run, RunStatus
from ..errors import RunStateError
from ..events import CompensationCompleted, CompensationFailed, Event, RunRetried
from ..stores.base import UNSET, ConflictError, Update
from . import schemas as _schemas

if TYPE_CHECKING:
    from .core import ClientCore
    from .engine import Engine

RETRYABLE = frozenset({RunStatus.FAILED, RunStatus.DEAD})
"""The statuses ``engine.retry`` re-opens."""

_NOT_RETRYABLE = "only failed or dead runs can be retried"


def compensations_ran(events: Sequence[Event]) -> list[str]:
    """The names of the compensations recorded in a history (``compensation_completed`` or
    ``compensation_failed``: an attempt ran), each once, in the order they first ran."""
    names = (e.name for e in events if isinstance(e, CompensationCompleted | CompensationFailed))
    return list(dict.fromkeys(names))


def retry_refusal(run: Run, events: Sequence[Event]) -> str | None:
    """Why ``engine.retry`` refuses ``run`` with history ``events``, or ``None`` when it
    re-opens it: a status other than ``failed`` / ``dead``, or compensations that ran (at any
    point of its history: their effects were undone, so a retry would undo them twice or
    complete the run on top of them). The dashboard offers no retry where this says why."""
    if run.status not in RETRYABLE:
        return _NOT_RETRYABLE
    names = compensations_ran(events)
    if names:
        return (
            f"its compensations ran ({', '.join(names)}), so its effects were undone; "
            "a retry would undo them again or complete the run on top of them: "
            "start a new run instead (docs/composing-workflows.md)"
        )
    return None


async def retry(engine: Engine, core: ClientCore, run_id: str, input: Any) -> Run:
    """``Engine.retry`` (its docstring says what it does)."""
    run = await core.get(run_id)
    if run.status not in RETRYABLE:
        raise RunStateError(run_id, run.status, _NOT_RETRYABLE)
    # (a failed or dead run takes no event: the history read here is the one it keeps
    # until the commit below, whose ``expect_status`` refuses any change in between)
    history = await engine.store.load_events(run_id)
    refused = retry_refusal(run, history)
    if refused is not None:
        raise RunStateError(run_id, run.status, refused)
    entry = engine.registry.get(run.workflow, run.workflow_version)
    new_input: Any = UNSET
    if input is not UNSET:
        if entry is None:  # (no code here: the input schema a worker recorded, else none)
            rec = await _schemas.recorded(engine.store, run)
            cap = engine.max_payload_bytes
            new_input = _schemas.input_json(run.workflow, rec, run.workflow_version, input, cap)
        else:
            new_input = core.validated_input(entry[0], input)
    timeout = entry[0].execution_timeout if entry is not None else None
    # (registered here: its timeout now, none included; else the one it had)
    deadline: Any = None
    if entry is None and run.deadline_at is not None:
        # not registered here: the timeout its last (re)start gave it
        began = next(e.at for e in reversed(history) if e.type in ("run_started", "run_retried"))
        timeout = run.deadline_at - began
    now = engine.clock.now()
    if timeout is not None:
        deadline = round(now + timeout, 6)
    elif entry is None:
        deadline = UNSET  # (unknown here, and it had none)
    attempt = run.attempt + 1
    retried = RunRetried(attempt=attempt, at=now)
    if new_input is not UNSET:
        retried = RunRetried(attempt=attempt, at=now, new_input=True, input=new_input)
    try:
        res = await engine.store.commit(
            run_id,
            None,
            now,
            Update(
                events=[retried],
                status=RunStatus.PENDING,
                error=None,
                wake_at=None,
                attempt=attempt,
                expect_status=RETRYABLE,
                input=new_input,
                recoveries=0,
                deadline_at=deadline,
            ),
        )
    except ConflictError:
        fresh = await core.get(run_id)
        raise RunStateError(run_id, fresh.status, _NOT_RETRYABLE) from None
    core.wake(run_id)
    return res.run


__all__ = ["RETRYABLE", "compensations_ran", "retry", "retry_refusal"]
