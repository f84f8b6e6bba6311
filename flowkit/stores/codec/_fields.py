"""How ``CodecStore`` encodes each payload field of runs and events, bound to its place.

A value's context is its run id, then its field (``("r1", "input")``, ``("r1", "event",
"step_completed", "3", "result")``...): a codec with ``binds_context`` authenticates it, so a
value moved to another run or field fails to decode; every ``CodecError`` raised here names the
run and the field. A step's arguments' digest is encrypted like a payload (a short unsalted
hash of the arguments would give small ones away to anyone who can read the database). See
docs/stores.md, "CodecStore: encrypting payloads"."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from ..._core.run import Run
from ...errors import CodecError, InvalidInputError
from ...events import (
    ChildCompleted,
    ChildFailed,
    CompensationCompleted,
    CompensationFailed,
    ErrorInfo,
    Event,
    EventReceived,
    EventSet,
    RunCompleted,
    RunContinued,
    RunDead,
    RunFailed,
    RunRetried,
    RunStarted,
    SignalReceived,
    StepCompleted,
    StepFailed,
    UpdateReceived,
    UpdateReplied,
)
from ..limits import check_json, payload_limit, storable

STRING_PREFIX = "$codec:"
"""Marks an encoded value stored in a string-typed field (error messages, digests)."""

_ERROR_TEXT_FIELDS = ("message", "cause_message")

Ctx = tuple[str, ...]
"""A value's context: its run id, then the parts of its field."""

_CHAIN_SUFFIX = re.compile(r"~([0-9]+)\Z")


def inbox_context(run_id: str, name: str) -> Ctx:
    """The context of an inbox signal's payload: bound to the first run of its
    continue-as-new chain (``run_id`` without its ``~n`` suffix, as
    ``flowkit._worker.chain_ids.base_id``), not to the run: a continuation moves what its run had
    not taken to its
    successor, and a signal sent to an old id of the chain goes to its last run."""
    m = _CHAIN_SUFFIX.search(run_id)
    return (run_id if m is None else run_id[: m.start()], "signal", name)


def older_inbox_contexts(run_id: str, name: str) -> Iterator[Ctx]:
    """The contexts an inbox payload in ``run_id`` may have been bound to before payloads
    were bound to their chain (``inbox_context``): the run it was delivered to, ``run_id``
    or an earlier run of its chain (``base~n-1`` ... ``base~1``), which moved it on."""
    m = _CHAIN_SUFFIX.search(run_id)
    if m is None:
        return
    yield (run_id, "signal", name)
    base = run_id[: m.start()]
    for k in range(int(m.group(1)) - 1, 0, -1):
        yield (f"{base}~{k}", "signal", name)


def _failed(ctx: Ctx, why: str) -> CodecError:
    field = "/".join(ctx[1:])
    return CodecError(f"run {ctx[0]!r}, {field}: {why}", run_id=ctx[0], field=field)


class CodecFields:
    """The field-by-field encoding of ``CodecStore`` (which sets ``codec`` and ``_binds``)."""

    codec: Any
    _binds: bool

    def _encode(self, value: Any, ctx: Ctx) -> Any:
        for part in ctx:  # (a run id or name no store keeps: refused as the store would)
            if not storable(part):
                raise InvalidInputError(None, f"identifier {part!r} cannot be stored")
        if self._binds:
            return self.codec.encode(value, context=ctx)
        return self.codec.encode(value)

    def _decode(self, value: Any, ctx: Ctx) -> Any:
        try:
            if self._binds:
                return self.codec.decode(value, context=ctx)
            return self.codec.decode(value)
        except CodecError as exc:  # name the value: which run, which field
            field = "/".join(ctx[1:])
            raise CodecError(
                f"run {ctx[0]!r}, {field}: {exc}",
                key_id=exc.key_id,
                run_id=ctx[0],
                field=field,
                missing_key=exc.missing_key,
            ) from None
        except Exception as exc:  # a custom codec's own failure: still one typed error
            raise _failed(ctx, f"cannot decode: {type(exc).__name__}: {exc}") from exc

    def _enc(self, value: Any, ctx: Ctx) -> Any:
        check_json("a payload", value, payload_limit(self))  # (docs/stores.md, "Limits")
        return None if value is None else self._encode(value, ctx)

    def _dec(self, value: Any, ctx: Ctx) -> Any:
        return None if value is None else self._decode(value, ctx)

    def _enc_text(self, value: Any, ctx: Ctx) -> Any:
        if value is None:
            return None
        return STRING_PREFIX + orjson.dumps(self._encode(value, ctx)).decode()

    def _dec_text(self, value: Any, ctx: Ctx) -> Any:
        if isinstance(value, str) and value.startswith(STRING_PREFIX):
            try:
                stored = orjson.loads(value[len(STRING_PREFIX) :])
            except orjson.JSONDecodeError:
                raise _failed(ctx, "corrupt encoded string payload") from None
            return self._decode(stored, ctx)
        return self._dec(value, ctx)  # not encoded: the codec decides (plaintext or error)

    def _dec_digest(self, value: Any, ctx: Ctx) -> Any:
        """A step's arguments' digest: encrypted since issue #19; a plain one (written
        before) is returned as it is: it was never secret to whoever can read the store."""
        if isinstance(value, str) and not value.startswith(STRING_PREFIX):
            return value
        digest = self._dec_text(value, ctx)
        if not (digest is None or isinstance(digest, str)):
            raise _failed(ctx, "decoded digest is not a string")
        return digest

    @staticmethod
    def _map_error(error: Any, text: Callable[[Any, Ctx], Any], ctx: Ctx) -> Any:
        """Apply ``text`` to the free-text fields of a run's error (type names stay clear)."""
        if error is None:
            return None
        if not isinstance(error, dict):
            return text(error, (*ctx, "error"))
        out = dict(error)
        for k in _ERROR_TEXT_FIELDS:
            if k in out:
                out[k] = text(out[k], (*ctx, f"error.{k}"))
        return out

    def _enc_error(self, error: Any, ctx: Ctx) -> Any:
        return self._map_error(error, self._enc_text, ctx)

    def _dec_error(self, error: Any, ctx: Ctx) -> Any:
        return self._map_error(error, self._dec_text, ctx)

    def _enc_info(self, info: ErrorInfo, ctx: Ctx) -> ErrorInfo:
        return info.model_copy(
            update={
                "message": self._enc_text(info.message, (*ctx, "error.message")),
                "cause_message": self._enc_text(info.cause_message, (*ctx, "error.cause_message")),
            }
        )

    def _dec_info(self, info: ErrorInfo, ctx: Ctx) -> ErrorInfo:
        message = self._dec_text(info.message, (*ctx, "error.message"))
        cause = self._dec_text(info.cause_message, (*ctx, "error.cause_message"))
        if not isinstance(message, str) or not (cause is None or isinstance(cause, str)):
            raise _failed(ctx, "decoded error message is not a string")
        return info.model_copy(update={"message": message, "cause_message": cause})

    def _run_out(self, run: Run) -> Run:
        ctx = (run.id,)
        return dataclasses.replace(
            run,
            input=self._dec(run.input, (run.id, "input")),
            output=self._dec(run.output, (run.id, "output")),
            error=self._dec_error(run.error, ctx),
        )

    def _run_in(self, run: Run) -> Run:
        ctx = (run.id,)
        return dataclasses.replace(
            run,
            input=self._enc(run.input, (run.id, "input")),
            output=self._enc(run.output, (run.id, "output")),
            error=self._enc_error(run.error, ctx),
        )

    def _maybe_run_out(self, run: Run | None) -> Run | None:
        return None if run is None else self._run_out(run)

    def _event_in(self, ev: Event, run_id: str) -> Event:
        """``ev`` with its payload fields encoded, each bound to its run and place."""
        if isinstance(ev, StepCompleted):
            ctx: Ctx = (run_id, "event", "step_completed", ev.pos)
            return ev.model_copy(
                update={
                    "result": self._enc(ev.result, (*ctx, "result")),
                    "args_digest": self._enc_text(ev.args_digest, (*ctx, "args_digest")),
                }
            )
        if isinstance(ev, StepFailed):
            ctx = (run_id, "event", "step_failed", ev.pos, str(ev.attempt))
            return ev.model_copy(
                update={
                    "error": self._enc_info(ev.error, ctx),
                    "args_digest": self._enc_text(ev.args_digest, (*ctx, "args_digest")),
                }
            )
        if isinstance(ev, RunStarted):
            return ev.model_copy(
                update={"input": self._enc(ev.input, (run_id, "event", "run_started", "input"))}
            )
        if isinstance(ev, SignalReceived):
            ctx = (run_id, "event", "signal_received", ev.pos, ev.name, "payload")
            return ev.model_copy(update={"payload": self._enc(ev.payload, ctx)})
        if isinstance(ev, EventReceived):
            ctx = (run_id, "event", "event_received", ev.pos, ev.name, "payload")
            return ev.model_copy(update={"payload": self._enc(ev.payload, ctx)})
        if isinstance(ev, RunCompleted):
            ctx = (run_id, "event", "run_completed", "output")
            return ev.model_copy(update={"output": self._enc(ev.output, ctx)})
        if isinstance(ev, RunFailed):
            ctx = (run_id, "event", "run_failed")
            return ev.model_copy(update={"error": self._enc_info(ev.error, ctx)})
        if isinstance(ev, RunRetried) and ev.new_input:
            ctx = (run_id, "event", "run_retried", str(ev.attempt), "input")
            return ev.model_copy(update={"input": self._enc(ev.input, ctx)})
        if isinstance(ev, RunDead) and ev.error is not None:
            ctx = (run_id, "event", "run_dead")
            return ev.model_copy(update={"error": self._enc_info(ev.error, ctx)})
        if isinstance(ev, CompensationCompleted):
            ctx = (run_id, "event", "compensation_completed", ev.pos, "result")
            return ev.model_copy(update={"result": self._enc(ev.result, ctx)})
        if isinstance(ev, CompensationFailed):
            ctx = (run_id, "event", "compensation_failed", ev.pos, str(ev.attempt))
            return ev.model_copy(update={"error": self._enc_info(ev.error, ctx)})
        if isinstance(ev, RunContinued):
            ctx = (run_id, "event", "run_continued", "input")
            return ev.model_copy(update={"input": self._enc(ev.input, ctx)})
        if isinstance(ev, ChildCompleted):
            ctx = (run_id, "event", "child_completed", ev.pos, "output")
            return ev.model_copy(update={"output": self._enc(ev.output, ctx)})
        if isinstance(ev, ChildFailed):
            ctx = (run_id, "event", "child_failed", ev.pos)
            return ev.model_copy(update={"error": self._enc_info(ev.error, ctx)})
        # docs/updates.md: a published value, an update's arg and its reply (the key, the name and
        # the update id stay clear: ``latest_event`` compares them in the store)
        if isinstance(ev, EventSet):
            ctx = (run_id, "event", "event_set", ev.pos, ev.key, "value")
            return ev.model_copy(update={"value": self._enc(ev.value, ctx)})
        if isinstance(ev, UpdateReceived):
            ctx = (run_id, "event", "update_received", ev.pos, ev.update_id, "arg")
            return ev.model_copy(update={"arg": self._enc(ev.arg, ctx)})
        if isinstance(ev, UpdateReplied):
            ctx = (run_id, "event", "update_replied", ev.pos, ev.update_id, "value")
            return ev.model_copy(update={"value": self._enc(ev.value, ctx)})
        return ev

    def _event_out(self, ev: Event, run_id: str) -> Event:
        """``ev`` with its payload fields decoded (``CodecError`` naming run and field)."""
        if isinstance(ev, StepCompleted):
            ctx: Ctx = (run_id, "event", "step_completed", ev.pos)
            return ev.model_copy(
                update={
                    "result": self._dec(ev.result, (*ctx, "result")),
                    "args_digest": self._dec_digest(ev.args_digest, (*ctx, "args_digest")),
                }
            )
        if isinstance(ev, StepFailed):
            ctx = (run_id, "event", "step_failed", ev.pos, str(ev.attempt))
            return ev.model_copy(
                update={
                    "error": self._dec_info(ev.error, ctx),
                    "args_digest": self._dec_digest(ev.args_digest, (*ctx, "args_digest")),
                }
            )
        if isinstance(ev, RunStarted):
            return ev.model_copy(
                update={"input": self._dec(ev.input, (run_id, "event", "run_started", "input"))}
            )
        if isinstance(ev, SignalReceived):
            ctx = (run_id, "event", "signal_received", ev.pos, ev.name, "payload")
            return ev.model_copy(update={"payload": self._dec(ev.payload, ctx)})
        if isinstance(ev, EventReceived):
            ctx = (run_id, "event", "event_received", ev.pos, ev.name, "payload")
            return ev.model_copy(update={"payload": self._dec(ev.payload, ctx)})
        if isinstance(ev, RunCompleted):
            ctx = (run_id, "event", "run_completed", "output")
            return ev.model_copy(update={"output": self._dec(ev.output, ctx)})
        if isinstance(ev, RunFailed):
            ctx = (run_id, "event", "run_failed")
            return ev.model_copy(update={"error": self._dec_info(ev.error, ctx)})
        if isinstance(ev, RunRetried) and ev.new_input:
            ctx = (run_id, "event", "run_retried", str(ev.attempt), "input")
            return ev.model_copy(update={"input": self._dec(ev.input, ctx)})
        if isinstance(ev, RunDead) and ev.error is not None:
            ctx = (run_id, "event", "run_dead")
            return ev.model_copy(update={"error": self._dec_info(ev.error, ctx)})
        if isinstance(ev, CompensationCompleted):
            ctx = (run_id, "event", "compensation_completed", ev.pos, "result")
            return ev.model_copy(update={"result": self._dec(ev.result, ctx)})
        if isinstance(ev, CompensationFailed):
            ctx = (run_id, "event", "compensation_failed", ev.pos, str(ev.attempt))
            return ev.model_copy(update={"error": self._dec_info(ev.error, ctx)})
        if isinstance(ev, RunContinued):
            ctx = (run_id, "event", "run_continued", "input")
            return ev.model_copy(update={"input": self._dec(ev.input, ctx)})
        if isinstance(ev, ChildCompleted):
            ctx = (run_id, "event", "child_completed", ev.pos, "output")
            return ev.model_copy(update={"output": self._dec(ev.output, ctx)})
        if isinstance(ev, ChildFailed):
            ctx = (run_id, "event", "child_failed", ev.pos)
            return ev.model_copy(update={"error": self._dec_info(ev.error, ctx)})
        # docs/updates.md: a published value, an update's arg and its reply (the key, the name and
        # the update id stay clear: ``latest_event`` compares them in the store)
        if isinstance(ev, EventSet):
            ctx = (run_id, "event", "event_set", ev.pos, ev.key, "value")
            return ev.model_copy(update={"value": self._dec(ev.value, ctx)})
        if isinstance(ev, UpdateReceived):
            ctx = (run_id, "event", "update_received", ev.pos, ev.update_id, "arg")
            return ev.model_copy(update={"arg": self._dec(ev.arg, ctx)})
        if isinstance(ev, UpdateReplied):
            ctx = (run_id, "event", "update_replied", ev.pos, ev.update_id, "value")
            return ev.model_copy(update={"value": self._dec(ev.value, ctx)})
        return ev


__all__ = ["STRING_PREFIX", "CodecFields", "Ctx", "inbox_context", "older_inbox_contexts"]
