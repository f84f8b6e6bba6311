"""Whether a recorded event answers a ctx call: one function per event kind, chosen by
``answers`` with an exhaustive ``match`` over ``Event`` (a new event type fails the type check
here until it says which calls it answers)."""

from __future__ import annotations

from typing import Any, Literal, assert_never

from ..events import (
    CancelRequested,
    ChildCompleted,
    ChildFailed,
    ChildStarted,
    CompensationCompleted,
    CompensationFailed,
    Event,
    EventReceived,
    EventSet,
    PatchMarker,
    RunCancelled,
    RunCompleted,
    RunContinued,
    RunDead,
    RunFailed,
    RunRetried,
    RunStarted,
    SearchUpserted,
    SignalReceived,
    SingletonAdmitted,
    SingletonGated,
    SingletonReleased,
    StepCompleted,
    StepFailed,
    TimerFired,
    TimerStarted,
    UpdateReceived,
    UpdateReplied,
)

Call = Literal[
    "step",
    "sleep",
    "wait_for_signal",
    "child",
    "start_child",
    "child_result",
    "set_event",
    "wait_for_event",
    "wait_for_update",
    "update_reply",
    "upsert_search",
]
"""The ctx calls that take a position and find their outcome in the history (a
``ctx.gather`` takes one too, but records nothing there: its children do)."""


class ReplayStub:
    """Stands in for services a workflow got through its constructor when ``replay`` is
    given a class it cannot construct: replay never calls steps, so any attribute path will
    do, and such steps are matched by position and kind only (their name is ``ANY_NAME``)."""

    ANY_NAME = "<replay-stub>"

    def __init__(self, path: str) -> None:
        self._path = path

    def __getattr__(self, name: str) -> ReplayStub:
        if name.startswith("__"):
            raise AttributeError(name)
        return ReplayStub(f"{self._path}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"replay never executes steps ({self._path} was called)")


def answers(ev: Event, call: Call, name: str) -> bool:
    """Whether ``ev``, recorded at the position of ``call`` (of the step or signal ``name``;
    ``"sleep"`` for a sleep, the child's run id for a child call), is an outcome of that
    call, not of another one."""
    match ev:
        case StepCompleted():  # (first: the event replay meets most)
            return _step_completed(ev, call, name)
        case StepFailed():
            return _step_failed(ev, call, name)
        case TimerStarted():
            return _timer_started(ev, call)
        case TimerFired():
            return _timer_fired(call)
        case SignalReceived():
            return _signal_received(ev, call, name)
        case ChildStarted():
            return _child_started(ev, call, name)
        case ChildCompleted() | ChildFailed():
            return _child_outcome(ev, call, name)
        case EventSet():
            return call == "set_event" and ev.key == name
        case EventReceived():
            return call == "wait_for_event" and ev.name == name
        case UpdateReceived():
            return call == "wait_for_update" and ev.name == name
        case UpdateReplied():
            return call == "update_reply" and ev.update_id == name
        case SearchUpserted():
            return call == "upsert_search" and search_name(ev.attrs) == name
        case (
            RunStarted()
            | SingletonGated()
            | SingletonAdmitted()
            | SingletonReleased()
            | CancelRequested()
            | RunCompleted()
            | RunFailed()
            | RunCancelled()
            | RunRetried()
            | RunDead()
            | PatchMarker()
            # (issue #21: the helpers building them give them their own rules)
        ):
            return _of_the_run()
        case CompensationCompleted() | CompensationFailed():
            return _compensation()
        case RunContinued():
            return _run_continued()
        case _:
            assert_never(ev)


def _step_completed(ev: StepCompleted, call: Call, name: str) -> bool:
    return call == "step" and (ev.name == name or name == ReplayStub.ANY_NAME)


def _step_failed(ev: StepFailed, call: Call, name: str) -> bool:
    return call == "step" and (ev.name == name or name == ReplayStub.ANY_NAME)


_TIMED_WAITS = ("wait_for_signal", "wait_for_event", "wait_for_update")
"""The waits that take a ``timeout``: its timer is a ``signal_timeout`` at their position."""


def _timer_started(ev: TimerStarted, call: Call) -> bool:
    if call == "sleep":
        return ev.purpose == "sleep"
    return call in _TIMED_WAITS and ev.purpose == "signal_timeout"


def _timer_fired(call: Call) -> bool:
    # (the timer it ends, at the same position, says whose it was)
    return call == "sleep" or call in _TIMED_WAITS


def search_name(attrs: Any) -> str:
    """What an ``upsert_search`` call is matched by: its attribute names, sorted (a changed
    body that sets other attributes at that position diverges; new values do not)."""
    return ",".join(sorted(attrs))


def _signal_received(ev: SignalReceived, call: Call, name: str) -> bool:
    return call == "wait_for_signal" and ev.name == name


def _compensation() -> bool:
    # (at the reserved positions ``c<n>``, which no body call takes: ``answers_undo`` matches
    # them against the undo the body registered)
    return False


def answers_undo(ev: Event, step_pos: str, name: str) -> bool:
    """Whether ``ev``, recorded at the position of a compensation, is an outcome of the undo
    ``name`` of the step at ``step_pos``: a changed body (another step completed, in another
    order) or a changed undo diverges."""
    if not isinstance(ev, CompensationCompleted | CompensationFailed):
        return False
    return ev.step_pos == step_pos and (ev.name == name or name == ReplayStub.ANY_NAME)


def _run_continued() -> bool:
    # ``ctx.continue_as_new`` takes no position: like the output, its input is checked at the
    # end of the body (``replayer.replay_async``: a body that no longer continues, or
    # continues with another input, diverges there)
    return False


def _child_started(ev: ChildStarted, call: Call, name: str) -> bool:
    # (a ``ctx.child`` or ``ctx.start_child`` of the same child id; the call checks the
    # workflow too)
    return call in ("child", "start_child") and ev.run_id == name


def _child_outcome(ev: ChildCompleted | ChildFailed, call: Call, name: str) -> bool:
    # ``ctx.child`` records its child's outcome at its own position, ``ChildHandle.result()``
    # at its own; a ``child_failed`` at a ``start_child`` is a child that could not start
    if isinstance(ev, ChildFailed) and call == "start_child":
        return ev.run_id == name
    return call in ("child", "child_result") and ev.run_id == name


def _of_the_run() -> bool:
    # events of the run as a whole carry no position: they answer no call
    return False


def describe(ev: Event) -> str:
    """An event as a divergence report shows it: type, seq, name (a patch marker's id),
    arguments' digest, position."""
    name = getattr(ev, "name", None) or getattr(ev, "patch_id", None) or getattr(ev, "run_id", None)
    text = f"{ev.type}#{ev.seq}"
    if name:
        digest = getattr(ev, "args_digest", None)
        text += f"({name!r}" + (f", args {digest}" if digest else "") + ")"
    pos = getattr(ev, "pos", None)
    return text + (f" at position {pos}" if pos is not None else "")
