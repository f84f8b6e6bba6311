"""Compensation (sagas): the undos that completed steps registered (``ctx.step(...,
compensate=undo)``), run in reverse order of the steps' completions when the body failed or
the run was cancelled with ``engine.cancel(run_id, compensate=True)``.

Each undo is a durable step of its own at a reserved position ``c<n>`` (``n`` = 1, 2, … in the
order they run, counted on across ``engine.retry``), never one of the body's: its attempts are
recorded as ``compensation_completed`` / ``compensation_failed`` (with ``step_pos``, the step it
undoes), retried by the step's policy after a durable backoff, bounded by its timeout. A
recovered run replays its body to the same failure, registering the same undos, then replays
the recorded ones and runs the rest: an undo whose completion is recorded never runs again, and
none is skipped. An undo that fails for good does not stop the others (each undoes a step of
its own); the run then fails with the body's error and a note naming it.

The compensations run in the body's task, after its ``Guard``: no ctx call is allowed in an
undo, and the run's cancellation no longer interrupts anything
(``ActivationState.compensating``)."""

from __future__ import annotations

import asyncio

from .._core import serde as _serde
from ..errors import SerializationError
from ..events import CompensationCompleted, CompensationFailed, ErrorInfo, Event
from .control_flow import _ContinueAsNew, _ControlFlow, _Evicted, _StepCancelled
from .matching import ReplayStub, answers_undo, describe
from .outcome import error_info
from .state import ActivationState, Undo
from .steps import _execute, _timed

PREFIX = "c"
"""The positions of compensations: ``c1``, ``c2``, … (a body's positions are numbers)."""


def wanted(st: ActivationState, exc: BaseException) -> bool | None:
    """Whether the body's ending ``exc`` calls for the compensations: a failure (an exception
    left the body) does; the run's requested cancellation does when it asked for them
    (``None``: the request reached this activation live, the host must say); anything else
    (flowkit's control flow, an unrequested cancellation) does not."""
    if not st.undos or st.tearing_down or st.divergence is not None:
        return False
    if isinstance(exc, asyncio.CancelledError) or (
        isinstance(exc, _ContinueAsNew) and st.cancel_requested
    ):
        # (a continuation the run's cancellation overtook settles cancelled: it wins)
        return st.cancel_compensates if st.cancel_requested else False
    return isinstance(exc, Exception)


async def compensate(st: ActivationState, failed: bool) -> None:
    """Run the registered undos, latest completion first, each as a durable step; ``failed``:
    the body failed (not cancelled), so the run goes ``cancelling`` first, unless a previous
    activation did that already. The undos that failed for good are noted in
    ``st.compensation_notes``."""
    st.compensating = True
    if failed and not st.cancel_requested:
        await st.start_compensating()
    undos = sorted(st.undos, key=lambda u: u.order, reverse=True)
    for n, undo in enumerate(undos, start=st.compensation_base + 1):
        note = await _run_undo(st, f"{PREFIX}{n}", undo)
        if note:
            st.compensation_notes.append(note)


def unconsumed(st: ActivationState) -> str | None:
    """A compensation the history holds that this execution did not reach (the code no
    longer registers it): the first one's position, else ``None``."""
    left = sorted(set(st.compensations) - st.compensated, key=lambda p: int(p[len(PREFIX) :]))
    return left[0] if left else None


def describe_undo(undo: Undo, name: str) -> str:
    """An undo as a divergence report shows it."""
    return f"compensation({name!r}) of step at position {undo.step_pos}"


async def _run_undo(st: ActivationState, pos: str, undo: Undo) -> str:
    """The undo at ``pos``: its recorded outcome, else run (again after each failed attempt's
    backoff, as its retry policy allows) and recorded. Returns "" when it completed, else the
    note of its final failure."""
    fn = undo.fn
    if isinstance(fn, ReplayStub):
        name, adapter, is_async = ReplayStub.ANY_NAME, _serde.ANY_ADAPTER, True
    else:
        name, adapter, is_async = _serde.step_meta(fn)
    attempt = 1
    evs = st.compensations.get(pos)
    if evs:
        for ev in evs:
            if not answers_undo(ev, undo.step_pos, name):
                raise st.diverge(pos, describe(ev), describe_undo(undo, name))
        st.compensated.add(pos)
        last: Event = evs[-1]
        st.observe(last)
        if isinstance(last, CompensationCompleted):
            return ""
        assert isinstance(last, CompensationFailed)
        if last.retry_at is None:
            return _note(undo, last.error)
        if last.retry_at > st.host.now():
            await st.park(last.retry_at)
        attempt = len(evs) + 1
    args = (undo.arg,)
    while True:
        if st.tearing_down:
            raise _Evicted()
        if st.replay_only:
            raise st.stop_replay(pos, f"compensation({name!r})")
        await st.flush()  # the previous undo's record is durable before this one runs
        st.check_lease()
        try:
            if undo.timeout is None:
                result = await _execute(st, fn, args, {}, is_async)
            else:
                result = await _timed(st, fn, args, {}, is_async, name, undo.timeout)
        except _ControlFlow:
            raise
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if st.tearing_down or (task is not None and task.cancelling()):
                raise  # a teardown
            failure: BaseException = exc  # (the undo raised it itself: its own failure)
        except _StepCancelled as exc:  # (never: cancellation does not interrupt an undo)
            failure = exc
        except Exception as exc:
            failure = exc
        else:
            try:
                data = _serde.to_json(
                    result,
                    adapter,
                    what=f"result of compensation {name!r}",
                    max_bytes=st.max_payload_bytes,
                )
            except SerializationError as exc:
                failure = exc
            else:
                st.defer(
                    CompensationCompleted(
                        pos=pos,
                        step_pos=undo.step_pos,
                        name=name,
                        attempt=attempt,
                        result=data,
                        at=st.host.now(),
                    )
                )
                return ""
        info = error_info(failure, name, attempt)
        retry = undo.retry
        retry_at: float | None = None
        if (
            retry is not None
            and isinstance(failure, Exception)
            and not isinstance(failure, SerializationError)
            and retry.retries(failure, attempt)
        ):
            retry_at = round(st.host.now() + retry.delay_before(attempt + 1), 6)
        await st.record(
            [
                CompensationFailed(
                    pos=pos,
                    step_pos=undo.step_pos,
                    name=name,
                    attempt=attempt,
                    error=info,
                    retry_at=retry_at,
                    at=st.host.now(),
                )
            ]
        )
        if retry_at is None:
            return _note(undo, info)
        if retry_at > st.host.now():
            await st.park(retry_at)
        attempt += 1


def _note(undo: Undo, error: ErrorInfo) -> str:
    """What the run's failure says of an undo that failed for good."""
    tries = error.attempts or 1
    return (
        f"compensation {error.step or '?'!r} of the step at position {undo.step_pos} failed"
        f" after {tries} attempt{'' if tries == 1 else 's'}: {error.type}: {error.message}"
    )


def with_notes(error: ErrorInfo, notes: list[str]) -> ErrorInfo:
    """The body's error with the notes of the undos that failed for good."""
    if not notes:
        return error
    return error.model_copy(update={"message": "; ".join([error.message, *notes])})


__all__ = ["PREFIX", "compensate", "unconsumed", "wanted", "with_notes"]
