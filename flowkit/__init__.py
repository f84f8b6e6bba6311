"""flowkit: durable workflows as plain async Python, with singleton lanes."""

import contextlib as _contextlib

from ._clock import Clock, SystemClock
from ._context import ChildHandle, WorkflowCtx
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
from .errors import (
    ChildWorkflowError,
    FlowkitError,
    HistoryError,
    InvalidInputError,
    NonDeterminismError,
    ResultTimeoutError,
    RunCancelledError,
    RunNotFoundError,
    RunStateError,
    SerializationError,
    SignalTimeout,
    SingletonQueueFullError,
    StepFailedError,
    StepTimeoutError,
    UnsupportedStoreError,
    WorkflowFailedError,
    WorkflowNotFoundError,
)
from .events import Event

__all__ = [
    "ADMITTED_TAG",
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
    "ReplayFailedError",
    "ReplayReport",
    "ReplayResult",
    "ResultTimeoutError",
    "RetryPolicy",
    "Run",
    "RunCancelledError",
    "RunNotFoundError",
    "RunStateError",
    "RunStatus",
    "SerializationError",
    "SignalTimeout",
    "Singleton",
    "SingletonQueueFullError",
    "StepFailedError",
    "StepTimeoutError",
    "SystemClock",
    "UnsupportedStoreError",
    "WorkflowCtx",
    "WorkflowDefinition",
    "WorkflowFailedError",
    "WorkflowNotFoundError",
    "replay",
    "replay_async",
    "replay_dir",
    "replay_dir_async",
    "workflow",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or callable(_obj):
        with _contextlib.suppress(AttributeError, TypeError):
            _obj.__module__ = "flowkit"
