"""``History``: a run's ordered events, with the canonical JSON that ``flowkit replay`` and
``replay_dir`` read; and ``step_completed``, the engine's fast way to build a step's record.

The event models live in ``flowkit.events``; they are re-exported here for the modules that
still import them from this one."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import BaseModel

from .. import events as _events
from .._core import serde as _serde
from ..errors import HistoryError
from ..events import *  # noqa: F403  (the old import path of the event names)
from ..events import Event, RunStarted, StepCompleted, event_from_json, event_to_json

__all__ = [*_events.__all__, "HISTORY_FORMAT", "History", "step_completed"]

HISTORY_FORMAT = "flowkit.history/1"


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
