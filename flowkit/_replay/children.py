"""The child calls: ``ctx.child`` (start a child run and await its outcome, at one position)
and ``ctx.start_child`` (start it, at one position) with ``ChildHandle.result()`` (await its
outcome, at a position of its own).

A child is started by its id before its ``child_started`` record (``Host.start_child`` is
idempotent by that id), so a crash between the two never starts two children nor loses one:
the replay starts it again and finds it. A child that cannot start is recorded
``child_failed`` at once. Awaiting an unsettled child parks the branch on the child's wake
signal (``wake_signal``): the child's settlement delivers it, which makes the suspended parent
due at once; the park's deadline (``CHILD_POLL`` seconds) is only the fallback."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._core import serde as _serde
from .._core.run import Run, RunStatus
from ..errors import (
    ChildWorkflowError,
    ConflictError,
    FlowkitError,
    RunCancelledError,
    StepFailedError,
    WorkflowFailedError,
)
from ..events import ChildCompleted, ChildFailed, ChildStarted, ErrorInfo, Event
from .branch import Branch
from .control_flow import _Evicted
from .guard import cancel_left, enter
from .outcome import error_info
from .state import ActivationState

if TYPE_CHECKING:
    from pydantic import TypeAdapter

CHILD_POLL = 60.0
"""Seconds after which a parent awaiting an unsettled child looks at it again although no
wake-up came (a lost one costs this much latency, never a hang)."""

WAKE_PREFIX = "flowkit:child:"


def wake_signal(child_id: str) -> str:
    """The signal name a child's settlement delivers to its parent (to make it due now): the
    prefix and the child id, or a digest of a very long id (signal names have a length cap)."""
    if len(child_id) <= 200:
        return WAKE_PREFIX + child_id
    return WAKE_PREFIX + "#" + hashlib.sha256(child_id.encode()).hexdigest()


@dataclass(frozen=True)
class ChildCall:
    """A child call as the body made it: what ``Host.start_child`` starts."""

    workflow: Any  # a name, a class or a registered instance
    name: str  # the workflow's name
    input: Any
    run_id: str
    version: str | None
    tags: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class ChildStart:
    """A started (or found) child: its id, workflow and version."""

    run_id: str
    workflow: str
    version: str


def _error_of_run(run: Run) -> ErrorInfo:
    """What a settled, not completed child records in its parent's ``child_failed``."""
    if run.status is RunStatus.CANCELLED:
        return ErrorInfo(type="RunCancelledError", message=f"run {run.id!r} was cancelled")
    err = run.error or {"type": "Error", "message": f"run {run.id!r} is {run.status}"}
    known = set(ErrorInfo.model_fields)
    return ErrorInfo(**{k: v for k, v in err.items() if k in known})


def child_error(ev: ChildFailed, workflow: str) -> ChildWorkflowError:
    """The ``ChildWorkflowError`` a recorded ``child_failed`` raises (the same on replay)."""
    err = ev.error
    cause: BaseException
    if err.type == "RunCancelledError":
        cause = RunCancelledError(ev.run_id)
    elif err.cause_type == "start":  # (it never started: the start's own error)
        cause = FlowkitError(f"{err.type}: {err.message}")
    else:
        step = None
        if err.step:
            step = StepFailedError(
                err.step, err.cause_type or err.type, err.cause_message or "", err.attempts or 1
            )
        cause = WorkflowFailedError(ev.run_id, err.model_dump(exclude_none=True), step)
    return ChildWorkflowError(ev.run_id, workflow, cause)


async def run_child(
    st: ActivationState,
    made_in: Branch,
    idx: int,
    pos: str,
    call: ChildCall,
    adapter: TypeAdapter[Any] | None,
    handle: Callable[[str], Any] | None,
) -> Any:
    """The child call at ``pos`` (call ``idx`` of ``made_in``): start the child (unless
    recorded), then, without ``handle`` (``ctx.child``), its outcome; else ``handle`` made of
    its id (``ctx.start_child``'s ``ChildHandle``)."""
    wait = handle is None
    br = enter(st, made_in, idx)
    try:
        st.check_alive()
        evs = st.take(pos, "child" if wait else "start_child", call.run_id)
        started = next((e for e in evs if isinstance(e, ChildStarted)), None)
        if started is not None:
            if started.workflow != call.name:
                raise st.diverge(
                    pos,
                    st.recorded(pos),
                    f"child({call.name!r}, run_id {call.run_id!r})",
                    "the child's workflow changed",
                )
            st.observe(started)
        else:
            failed = next((e for e in evs if isinstance(e, ChildFailed)), None)
            if failed is not None:  # it could not start
                st.observe(failed)
                raise child_error(failed, call.name)
            started = await _start(st, pos, call)
        if handle is not None:
            return handle(started.run_id)
        return await _outcome(st, pos, call.run_id, call.name, adapter, evs)
    except asyncio.CancelledError:
        cancel_left(st, br)
        raise
    finally:
        br.depth -= 1


async def run_child_result(
    st: ActivationState,
    made_in: Branch,
    idx: int,
    pos: str,
    run_id: str,
    workflow: str,
    adapter: TypeAdapter[Any] | None,
) -> Any:
    """``ChildHandle.result()`` at ``pos``: the outcome of the child ``run_id``."""
    br = enter(st, made_in, idx)
    try:
        st.check_alive()
        evs = st.take(pos, "child_result", run_id)
        return await _outcome(st, pos, run_id, workflow, adapter, evs)
    except asyncio.CancelledError:
        cancel_left(st, br)
        raise
    finally:
        br.depth -= 1


async def _start(st: ActivationState, pos: str, call: ChildCall) -> ChildStarted:
    """Start (or find, by its id) the child, then record ``child_started``; a child that
    cannot start is recorded ``child_failed`` and raises ``ChildWorkflowError``."""
    if st.replay_only:
        raise st.stop_replay(pos, f"child({call.name!r})")
    await st.flush()  # earlier outcomes are durable before this side effect
    if st.cancel_requested:
        raise asyncio.CancelledError()
    st.check_lease()
    try:
        got = await st.host.start_child(st.run_id, call)
    except FlowkitError as exc:  # it cannot start: the same on every try
        info = error_info(exc).model_copy(update={"cause_type": "start"})
        failed = ChildFailed(pos=pos, run_id=call.run_id, error=info, at=st.host.now())
        await st.record([failed])
        raise child_error(failed, call.name) from None
    except Exception as exc:  # the store failed: the activation stops, recovery replays it
        st.store_error = exc
        st.evict()
        raise _Evicted() from exc
    started = ChildStarted(
        pos=pos, run_id=got.run_id, workflow=got.workflow, version=got.version, at=st.host.now()
    )
    await st.record([started])
    return started


async def _outcome(
    st: ActivationState,
    pos: str,
    run_id: str,
    workflow: str,
    adapter: TypeAdapter[Any] | None,
    evs: list[Event],
) -> Any:
    """The child's recorded outcome at ``pos``, else its settlement read from the store and
    recorded; parks while it is unsettled."""
    for ev in evs:
        if isinstance(ev, ChildCompleted):
            st.observe(ev)
            return _serde.from_json(ev.output, adapter or _serde.ANY_ADAPTER)
        if isinstance(ev, ChildFailed):
            st.observe(ev)
            raise child_error(ev, workflow)
    name = wake_signal(run_id)
    while True:
        st.check_alive()
        if st.cancel_requested:  # a durable wait
            raise asyncio.CancelledError()
        if st.replay_only:
            raise st.stop_replay(pos, f"child result({run_id!r})")
        try:
            run = await st.host.child_run(run_id)
            sig = await st.host.peek_signal(name) if run is None or run.status.terminal else None
        except Exception as exc:
            st.store_error = exc
            st.evict()
            raise _Evicted() from exc
        if run is None or run.status.terminal:
            now = st.host.now()
            out: ChildCompleted | ChildFailed
            if run is None:
                info = ErrorInfo(type="RunNotFoundError", message=f"no run {run_id!r}")
                out = ChildFailed(pos=pos, run_id=run_id, error=info, at=now)
            elif run.status is RunStatus.COMPLETED:
                out = ChildCompleted(pos=pos, run_id=run_id, output=run.output, at=now)
            else:
                out = ChildFailed(pos=pos, run_id=run_id, error=_error_of_run(run), at=now)
            try:
                await st.record([out], consume_signal=None if sig is None else sig.id)
            except ConflictError:
                continue  # the wake signal went elsewhere: look again
            if isinstance(out, ChildFailed):
                raise child_error(out, workflow)
            return _serde.from_json(out.output, adapter or _serde.ANY_ADAPTER)
        if st.cancel_requested:
            raise asyncio.CancelledError()
        await st.park(round(st.host.now() + CHILD_POLL, 6), name, poll=True)
