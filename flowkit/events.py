"""The events of a run's history: one pydantic model per type, the ``Event`` union of them
(discriminated on ``type``), ``EVENT_TYPES`` (the type names, read off the union) and the JSON
form a store persists (``event_to_json`` / ``event_from_json``).

Every event has ``seq`` (the store's append order, gap-free per run), ``type`` and ``at`` (the
engine's clock). Events that answer a ctx call of the body carry ``pos``, the call's position:
replay matches on it, so the branches of a ``ctx.gather`` may finish in any order. The table of
docs/getting-started.md ("Inspecting runs and their history") says when each type is written."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from ._core import serde as _serde
from ._core.limits import MAX_TIMESTAMP
from .errors import HistoryError

__all__ = [
    "EVENT_TYPES",
    "CancelRequested",
    "ChildCompleted",
    "ChildFailed",
    "ChildStarted",
    "CompensationCompleted",
    "CompensationFailed",
    "ErrorInfo",
    "Event",
    "EventReceived",
    "EventSet",
    "PatchMarker",
    "RunCancelled",
    "RunCompleted",
    "RunContinued",
    "RunDead",
    "RunFailed",
    "RunRetried",
    "RunStarted",
    "SearchUpserted",
    "SignalReceived",
    "SingletonAdmitted",
    "SingletonGated",
    "SingletonReleased",
    "StepCompleted",
    "StepFailed",
    "TimerFired",
    "TimerStarted",
    "UpdateReceived",
    "UpdateReplied",
    "event_from_json",
    "event_to_json",
]


class _Base(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    seq: int = 0
    at: float = 0.0


class ErrorInfo(BaseModel):
    """A failure as stored: exception class name, message, and flowkit's details."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: str
    message: str
    step: str | None = None
    attempts: int | None = None
    cause_type: str | None = None
    cause_message: str | None = None


class RunStarted(_Base):
    type: Literal["run_started"] = "run_started"
    workflow: str
    version: str
    input: Any = None
    # (the caller's tags, the singleton tag, and reserved ``flowkit:`` tags: the trace
    # context of ``engine.start``'s caller, ``_telemetry.TRACE_TAG_PREFIX``)
    tags: list[str] = Field(default_factory=list)


class SingletonGated(_Base):
    type: Literal["singleton_gated"] = "singleton_gated"
    key: str
    retry_at: float | None = None


class SingletonAdmitted(_Base):
    type: Literal["singleton_admitted"] = "singleton_admitted"
    key: str


class SingletonReleased(_Base):
    type: Literal["singleton_released"] = "singleton_released"
    key: str


class StepCompleted(_Base):
    type: Literal["step_completed"] = "step_completed"
    pos: str
    name: str
    attempt: int = 1
    result: Any = None
    args_digest: str | None = None


class StepFailed(_Base):
    type: Literal["step_failed"] = "step_failed"
    pos: str
    name: str
    attempt: int = 1
    error: ErrorInfo
    retry_at: float | None = None  # set: another attempt is due then; None: final failure
    cancelled: bool = False
    args_digest: str | None = None


class TimerStarted(_Base):
    type: Literal["timer_started"] = "timer_started"
    pos: str
    fire_at: float
    purpose: Literal["sleep", "signal_timeout"] = "sleep"

    @field_validator("fire_at", mode="before")
    @classmethod
    def _never(cls, value: Any) -> Any:
        """A ``null`` ``fire_at`` (an infinite timer an older flowkit wrote as JSON) reads as
        ``MAX_TIMESTAMP``: a timer that never fires, which a cancel still ends."""
        return MAX_TIMESTAMP if value is None else value


class TimerFired(_Base):
    type: Literal["timer_fired"] = "timer_fired"
    pos: str


class SignalReceived(_Base):
    type: Literal["signal_received"] = "signal_received"
    pos: str
    name: str
    payload: Any = None


class CancelRequested(_Base):
    type: Literal["cancel_requested"] = "cancel_requested"
    # None: ``engine.cancel``; "execution_timeout": the run's deadline passed
    reason: str | None = None
    # ``engine.cancel(run_id, compensate=True)``: the recorded compensations run first
    compensate: bool = False


class RunCompleted(_Base):
    type: Literal["run_completed"] = "run_completed"
    output: Any = None


class RunFailed(_Base):
    type: Literal["run_failed"] = "run_failed"
    error: ErrorInfo


class RunCancelled(_Base):
    type: Literal["run_cancelled"] = "run_cancelled"


class RunRetried(_Base):
    type: Literal["run_retried"] = "run_retried"
    attempt: int
    # ``engine.retry(run_id, input=...)``: the run goes on with this (validated) input
    new_input: bool = False
    input: Any = None


class ChildStarted(_Base):
    """``ctx.child``/``ctx.start_child`` started (or found, by its id) the child run
    ``run_id`` at position ``pos``."""

    type: Literal["child_started"] = "child_started"
    pos: str
    run_id: str
    workflow: str
    version: str | None = None


class ChildCompleted(_Base):
    """The child at ``pos`` completed with ``output`` (what its parent's call returns)."""

    type: Literal["child_completed"] = "child_completed"
    pos: str
    run_id: str
    output: Any = None


class ChildFailed(_Base):
    """The child at ``pos`` failed, was cancelled, died, or could not start: the parent's call
    raises ``ChildWorkflowError``."""

    type: Literal["child_failed"] = "child_failed"
    pos: str
    run_id: str
    error: ErrorInfo


class RunContinued(_Base):
    """``ctx.continue_as_new(input)``: the run completes and ``next_run_id`` starts with
    ``input`` in the same transaction (right before ``run_completed``)."""

    type: Literal["run_continued"] = "run_continued"
    next_run_id: str
    input: Any = None


class CompensationCompleted(_Base):
    """The compensation of the step at ``step_pos`` ran (as the durable step at ``pos``)."""

    type: Literal["compensation_completed"] = "compensation_completed"
    pos: str
    step_pos: str
    name: str
    attempt: int = 1
    result: Any = None


class CompensationFailed(_Base):
    """An attempt of the compensation of the step at ``step_pos`` failed."""

    type: Literal["compensation_failed"] = "compensation_failed"
    pos: str
    step_pos: str
    name: str
    attempt: int = 1
    error: ErrorInfo
    retry_at: float | None = None


class RunDead(_Base):
    """The run's activation was lost (its worker died, its lease expired) more than its
    ``max_recovery_attempts`` times: it settles ``dead`` (terminal; ``engine.retry`` revives it)."""

    type: Literal["run_dead"] = "run_dead"
    recoveries: int
    error: ErrorInfo | None = None


class PatchMarker(_Base):
    """``ctx.patched(patch_id)`` took the new code path (or ``ctx.deprecate_patch`` ran live).
    It takes no position: the calls around it keep theirs."""

    type: Literal["patch_marker"] = "patch_marker"
    patch_id: str


class EventSet(_Base):
    """``ctx.set_event(key, value)``: the run published ``value`` under ``key``; readers
    (``engine.get_event``) see the latest one (docs/updates.md)."""

    type: Literal["event_set"] = "event_set"
    pos: str
    key: str
    value: Any = None


class EventReceived(_Base):
    """``ctx.wait_for_event(name, match=...)`` received the published event ``event_id``
    (delivered to the waiting run, or taken from the buffer of events nobody waited for)."""

    type: Literal["event_received"] = "event_received"
    pos: str
    name: str
    event_id: str
    payload: Any = None


class UpdateReceived(_Base):
    """``ctx.wait_for_update(name)`` took the update ``update_id`` (its validated ``arg``)."""

    type: Literal["update_received"] = "update_received"
    pos: str
    name: str
    update_id: str
    arg: Any = None


class UpdateReplied(_Base):
    """``upd.reply(value)``: the answer ``engine.update`` returns to its caller, recorded
    before the caller sees it (a crash after the reply does not lose it)."""

    type: Literal["update_replied"] = "update_replied"
    pos: str
    name: str
    update_id: str
    value: Any = None


class SearchUpserted(_Base):
    """``ctx.upsert_search(**attrs)``: search attributes set (merged into the run's; values
    str, int, float or bool). Kept in clear text by ``CodecStore``: they are indexed."""

    type: Literal["search_upserted"] = "search_upserted"
    pos: str
    attrs: dict[str, str | int | float | bool]


Event = Annotated[
    RunStarted
    | SingletonGated
    | SingletonAdmitted
    | StepCompleted
    | StepFailed
    | TimerStarted
    | TimerFired
    | SignalReceived
    | CancelRequested
    | SingletonReleased
    | RunCompleted
    | RunFailed
    | RunCancelled
    | RunRetried
    | RunDead
    | PatchMarker
    | ChildStarted
    | ChildCompleted
    | ChildFailed
    | RunContinued
    | CompensationCompleted
    | CompensationFailed
    | EventSet
    | EventReceived
    | UpdateReceived
    | UpdateReplied
    | SearchUpserted,
    Field(discriminator="type"),
]
"""Any event of a history (a pydantic discriminated union on ``type``)."""
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def _type_names(union: Any) -> tuple[str, ...]:
    """The ``type`` of each model of ``union`` (an ``Annotated`` union), in its order."""
    return tuple(m.model_fields["type"].default for m in get_args(get_args(union)[0]))


EVENT_TYPES: tuple[str, ...] = _type_names(Event)
"""The type names of ``Event``, in the union's order."""


def event_to_json(event: Event) -> dict[str, Any]:
    """The JSON form of one event (what stores persist)."""
    if type(event) is StepCompleted and _serde.plain_json(event.result) and math.isfinite(event.at):
        # a step's record, the most frequent event, with a plain result: pydantic would
        # build the same dict (``tests/test_serde.py`` checks that it does)
        return {  # (in the fields' order, as pydantic's)
            "seq": event.seq,
            "at": event.at,
            "type": "step_completed",
            "pos": event.pos,
            "name": event.name,
            "attempt": event.attempt,
            "result": event.result,
            "args_digest": event.args_digest,
        }
    return event.model_dump(mode="json")


def event_from_json(data: Any) -> Event:
    """Parse one stored event; ``HistoryError`` when it is not a flowkit event."""
    try:
        return EVENT_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise HistoryError(f"corrupt event: {exc.errors()[0]['msg']} in {data!r:.200}") from exc
