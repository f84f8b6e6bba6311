"""Logging for workflows: ``ctx.logger`` (a ``WorkflowLogger``), silent while the body replays
and tagging each record with the run it comes from, and ``JsonFormatter``, one JSON object per
record, for any handler of the stdlib ``logging`` configuration.

A body runs again from its first line on every activation (docs/writing-workflows.md, "How
replay works"), so a plain ``logging`` call in it repeats each time; ``ctx.logger`` drops the
records made while the history still answers the body's calls, so each line is logged once by
the activation that runs it live. The records carry ``flowkit_run_id``, ``flowkit_workflow``,
``flowkit_step``, ``flowkit_position`` and ``flowkit_attempt`` as attributes (``extra``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any, Protocol


class Runtime(Protocol):
    """What ``WorkflowLogger`` reads of the activation it logs for (``flowkit._model.ctx.Runtime``
    has it: declared here so that this module stays below the model)."""

    @property
    def run_id(self) -> str: ...

    @property
    def workflow(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    def log_state(self) -> tuple[bool, str | None, str | None]: ...


__all__ = ["TAGS", "JsonFormatter", "WorkflowLogger", "logger_name"]

#: The record attributes ``WorkflowLogger`` sets on every record it passes on.
TAGS = ("flowkit_run_id", "flowkit_workflow", "flowkit_step", "flowkit_position", "flowkit_attempt")


def logger_name(workflow: str) -> str:
    """The stdlib logger a workflow's ``ctx.logger`` writes to: ``flowkit.workflow.<name>``, so
    that ``logging.getLogger("flowkit.workflow")`` configures every workflow at once."""
    return f"flowkit.workflow.{workflow}"


class WorkflowLogger(logging.LoggerAdapter[logging.Logger]):
    """``ctx.logger``: a ``logging.LoggerAdapter`` over ``logger_name(workflow)``.

    While the body replays (``ctx.is_replaying``: calls the history already answers, or any
    ``flowkit.replay`` of a history) every call is a no-op and ``isEnabledFor`` is False; once
    the body runs live, records pass to the stdlib logger with the run's tags (``TAGS``) added
    to the caller's ``extra``. ``flowkit_step`` is the name of the last ``ctx.step`` the
    calling branch made (None before its first), ``flowkit_position`` that branch's last
    position, ``flowkit_attempt`` the run's attempt (``ctx.attempt``)."""

    def __init__(self, logger: logging.Logger, runtime: Runtime) -> None:
        super().__init__(logger, {})
        self._rt = runtime

    @property
    def silent(self) -> bool:
        """Whether records are dropped now: the calling line ran in an earlier activation."""
        return self._rt.log_state()[0]

    def isEnabledFor(self, level: int) -> bool:
        return not self.silent and self.logger.isEnabledFor(level)

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if self.isEnabledFor(level):
            msg, kw = self.process(msg, kwargs)
            # (stacklevel: the record's file and line are the caller's, not this adapter's)
            kw["stacklevel"] = kw.get("stacklevel", 1) + 1
            self.logger.log(level, msg, *args, **kw)

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        rt = self._rt
        _, pos, step = rt.log_state()
        extra: dict[str, Any] = dict(kwargs.get("extra") or {})
        extra.update(
            flowkit_run_id=rt.run_id,
            flowkit_workflow=rt.workflow,
            flowkit_step=step,
            flowkit_position=pos,
            flowkit_attempt=rt.attempt,
        )
        kwargs["extra"] = extra
        return msg, kwargs


# the attributes every LogRecord has: the others are the caller's ``extra``
_STANDARD = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys() | {"message", "asctime"}
)


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON: ``time`` (ISO 8601, UTC, the record's wall-clock
    time; left out with ``timestamp=False``), ``level``, ``logger``,
    ``message``, ``exception`` and ``stack`` when present, then every ``extra`` attribute of
    the record (``ctx.logger``'s ``flowkit_*`` tags among them; values JSON cannot hold are
    written as their ``str``)."""

    def __init__(self, fields: Mapping[str, Any] | None = None, *, timestamp: bool = True) -> None:
        super().__init__()
        self.fields = dict(fields or {})  # constant fields on every line (e.g. the instance)
        self.timestamp = timestamp  # False: no ``time`` (output that tests can compare)

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {}
        if self.timestamp:
            out["time"] = datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            )
        out.update(level=record.levelname, logger=record.name, message=record.getMessage())
        out.update(self.fields)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        return json.dumps(out, default=str, ensure_ascii=False)
