"""The error tree of flowkit, grouped by what the caller can do; every error says who raises it.

Catch a group to handle all its errors one way (docs/writing-workflows.md, "Errors"). Every
error also keeps the built-in bases it has always had ("also a ..."), so an ``except
ValueError`` / ``LookupError`` / ``TimeoutError`` keeps catching it; the three timeouts have
``TimeoutError`` as their group.

::

    FlowkitError                   anything flowkit raises on purpose
    ├── CallRefusedError           refused before anything was written: change the call, or try
    │   │                          it again later; the engine, the store and the run are as before
    │   ├── InvalidInputError      start()/signal()/update(), stores: a value or an identifier is
    │   │                          not valid (run()'s annotation, a limit) (also a ValueError)
    │   ├── SingletonQueueFullError  start(): the singleton key's queue is at limit +
    │   │                          max_queue_depth: shed the request or start it later
    │   ├── RunIdTakenError        start(): the run id belongs to another namespace
    │   ├── RunStateError          retry()/signal(): the run is in a status that forbids the call
    │   └── UpdateRejectedError    update(): the workflow's update validator refused it
    ├── NotFoundError              no such workflow, run or schedule: check the name or id
    │   │                          (also a LookupError)
    │   ├── WorkflowNotFoundError  start()/replay: no workflow registered under that name
    │   │   └── VersionMismatchError  replay: the history was recorded on a version the code
    │   │                          lacks (also a ReplayError)
    │   ├── RunNotFoundError       signal()/cancel()/result()/...: no run with that id
    │   └── ScheduleNotFoundError  engine.schedules: no schedule with that id
    ├── RunNotCompletedError       the run ended without an output: read why (``run_id``,
    │   │                          ``cause``), then retry() it, compensate or give up
    │   ├── WorkflowFailedError    result(): the run settled `failed` or `dead`; `.cause` says why
    │   ├── RunCancelledError      result(): the run settled `cancelled`
    │   └── ChildWorkflowError     ctx.child(): the child failed, was cancelled, died or never
    │                              started
    ├── ReplayError                the recorded history and the code disagree: keep the old code
    │   │                          path (ctx.patched, a new version) or fix the history file
    │   ├── NonDeterminismError    replay: the body issued a different ctx call than the history
    │   ├── HistoryError           History.from_json()/replay: a corrupt or foreign history
    │   │                          (also a ValueError)
    │   └── ReplayFailedError      replay_dir report: some recorded histories no longer replay
    │                              (also an AssertionError; defined in flowkit._replay.replayer)
    ├── StoreError                 the store, not the call, is at fault: fix its setup (URL,
    │   │                          schema, keys, store class), or try again later
    │   ├── StoreUnavailableError  SqlStore: the database cannot be reached now: try again later
    │   ├── UnsupportedStoreError  start()/Engine(): the store lacks an operation the workflow needs
    │   ├── UnsupportedDatabaseError  SqlStore(url): not a supported database URL
    │   │                          (also a ValueError)
    │   ├── NotAFlowkitDatabaseError  SqlStore.check(url): the URL names no flowkit database
    │   ├── SchemaVersionError     SqlStore: the database has a newer schema version
    │   ├── CodecError             CodecStore: a stored payload cannot be decoded
    │   │   └── EncryptedStoreError  a plain store met a database whose payloads are encrypted
    │   ├── LeaseLostError         stores: the caller no longer owns the run's lease (the engine
    │   │                          handles it)
    │   └── ConflictError          Store.commit(): a precondition (status, signal) no longer holds
    │                              (the engine re-reads and decides again)
    ├── StepFailedError            ctx.step(): the step's final attempt failed
    ├── SerializationError         ctx.step()/start(): a value cannot be stored as JSON
    │                              (also a TypeError)
    ├── UpdateNotRepliedError      update(): the run settled without replying
    ├── SignalTimeout              ctx.wait_for_signal(): the timeout elapsed; also named
    │                              SignalTimeoutError (also a TimeoutError)
    ├── ResultTimeoutError         result(): the run did not settle in time (also a TimeoutError)
    └── StepTimeoutError           ctx.step(timeout=): an attempt ran too long
                                   (also a TimeoutError)
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any


class FlowkitError(Exception):
    """Base class of every error flowkit raises on purpose."""


class CallRefusedError(FlowkitError):
    """The call was refused before it wrote anything: change the call, or try it again later.

    The engine, the store and the run are as they were, so dropping or retrying the call is
    safe (a web handler answers 400 or 409). The subclass and its fields say what was wrong."""


class NotFoundError(FlowkitError, LookupError):
    """No workflow, run or schedule by that name or id: check the name, the id, the namespace.

    Nothing was written (a web handler answers 404); the subclass names what was looked for."""


class RunNotCompletedError(FlowkitError):
    """The run ended without an output (failed, dead, cancelled) and never will have one.

    Raised by ``Engine.result`` and, in a parent's body, by ``ctx.child`` (also for a child
    that could not start). ``run_id`` is the run that did not complete; the subclass says how
    it ended. A caller reads why, then retries the run (``Engine.retry``), compensates, or
    gives up."""

    run_id: str


class ReplayError(FlowkitError):
    """The recorded history and the workflow code disagree, or the history cannot be read.

    No store or retry fixes it: keep the old code path for recorded runs (``ctx.patched``, a
    new version of the workflow), or fix the history file."""


class StoreError(FlowkitError):
    """The store, not the call or the workflow, is at fault: fix its setup, or try again later.

    ``StoreUnavailableError`` is worth trying again later; the others need a change of setup
    (the URL, the schema, the codec's keys, a store that has the operation). ``LeaseLostError``
    and ``ConflictError`` are the engine's to handle."""


class InvalidInputError(CallRefusedError, ValueError):
    """Raised by ``Engine.start`` when the input does not validate, and by any call given an
    identifier or payload no store keeps (docs/stores.md, "Limits"); nothing is written.
    ``workflow`` is ``None`` where the caller named no workflow (a store's own check)."""

    def __init__(self, workflow: str | None, detail: str) -> None:
        self.workflow = workflow
        self.detail = detail
        where = "" if workflow is None else f" for workflow {workflow!r}"
        super().__init__(f"invalid input{where}: {detail}")


class SingletonQueueFullError(CallRefusedError):
    """Raised by ``Engine.start`` when a singleton key already has ``limit + max_queue_depth``
    active runs; no run is created."""

    def __init__(self, workflow: str, key: str, max_queue_depth: int, limit: int = 1) -> None:
        self.workflow = workflow
        self.key = key
        self.max_queue_depth = max_queue_depth
        self.limit = limit
        super().__init__(
            f"singleton queue full for workflow {workflow!r} key {key!r}: "
            f"{limit} running + {max_queue_depth} waiting already; no run was created. "
            "Retry the start later, shed the request, or raise max_queue_depth."
        )


class UnsupportedStoreError(StoreError):
    """Raised by ``Engine.start`` when the store lacks an operation (e.g. singleton admission)."""


class NonDeterminismError(ReplayError):
    """Raised during replay when the body's ctx calls diverge from the recorded history.

    ``position`` is the body's call position, ``recorded`` describes the recorded event (or
    ``None``), ``call`` describes the call the code made instead (or ``None``)."""

    def __init__(
        self,
        position: str | int,
        recorded: str | None,
        call: str | None,
        detail: str = "",
        window: tuple[str, ...] = (),
    ) -> None:
        self.position = position
        self.recorded = recorded
        self.call = call
        self.window = window
        msg = (
            f"non-deterministic workflow at position {position}: "
            f"history recorded {recorded or 'nothing'}, code called {call or 'nothing'}"
        )
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)

    def report(self) -> str:
        """The message plus the recorded events around the divergence."""
        lines = [str(self)]
        if self.window:
            lines.append("recorded events around it:")
            lines.extend(f"  {w}" for w in self.window)
        return "\n".join(lines)


class WorkflowNotFoundError(NotFoundError):
    """Raised when a workflow name (or class) is not registered on the engine; ``version``
    names the version a start pinned (or the class's own) when that is what is missing."""

    def __init__(self, workflow: str, version: str | None = None) -> None:
        self.workflow = workflow
        self.version = version
        at = "" if version is None else f" version {version!r}"
        super().__init__(f"unknown workflow {workflow!r}{at}")


class VersionMismatchError(WorkflowNotFoundError, ReplayError):
    """Raised by ``replay`` (and reported by ``replay_dir`` / ``flowkit replay``) before any
    replay when the history was recorded on a version of its workflow that the code given
    does not have: a run resumes only on the version it started on, so replaying it against
    another version's body would report a divergence that can never happen. ``workflow`` and
    ``version`` are the history's; ``available`` the versions of that workflow given."""

    def __init__(self, workflow: str, version: str, available: tuple[str, ...]) -> None:
        super().__init__(workflow, version)
        self.available = available
        given = ", ".join(repr(v) for v in available) or "none"
        self.args = (
            f"the history of workflow {workflow!r} was recorded on version {version!r}, and "
            f"the code given has version{'s' if len(available) > 1 else ''} {given}: "
            f"replay it against the class of version {version!r} (a run resumes only on "
            "the version it started on)",
        )


class RunNotFoundError(NotFoundError):
    """Raised by engine calls that name a run id the store does not know."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"unknown run {run_id!r}")


class RunIdTakenError(CallRefusedError):
    """Raised by ``Engine.start`` on a namespace-scoped store when the run id already exists
    in another namespace (ids are unique per store, not per namespace)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run id {run_id!r} is already used in another namespace")


class RunStateError(CallRefusedError):
    """Raised when a call is not allowed in the run's current status (e.g. retry of a
    completed run)."""

    def __init__(self, run_id: str, status: str, detail: str) -> None:
        self.run_id = run_id
        self.status = status
        super().__init__(f"run {run_id!r} is {status}: {detail}")


class WorkflowFailedError(RunNotCompletedError):
    """Raised by ``Engine.result`` for a run that settled ``failed``; ``cause`` holds the
    reconstructed failure (e.g. a ``StepFailedError``)."""

    def __init__(self, run_id: str, error: dict[str, Any], cause: BaseException | None) -> None:
        self.run_id = run_id
        self.error = error
        self.cause = cause
        super().__init__(
            f"run {run_id!r} failed: {error.get('type', 'Error')}: {error.get('message', '')}"
        )
        self.__cause__ = cause


class ChildWorkflowError(RunNotCompletedError):
    """Raised in a parent's body by ``ctx.child`` / ``ChildHandle.result()`` when the child
    failed, was cancelled, died, or could not start (queue full, unknown workflow, invalid
    input, a store without what it needs, a singleton parent awaiting a child queued behind
    itself): the parent never hangs on a child that never started. ``cause`` says why (an
    exception rebuilt from the child's error, or the one its start raised)."""

    def __init__(
        self, run_id: str, workflow: str, cause: BaseException | None, message: str = ""
    ) -> None:
        self.run_id = run_id
        self.workflow = workflow
        self.cause = cause
        detail = message or (f"{type(cause).__name__}: {cause}" if cause is not None else "")
        super().__init__(f"child run {run_id!r} ({workflow}) did not complete: {detail}")
        self.__cause__ = cause


class RunCancelledError(RunNotCompletedError):
    """Raised by ``Engine.result`` for a run that settled ``cancelled``."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id!r} was cancelled")


class SignalTimeout(FlowkitError, TimeoutError):
    """Raised inside a workflow by ``ctx.wait_for_signal`` when its timeout elapses; it is a
    ``TimeoutError`` and so an ``asyncio.TimeoutError``. ``SignalTimeoutError`` is the same
    class."""

    def __init__(self, name: str, timeout: float) -> None:
        self.name = name
        self.timeout = timeout
        super().__init__(f"no signal {name!r} within {timeout} s")


SignalTimeoutError = SignalTimeout
"""``SignalTimeout`` under the name the other errors follow: the same class, either catches it."""


class ResultTimeoutError(FlowkitError, TimeoutError):
    """Raised by ``Engine.result`` when the run has not settled within ``timeout`` seconds;
    the message says the run's status and, for a run no worker holds, the likely cause."""

    def __init__(self, run_id: str, status: str, timeout: float, hint: str = "") -> None:
        self.run_id = run_id
        self.status = status
        self.timeout = timeout
        super().__init__(
            f"run {run_id!r} did not settle within {timeout:g} s: it is {status!r}"
            + (f"; {hint}" if hint else "")
        )


class StepFailedError(FlowkitError):
    """Raised inside a workflow by ``ctx.step`` when the step's final attempt failed (also on
    replay, from the recorded failure). ``error_type`` is the original exception's class name."""

    def __init__(self, step: str, error_type: str, message: str, attempts: int) -> None:
        self.step = step
        self.error_type = error_type
        self.message = message
        self.attempts = attempts
        super().__init__(
            f"step {step!r} failed after {attempts} attempt(s): {error_type}: {message}"
        )


class StepTimeoutError(FlowkitError, TimeoutError):
    """An attempt of ``ctx.step(..., timeout=s)`` ran longer than ``timeout`` seconds: it was
    cancelled (an async step) or abandoned in its thread (a sync step). The retry policy treats
    it as any other failure."""

    def __init__(self, step: str, timeout: float) -> None:
        self.step = step
        self.timeout = timeout
        super().__init__(f"step {step!r} timed out after {timeout:g} s")


class SerializationError(FlowkitError, TypeError):
    """Raised when a value (input, step result, output, signal payload) cannot be stored."""


class HistoryError(ReplayError, ValueError):
    """Raised by ``History.from_json`` and replay for corrupt or foreign histories."""


class LeaseLostError(StoreError):
    """Raised by stores when the caller no longer owns the run's execution lease."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"lease on run {run_id!r} lost")


class ConflictError(StoreError):
    """Raised by ``Store.commit`` when a precondition (expected status, signal still in the
    inbox, lease) no longer holds; the caller re-reads and decides again."""


class CodecError(StoreError):
    """A stored payload cannot be decoded: encrypted with a key id the codec does not have,
    tampered with, moved from another run or field, or not encoded at all. ``key_id`` names
    the key when it is known; ``run_id`` and ``field`` (``"input"``,
    ``"event/step_completed/3/result"``...) the value, when ``CodecStore`` read it.
    ``missing_key``: the fault is this process's, not the value's (a key id it does not have,
    or no keys at all: ``EncryptedStoreError``); deploying the key fixes it, so a worker
    should leave the run for a process that has it rather than fail it. Otherwise the stored
    value itself is bad (tampered, moved, corrupted) and no key will read it."""

    def __init__(
        self,
        message: str,
        *,
        key_id: str | None = None,
        run_id: str | None = None,
        field: str | None = None,
        missing_key: bool = False,
    ) -> None:
        self.key_id = key_id
        self.run_id = run_id
        self.field = field
        self.missing_key = missing_key
        super().__init__(message)


class EncryptedStoreError(CodecError):
    """A plain store (not wrapped by a ``CodecStore``) was asked to write a payload, or to
    claim a run, in a database whose payloads are encrypted (a ``CodecStore`` marked it): the
    payload would be stored in clear and wedge the run. Nothing is written. ``marker`` is what
    the database records about its codec (e.g. ``"aesgcm kid=2025-01"``)."""

    def __init__(self, message: str, *, marker: str) -> None:
        self.marker = marker
        super().__init__(message, missing_key=True)


class SchemaVersionError(StoreError):
    """The database carries a flowkit schema version this code does not understand."""

    def __init__(self, found: int, supported: int) -> None:
        self.found = found
        self.supported = supported
        super().__init__(
            f"the flowkit database has schema version {found}, but this flowkit supports "
            f"schema version {supported}; upgrade flowkit to open it"
        )


class UnsupportedDatabaseError(StoreError, ValueError):
    """``SqlStore`` was given a URL of a database it does not support (or cannot load)."""


class StoreUnavailableError(StoreError):
    """The store cannot reach or use its database now (server down or restarting, a reset or
    stalled connection, a lock held too long): worth trying again later. ``unsettled``: an
    abandoned call that may still commit sets it to an awaitable that is done once the call
    has really returned; a worker reads the run again only after it."""

    unsettled: Awaitable[None] | None = None


class NotAFlowkitDatabaseError(StoreError):
    """Raised by ``SqlStore.check`` for a URL that names no flowkit database: an in-memory
    one, another application's, or none at all (``missing``: no file at that path)."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        self.missing = missing
        super().__init__(message)


class UpdateRejectedError(CallRefusedError):
    """Raised by ``Engine.update`` when the workflow's ``@update_validator`` for ``name``
    raised: nothing was written to the run. ``cause`` is the validator's exception."""

    def __init__(self, run_id: str, name: str, cause: BaseException) -> None:
        self.run_id = run_id
        self.name = name
        self.cause = cause
        super().__init__(
            f"update {name!r} of run {run_id!r} rejected: {type(cause).__name__}: {cause}"
        )
        self.__cause__ = cause


class UpdateNotRepliedError(FlowkitError):
    """Raised by ``Engine.update`` when the run settled (``status``) before it replied to the
    update: no answer will ever come."""

    def __init__(self, run_id: str, name: str, status: str) -> None:
        self.run_id = run_id
        self.name = name
        self.status = status
        super().__init__(f"run {run_id!r} settled {status} without replying to update {name!r}")


class ScheduleNotFoundError(NotFoundError):
    """Raised by ``engine.schedules`` calls given a schedule id the store does not have."""

    def __init__(self, schedule_id: str) -> None:
        self.schedule_id = schedule_id
        super().__init__(f"no schedule {schedule_id!r}")


__all__ = [
    "CallRefusedError",
    "ChildWorkflowError",
    "CodecError",
    "ConflictError",
    "EncryptedStoreError",
    "FlowkitError",
    "HistoryError",
    "InvalidInputError",
    "LeaseLostError",
    "NonDeterminismError",
    "NotAFlowkitDatabaseError",
    "NotFoundError",
    "ReplayError",
    "ResultTimeoutError",
    "RunCancelledError",
    "RunIdTakenError",
    "RunNotCompletedError",
    "RunNotFoundError",
    "RunStateError",
    "ScheduleNotFoundError",
    "SchemaVersionError",
    "SerializationError",
    "SignalTimeout",
    "SignalTimeoutError",
    "SingletonQueueFullError",
    "StepFailedError",
    "StepTimeoutError",
    "StoreError",
    "StoreUnavailableError",
    "UnsupportedDatabaseError",
    "UnsupportedStoreError",
    "UpdateNotRepliedError",
    "UpdateRejectedError",
    "VersionMismatchError",
    "WorkflowFailedError",
    "WorkflowNotFoundError",
]
