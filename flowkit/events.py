"""Event models (pydantic, discriminated on ``type``) and ``History`` with canonical JSON.

Events that answer a body call carry ``pos``: the body's call position. ``seq`` is the store's
append order (gap-free per run); ``pos`` is what replay matches on, so concurrent branches of a
``ctx.gather`` may complete in any order without confusing replay."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from . import _serde
from .errors import HistoryError

HISTORY_FORMAT = "flowkit.history/1"


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


def _step_completed_unchecked(
    pos: str, name: str, attempt: int, result: Any, args_digest: str | None, at: float
) -> StepCompleted:
    # what ``BaseModel.model_construct`` sets, without its per-field work
    ev = StepCompleted.__new__(StepCompleted)
    setattr_ = object.__setattr__
    setattr_(
        ev,
        "__dict__",
        {
            "seq": 0,
            "at": at,
            "type": "step_completed",
            "pos": pos,
            "name": name,
            "attempt": attempt,
            "result": result,
            "args_digest": args_digest,
        },
    )
    setattr_(
        ev, "__pydantic_fields_set__", {"pos", "name", "attempt", "result", "args_digest", "at"}
    )
    setattr_(ev, "__pydantic_extra__", None)
    setattr_(ev, "__pydantic_private__", None)
    return ev


def _unchecked_is_validated() -> bool:
    """Whether ``_step_completed_unchecked`` builds exactly the validated model (with this
    pydantic): else ``step_completed`` validates."""
    args: dict[str, Any] = {
        "pos": "1",
        "name": "f",
        "attempt": 2,
        "result": [1],
        "args_digest": "ab",
        "at": 1.5,
    }
    try:
        fast, slow = _step_completed_unchecked(**args), StepCompleted(**args)
        made = StepCompleted.model_construct(**args)
        decorators = StepCompleted.__pydantic_decorators__
        return bool(
            fast == slow == made
            and list(fast.__dict__) == list(slow.__dict__) == list(made.__dict__)
            and fast.model_fields_set == slow.model_fields_set == made.model_fields_set
            and fast.model_dump() == slow.model_dump()
            and BaseModel.__slots__
            == ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")
            # nothing of the model's own runs on validation (it would be skipped)
            and not decorators.validators
            and not decorators.field_validators
            and not decorators.root_validators
            and not decorators.model_validators
            and StepCompleted.__pydantic_post_init__ is None
        )
    except Exception:  # pragma: no cover - a pydantic that builds models otherwise
        return False


_UNCHECKED = _unchecked_is_validated()


def step_completed(
    pos: str, name: str, attempt: int, result: Any, args_digest: str | None, at: float
) -> StepCompleted:
    """The record of a step that succeeded, from values the engine made (``result`` already
    JSON, by ``_serde.to_json``): without pydantic's validation when this pydantic builds the
    same model that way (checked once, at import). A step's record is the most frequent
    event, and the validator is a lot of code that runs cold after every commit's fsync."""
    if _UNCHECKED and type(pos) is str and type(name) is str and type(at) is float:
        return _step_completed_unchecked(pos, name, attempt, result, args_digest, at)
    return StepCompleted(
        pos=pos, name=name, attempt=attempt, result=result, args_digest=args_digest, at=at
    )


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


Event = Annotated[
    RunStarted
    | SingletonGated
    | SingletonAdmitted
    | SingletonReleased
    | StepCompleted
    | StepFailed
    | TimerStarted
    | TimerFired
    | SignalReceived
    | CancelRequested
    | RunCompleted
    | RunFailed
    | RunCancelled
    | RunRetried,
    Field(discriminator="type"),
]
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
EVENT_LIST_ADAPTER: TypeAdapter[list[Event]] = TypeAdapter(list[Event])
EVENT_TYPES: tuple[str, ...] = (
    "run_started",
    "singleton_gated",
    "singleton_admitted",
    "step_completed",
    "step_failed",
    "timer_started",
    "timer_fired",
    "signal_received",
    "cancel_requested",
    "singleton_released",
    "run_completed",
    "run_failed",
    "run_cancelled",
    "run_retried",
)
TERMINAL_EVENTS = frozenset({"run_completed", "run_failed", "run_cancelled"})


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


class History(Sequence[Event]):
    """A run's ordered events. ``to_json()``/``from_json()`` round-trip byte for byte."""

    def __init__(self, run_id: str, events: Sequence[Event]) -> None:
        self.run_id = run_id
        self.events: tuple[Event, ...] = tuple(events)
        for i, ev in enumerate(self.events, start=1):
            if ev.seq != i:
                raise HistoryError(
                    f"history of {run_id!r} is not gap-free: event #{i} has seq {ev.seq}"
                )

    def __len__(self) -> int:
        return len(self.events)

    def __getitem__(self, i: Any) -> Any:
        return self.events[i]

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, History):
            return NotImplemented
        return other.run_id == self.run_id and other.events == self.events

    def __hash__(self) -> int:
        return hash((self.run_id, self.events))

    def __repr__(self) -> str:
        return f"History({self.run_id!r}, {len(self.events)} events)"

    @property
    def types(self) -> list[str]:
        """Event types in order: handy in tests."""
        return [e.type for e in self.events]

    @property
    def workflow(self) -> str | None:
        first = self.events[0] if self.events else None
        return first.workflow if isinstance(first, RunStarted) else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": HISTORY_FORMAT,
            "run_id": self.run_id,
            "events": [event_to_json(e) for e in self.events],
        }

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, compact)."""
        return _serde.dumps(self.to_dict()).decode()

    @classmethod
    def from_json(cls, raw: str | bytes) -> History:
        """Parse ``to_json()`` output; ``HistoryError`` for anything else."""
        try:
            data = _serde.loads(raw)
        except Exception as exc:
            raise HistoryError(f"history is not valid JSON: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != HISTORY_FORMAT:
            raise HistoryError(f"not a flowkit history (expected format {HISTORY_FORMAT!r})")
        run_id = data.get("run_id")
        events = data.get("events")
        if not isinstance(run_id, str) or not isinstance(events, list):
            raise HistoryError("history needs a string run_id and a list of events")
        parsed = [event_from_json(e) for e in events]
        if not parsed or not isinstance(parsed[0], RunStarted):
            raise HistoryError("history must start with a run_started event")
        return cls(run_id, parsed)
