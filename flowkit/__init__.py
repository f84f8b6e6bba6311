"""flowkit: durable workflows as plain async Python, with singleton lanes."""

import contextlib as _contextlib

from ._client.engine import Engine
from ._client.schedules import Schedule, Schedules
from ._client.updates import update_validator
from ._core import boot as _boot  # noqa: F401  # (first: a ``flowkit worker`` process catches SIGTERM now)
from ._core.clock import Clock, SystemClock
from ._core.run import ADMITTED_TAG, Run, RunStatus
from ._model.ctx import ChildHandle, UpdateRequest, WorkflowCtx
from ._model.definition import RetryPolicy, Singleton, WorkflowDefinition, workflow
from ._model.history import History
from ._replay.replayer import (
    ReplayFailedError,
    ReplayReport,
    ReplayResult,
    replay,
    replay_async,
    replay_dir,
    replay_dir_async,
)
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
