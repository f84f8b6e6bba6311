"""flowkit: durable workflows as plain async Python, with singleton lanes."""

import contextlib as _contextlib

from . import _boot  # noqa: F401  # (first: a ``flowkit worker`` process catches SIGTERM now)
from ._clock import Clock, SystemClock
from ._context import ChildHandle, UpdateRequest, WorkflowCtx
from ._definition import RetryPolicy, Singleton, WorkflowDefinition, workflow
from ._engine import Engine
from ._history import History
from ._replay.replayer import (
    ReplayFailedError,
    ReplayReport,
    ReplayResult,
    replay,
    replay_async,
    replay_dir,
    replay_dir_async,
)
from ._run import ADMITTED_TAG, Run, RunStatus
from ._schedules import Schedule, Schedules
from ._updates import update_validator
from .errors import (
    CallRefusedError,
    ChildWorkflowError,
    FlowkitError,
    HistoryError,
    InvalidInputError,
    NonDeterminismError,
    NotFoundError,
    ReplayError,
    ResultTimeoutError,
    RunCancelledError,
    RunNotCompletedError,
    RunNotFoundError,
    RunStateError,
    ScheduleNotFoundError,
    SerializationError,
    SignalTimeout,
    SignalTimeoutError,
    SingletonQueueFullError,
    StepFailedError,
    StepTimeoutError,
    StoreError,
    UnsupportedStoreError,
    UpdateNotRepliedError,
    UpdateRejectedError,
    VersionMismatchError,
    WorkflowFailedError,
    WorkflowNotFoundError,
)
from .events import Event

__all__ = [
    "ADMITTED_TAG",
    "CallRefusedError",
    "ChildHandle",
    "ChildWorkflowError",
    "Clock",
    "Engine",
    "Event",
    "FlowkitError",
    "History",
    "HistoryError",
    "InvalidInputError",
    "NonDeterminismError",
    "NotFoundError",
    "ReplayError",
    "ReplayFailedError",
    "ReplayReport",
    "ReplayResult",
    "ResultTimeoutError",
    "RetryPolicy",
    "Run",
    "RunCancelledError",
    "RunNotCompletedError",
    "RunNotFoundError",
    "RunStateError",
    "RunStatus",
    "Schedule",
    "ScheduleNotFoundError",
    "Schedules",
    "SerializationError",
    "SignalTimeout",
    "SignalTimeoutError",
    "Singleton",
    "SingletonQueueFullError",
    "StepFailedError",
    "StepTimeoutError",
    "StoreError",
    "SystemClock",
    "UnsupportedStoreError",
    "UpdateNotRepliedError",
    "UpdateRejectedError",
    "UpdateRequest",
    "VersionMismatchError",
    "WorkflowCtx",
    "WorkflowDefinition",
    "WorkflowFailedError",
    "WorkflowNotFoundError",
    "replay",
    "replay_async",
    "replay_dir",
    "replay_dir_async",
    "update_validator",
    "workflow",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or callable(_obj):
        with _contextlib.suppress(AttributeError, TypeError):
            _obj.__module__ = "flowkit"
