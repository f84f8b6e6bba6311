"""Updates (docs/updates.md): ``@update_validator`` and ``Engine.update``, request/response with a
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

from .._core import limits as _limits
from .._core import serde as _serde
from .._core.run import Run
from .._model.payloads import inbox_name, payload_adapter, received
from .._worker import continue_as_new as _continue_as_new
from ..errors import (
    InvalidInputError,
    ResultTimeoutError,
    RunStateError,
    SerializationError,
    UpdateNotRepliedError,
    UpdateRejectedError,
    WorkflowNotFoundError,
)
from ..events import UpdateReplied
from ..stores import limits
from . import schemas as _schemas
from .history_wait import latest_event, wait_for_history
from .schemas import VALIDATOR_ATTR

if TYPE_CHECKING:
    from .._model.definition import WorkflowDefinition
    from .core import ClientCore
    from .engine import Engine

F = TypeVar("F", bound=Callable[..., Any])


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


async def signal_payload(engine: Engine, run: Run, name: str, payload: Any) -> Any:
    """``Engine.signal``'s payload as stored, checked before anything is written
    (``InvalidInputError``): a reserved name (``flowkit:``) is refused; with the run's
    workflow version registered here, a name it does not declare is refused and the payload
    validated against its ``signals[name]``; without it, the same against the schemas a
    worker recorded for that version (``_schemas``); with neither, the payload is validated
    against the newest registered version's type, if any, else only checked to be storable."""
    _schemas.check_reserved("signal", name)
    entry = engine.registry.get(run.workflow, run.workflow_version)
    rec = None if entry is not None else await _schemas.recorded(engine.store, run)
    if entry is not None:
        _schemas.refuse_signal(_schemas.messages_of(entry[0]), name)
    elif rec is not None:
        _schemas.refuse_signal(rec.messages, name)
        data = typed_payload(
            {}, name, "payload of signal", run.workflow, payload, engine.max_payload_bytes
        )
        what = f"payload of signal {name!r}"
        _schemas.validate(run.workflow, what, rec.schema("signals", name), data)
        return data
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


async def _recorded_arg(engine: Engine, run: Run, name: str, arg: Any) -> Any:
    """An update's argument as stored, checked by a caller without the run's workflow code
    against the schemas a worker recorded for its version: an undeclared name is rejected
    (``UpdateRejectedError``), an argument that does not validate refused
    (``InvalidInputError``). ``WorkflowNotFoundError`` when nothing was recorded, or when the
    update has an ``@update_validator``: only the code can run it."""
    rec = await _schemas.recorded(engine.store, run)
    if rec is None:
        raise WorkflowNotFoundError(run.workflow, run.workflow_version)
    _schemas.refuse_update(rec.messages, run.id, name)
    validators = rec.doc.get("validators")
    if isinstance(validators, list) and name in validators:
        raise WorkflowNotFoundError(run.workflow, run.workflow_version)
    what = "argument of update"
    data = typed_payload({}, name, what, run.workflow, arg, engine.max_payload_bytes)
    what = f"{what} {name!r}"
    _schemas.validate(run.workflow, what, rec.schema("updates", name), data)
    return data


async def update(
    engine: Engine,
    core: ClientCore,
    run_id: str,
    name: str,
    arg: Any,
    timeout: float | timedelta | None,
) -> Any:
    """``Engine.update``: check, validate and deliver the update, then wait for its reply.

    In order, each failure writing nothing: the name (``InvalidInputError``; reserved
    ``flowkit:`` names too), the run (``RunNotFoundError``; terminal: ``RunStateError``), a
    name the run's workflow version does not declare when it declares its messages
    (``UpdateRejectedError``), ``arg`` against ``updates[name]`` (``InvalidInputError``), the
    ``@update_validator(name)`` method (``UpdateRejectedError``). Without the workflow's code
    here, the name and ``arg`` are checked against the schemas a worker recorded
    (``_recorded_arg``; ``WorkflowNotFoundError`` when there are none, or the update has a
    validator). Then the update goes into the run's inbox with a fresh id from
    the engine's RNG, and the reply is awaited: ``UpdateNotRepliedError`` when the run
    settles without one, ``ResultTimeoutError`` after ``timeout`` real seconds. A run that
    continued as new passes the update on to the last run of its chain, and one that
    continues before taking it moves it to its successor: the reply comes from there."""
    limits.check_identifier("update name", name, limits.MAX_UPDATE_NAME_LENGTH)
    _schemas.check_reserved("update", name)
    secs = _limits.timeout("update timeout=", timeout)
    # a run that continued as new passes it on to the last run of its chain
    run = await _continue_as_new.chain_end(engine.store, await core.get(run_id))
    if run.status.terminal:
        raise RunStateError(run.id, run.status, f"update {name!r} cannot be delivered")
    entry = engine.registry.get(run.workflow, run.workflow_version)
    if entry is None:  # (no code here: the schemas a worker recorded, else nothing to go by)
        data = await _recorded_arg(engine, run, name, arg)
        check = None
    else:
        defn, instance = entry
        _schemas.refuse_update(_schemas.messages_of(defn), run_id, name)
        data = typed_payload(
            defn.updates, name, "argument of update", run.workflow, arg, engine.max_payload_bytes
        )
        check = _validator(instance, name)
    if check is not None and entry is not None:
        try:
            got = check(received(entry[0].updates, name, data))
            if inspect.isawaitable(got):
                await got
        except Exception as exc:
            raise UpdateRejectedError(run_id, name, exc) from exc
    update_id = f"{engine.config.rng.getrandbits(64):016x}"
    now = engine.clock.now()
    delivered = await engine.store.deliver_signal(
        run.id, inbox_name(name), {"update_id": update_id, "arg": data}, now
    )
    if delivered.wake_at is not None and delivered.wake_at <= now:
        core.wake(delivered.id)
    store = engine.store

    async def pick(run: Run) -> tuple[bool, Any] | None:
        """``(True, reply)``; ``(False, successor id)`` when ``run`` continued as new without
        taking the update, which went on to its successor with its inbox."""
        ev = await latest_event(store, run.id, "update_replied", "update_id", update_id)
        if isinstance(ev, UpdateReplied):
            return (True, ev.value)
        if run.status.terminal:
            if run.continued_as is not None and (
                await latest_event(store, run.id, "update_received", "update_id", update_id) is None
            ):
                return (False, run.continued_as)
            raise UpdateNotRepliedError(run.id, name, run.status.value)
        return None

    at = delivered.id  # (the run that has it: a continue-as-new moves it on)
    try:
        async with asyncio.timeout(secs):
            while True:
                replied, value = await wait_for_history(store, engine.bus, at, pick)
                if replied:
                    break
                at = value
    except TimeoutError as exc:
        if isinstance(exc, ResultTimeoutError) or secs is None:
            raise
        fresh = await engine.store.get_run(at)
        status = fresh.status.value if fresh is not None else "gone"
        hint = f"update {name!r} ({update_id}) has no reply yet"
        raise ResultTimeoutError(at, status, secs, hint) from None
    return value


__all__ = [
    "VALIDATOR_ATTR",
    "signal_payload",
    "typed_payload",
    "update",
    "update_validator",
]
