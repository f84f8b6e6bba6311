"""``Engine.retry``: re-open a ``failed`` or ``dead`` run (DESIGN §9, "Dead letters")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _schemas
from ._run import Run, RunStatus
from .errors import RunStateError
from .events import RunRetried
from .stores.base import UNSET, ConflictError, Update

if TYPE_CHECKING:
    from ._engine import Engine


async def retry(engine: Engine, run_id: str, input: Any) -> Run:
    """``Engine.retry`` (its docstring says what it does)."""
    run = await engine._get(run_id)
    retryable = frozenset({RunStatus.FAILED, RunStatus.DEAD})
    why = "only failed or dead runs can be retried"
    if run.status not in retryable:
        raise RunStateError(run_id, run.status, why)
    entry = engine.registry.get(run.workflow, run.workflow_version)
    new_input: Any = UNSET
    if input is not UNSET:
        if entry is None:  # (no code here: the input schema a worker recorded, else none)
            rec = await _schemas.recorded(engine.store, run)
            cap = engine.max_payload_bytes
            new_input = _schemas.input_json(run.workflow, rec, run.workflow_version, input, cap)
        else:
            new_input = engine._validated_input(entry[0], input)
    timeout = entry[0].execution_timeout if entry is not None else None
    # (registered here: its timeout now, none included; else the one it had)
    deadline: Any = None
    if entry is None and run.deadline_at is not None:
        # not registered here: the timeout its last (re)start gave it
        events = await engine.store.load_events(run_id)
        began = next(e.at for e in reversed(events) if e.type in ("run_started", "run_retried"))
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
                expect_status=retryable,
                input=new_input,
                recoveries=0,
                deadline_at=deadline,
            ),
        )
    except ConflictError:
        fresh = await engine._get(run_id)
        raise RunStateError(run_id, fresh.status, why) from None
    engine._wake(run_id)
    return res.run


__all__ = ["retry"]
