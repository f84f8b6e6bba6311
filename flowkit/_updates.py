"""Updates (DESIGN §11): ``@update_validator`` and ``Engine.update``, request/response with a
running run, and the typed payloads of signals and updates (``@workflow(signals=...,
updates=...)``).

An update travels as a signal of a reserved name (``inbox_name``) whose payload is
``{"update_id": ..., "arg": ...}``: it is buffered, consumed and woken for exactly as a signal
is, and ``ctx.wait_for_update`` records its receipt (``update_received``) with the commit
that consumes it. The caller then waits for the run's ``update_replied`` of that id in the
history (``_history_wait``): a reply is durable before the caller sees it."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from . import _limits, _serde
from ._history_wait import latest_event, wait_for_history
from ._payloads import INBOX_PREFIX, inbox_name, payload_adapter, received
from ._run import Run
from .errors import (
    InvalidInputError,
    ResultTimeoutError,
    RunStateError,
    SerializationError,
    UpdateNotRepliedError,
    UpdateRejectedError,
    WorkflowNotFoundError,
)
from .events import UpdateReplied
from .stores import limits

if TYPE_CHECKING:
    from ._definition import WorkflowDefinition
    from ._engine import Engine

F = TypeVar("F", bound=Callable[..., Any])

VALIDATOR_ATTR = "__flowkit_update_validator__"
"""The attribute ``update_validator`` sets on a method: the update name it validates."""


def update_validator(name: str) -> Callable[[F], F]:
    """Mark a workflow method ``def check(self, arg) -> None`` as the validator of update
    ``name``: ``engine.update`` calls it before writing anything, and an exception it raises
    rejects the update (``UpdateRejectedError`` at the caller, nothing written)."""
    if not isinstance(name, str) or not name:
        raise ValueError("update_validator takes a non-empty update name")

    def mark(fn: F) -> F:
        setattr(fn, VALIDATOR_ATTR, name)
        return fn

    return mark


def typed_payload(
    types: dict[str, Any], name: str, what: str, workflow: str, payload: Any, max_bytes: int
) -> Any:
    """``payload`` validated against ``types[name]`` (when declared) and converted to the
    JSON a store keeps: ``InvalidInputError`` (nothing written) when it does not validate or
    cannot be stored."""
    adapter = payload_adapter(types, name)
    value = payload
    if adapter is not None:
        try:
            value = adapter.validate_python(payload)
        except ValidationError as exc:
            raise InvalidInputError(workflow, f"{what} {name!r}: {exc}") from None
    try:
        if adapter is None:
            return _serde.to_json(value, what=f"{what} {name!r}", max_bytes=max_bytes)
        return _serde.to_json(value, adapter, what=f"{what} {name!r}", max_bytes=max_bytes)
    except SerializationError as exc:
        raise InvalidInputError(workflow, str(exc)) from None


def signal_payload(engine: Engine, run: Run, name: str, payload: Any) -> Any:
    """``Engine.signal``'s payload as stored: validated against the run's workflow's
    ``signals[name]`` when this engine has that workflow registered (its version, else its
    newest), else only checked to be storable. Reserved (update) names are refused."""
    if name.startswith(INBOX_PREFIX):
        raise InvalidInputError(
            run.workflow, f"signal names starting {INBOX_PREFIX!r} are reserved"
        )
    defn = _definition(engine, run)
    types = defn.signals if defn is not None else {}
    return typed_payload(
        types, name, "payload of signal", run.workflow, payload, engine.max_payload_bytes
    )


def _definition(engine: Engine, run: Run) -> WorkflowDefinition | None:
    entry = engine.registry.get(run.workflow, run.workflow_version)
    if entry is None:
        entry = engine.registry.get(run.workflow)
    return None if entry is None else entry[0]


def _validator(instance: Any, name: str) -> Callable[[Any], Any] | None:
    """The bound ``@update_validator(name)`` method of a workflow instance, if any."""
    cls = type(instance)
    for attr in dir(cls):
        fn = inspect.getattr_static(cls, attr, None)
        if isinstance(fn, staticmethod | classmethod):
            fn = fn.__func__
        if getattr(fn, VALIDATOR_ATTR, None) == name:
            bound: Callable[[Any], Any] = getattr(instance, attr)
            return bound
    return None


async def update(
    engine: Engine, run_id: str, name: str, arg: Any, timeout: float | timedelta | None
) -> Any:
    """``Engine.update``: check, validate and deliver the update, then wait for its reply.

    In order, each failure writing nothing: the name (``InvalidInputError``), the run
    (``RunNotFoundError``; terminal: ``RunStateError``), its workflow registered here
    (``WorkflowNotFoundError``: its types and validator are needed), ``arg`` against
    ``updates[name]`` (``InvalidInputError``), the ``@update_validator(name)`` method
    (``UpdateRejectedError``). Then the update goes into the run's inbox with a fresh id from
    the engine's RNG, and the reply is awaited: ``UpdateNotRepliedError`` when the run
    settles without one, ``ResultTimeoutError`` after ``timeout`` real seconds."""
    limits.check_identifier("update name", name, limits.MAX_UPDATE_NAME_LENGTH)
    secs = _limits.timeout("update timeout=", timeout)
    run = await engine._get(run_id)
    if run.status.terminal:
        raise RunStateError(run_id, run.status, f"update {name!r} cannot be delivered")
    entry = engine.registry.get(run.workflow, run.workflow_version)
    if entry is None:
        raise WorkflowNotFoundError(run.workflow, run.workflow_version)
    defn, instance = entry
    data = typed_payload(
        defn.updates, name, "argument of update", run.workflow, arg, engine.max_payload_bytes
    )
    check = _validator(instance, name)
    if check is not None:
        try:
            got = check(received(defn.updates, name, data))
            if inspect.isawaitable(got):
                await got
        except Exception as exc:
            raise UpdateRejectedError(run_id, name, exc) from exc
    update_id = f"{engine.config.rng.getrandbits(64):016x}"
    now = engine.clock.now()
    delivered = await engine.store.deliver_signal(
        run_id, inbox_name(name), {"update_id": update_id, "arg": data}, now
    )
    if delivered.wake_at is not None and delivered.wake_at <= now:
        engine._wake(run_id)

    async def pick(run: Run) -> tuple[Any] | None:
        ev = await latest_event(engine.store, run_id, "update_replied", "update_id", update_id)
        if isinstance(ev, UpdateReplied):
            return (ev.value,)
        if run.status.terminal:
            raise UpdateNotRepliedError(run_id, name, run.status.value)
        return None

    try:
        async with asyncio.timeout(secs):
            (value,) = await wait_for_history(engine.store, engine.bus, run_id, pick)
    except TimeoutError as exc:
        if isinstance(exc, ResultTimeoutError) or secs is None:
            raise
        fresh = await engine.store.get_run(run_id)
        status = fresh.status.value if fresh is not None else "gone"
        hint = f"update {name!r} ({update_id}) has no reply yet"
        raise ResultTimeoutError(run_id, status, secs, hint) from None
    return value


__all__ = [
    "VALIDATOR_ATTR",
    "signal_payload",
    "typed_payload",
    "update",
    "update_validator",
]
