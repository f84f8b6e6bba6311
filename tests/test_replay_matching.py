"""Which recorded events answer which ctx call (``flowkit/_replay/matching.py``): one rule per
event kind, and every event type has one."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowkit import History
from flowkit._replay.matching import Call, ReplayStub, answers, describe
from flowkit.events import (
    EVENT_TYPES,
    CancelRequested,
    ChildCompleted,
    ChildFailed,
    ChildStarted,
    ErrorInfo,
    Event,
    RunCompleted,
    RunContinued,
    RunStarted,
    SignalReceived,
    SingletonGated,
    StepCompleted,
    StepFailed,
    TimerFired,
    TimerStarted,
)

CALLS: tuple[tuple[Call, str], ...] = (
    ("step", "charge"),
    ("step", "refund"),
    ("step", ReplayStub.ANY_NAME),
    ("sleep", "sleep"),
    ("wait_for_signal", "approved"),
    ("wait_for_signal", "charge"),
    ("child", "p.child.1"),
    ("start_child", "p.child.1"),
    ("child_result", "p.child.1"),
    ("child", "p.child.2"),
)
ERROR = ErrorInfo(type="ValueError", message="no")


@pytest.mark.parametrize(
    ("event", "answered"),
    [
        (StepCompleted(pos="1", name="charge"), {"step:charge", "step:<replay-stub>"}),
        (StepFailed(pos="1", name="charge", error=ERROR), {"step:charge", "step:<replay-stub>"}),
        (TimerStarted(pos="1", fire_at=5.0), {"sleep:sleep"}),
        (
            TimerStarted(pos="1", fire_at=5.0, purpose="signal_timeout"),
            {"wait_for_signal:approved", "wait_for_signal:charge"},
        ),
        (
            TimerFired(pos="1"),
            {"sleep:sleep", "wait_for_signal:approved", "wait_for_signal:charge"},
        ),
        (SignalReceived(pos="1", name="approved"), {"wait_for_signal:approved"}),
        (
            ChildStarted(pos="1", run_id="p.child.1", workflow="w"),
            {"child:p.child.1", "start_child:p.child.1"},
        ),
        (
            ChildCompleted(pos="1", run_id="p.child.1"),
            {"child:p.child.1", "child_result:p.child.1"},
        ),
        (
            ChildFailed(pos="1", run_id="p.child.1", error=ERROR),
            {"child:p.child.1", "start_child:p.child.1", "child_result:p.child.1"},
        ),
        (RunStarted(workflow="w", version="1"), set()),
        (SingletonGated(key="k"), set()),
        (CancelRequested(), set()),
        (RunCompleted(), set()),
        (RunContinued(next_run_id="r~1", input=1), set()),  # (checked at the end of the body)
    ],
    ids=lambda v: getattr(v, "type", ""),
)
def test_the_calls_an_event_answers(event: Event, answered: set[str]) -> None:
    got = {f"{call}:{name}" for call, name in CALLS if answers(event, call, name)}
    assert got == answered


def test_every_event_type_has_a_rule() -> None:
    """``answers`` decides for an event of every type (the golden histories hold them all):
    the ``match`` over the union is exhaustive."""
    seen: set[str] = set()
    for path in sorted((Path(__file__).parent / "histories").glob("*.json")):
        for ev in History.from_json(path.read_bytes()):
            for call, name in CALLS:
                assert isinstance(answers(ev, call, name), bool)
            seen.add(ev.type)
    assert seen == set(EVENT_TYPES)


def test_describe_names_the_event_as_a_report_shows_it() -> None:
    ev = StepCompleted(seq=4, pos="2.1/1", name="charge", args_digest="ab12")
    assert describe(ev) == "step_completed#4('charge', args ab12) at position 2.1/1"
    assert describe(TimerFired(seq=5, pos="3")) == "timer_fired#5 at position 3"
    assert describe(RunCompleted(seq=9)) == "run_completed#9"
