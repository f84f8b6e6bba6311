"""Workflow schemas and declared message names (docs/updates.md, "Unknown names are refused"
and "Callers without the code").

Each worker records in the store (``stores.base.RecordsSchemas``), per ``(workflow, version)``
it runs, a document of JSON schemas: its input's and its declared signals' and updates'
(pydantic's ``TypeAdapter(T).json_schema()``), with the names it declares. A caller that has
the workflow's code validates with pydantic (``_updates``); one without it (``flowkit signal``,
``flowkit retry --input``, the dashboard, ``Engine(store, [])``) validates the payload's JSON
against the recorded schema with ``jsonschema`` and checks the name against the recorded
names, before writing anything. Without a recorded document it validates nothing, as before.

The document (a JSON object, ``FORMAT`` 1)::

    {"format": 1, "input": <schema>, "declares": <bool>,
     "signals": {name: <schema> | null}, "updates": {name: <schema> | null},
     "validators": [update names with an @update_validator]}

``null``: a name declared without a payload type (any JSON value); a type pydantic has no
JSON schema for is recorded as ``{}`` (anything passes here; the body still validates it)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import jsonschema
import orjson
from jsonschema.exceptions import SchemaError, best_match
from pydantic import TypeAdapter
from pydantic.errors import PydanticUserError
from referencing.exceptions import Unresolvable

from . import _serde
from ._versions import natural_key
from .errors import (
    InvalidInputError,
    SerializationError,
    UpdateRejectedError,
    WorkflowNotFoundError,
)
from .stores.base import RecordsSchemas, lists_by_search, records_schemas, records_workers

if TYPE_CHECKING:
    from ._definition import WorkflowDefinition
    from ._run import Run
    from ._versions import Registry

log = logging.getLogger("flowkit")

FORMAT = 1
"""The layout of a recorded document (one a caller does not know is ignored)."""

RESERVED_PREFIX = "flowkit:"
"""Signal and update names starting so are flowkit's own: refused from callers."""

VALIDATOR_ATTR = "__flowkit_update_validator__"
"""The attribute ``@update_validator`` sets on a method (``_updates.VALIDATOR_ATTR``)."""


# -- what a workflow declares --------------------------------------------------------------
@dataclass(frozen=True)
class Messages:
    """The message names of one workflow version, from its code or its recorded document.
    ``declares``: it declares its messages (``signals=``, ``updates=`` or handlers), so any
    other name is refused; otherwise every signal name is accepted, and every update name."""

    workflow: str
    version: str
    declares: bool
    signals: frozenset[str]
    updates: frozenset[str]


def validator_names(cls: type) -> list[str]:
    """The update names the ``@update_validator`` methods of ``cls`` validate, sorted."""
    names: set[str] = set()
    for klass in cls.__mro__:
        for fn in vars(klass).values():
            if isinstance(fn, staticmethod | classmethod):
                fn = fn.__func__
            name = getattr(fn, VALIDATOR_ATTR, None)
            if isinstance(name, str):
                names.add(name)
    return sorted(names)


def messages_of(defn: WorkflowDefinition) -> Messages:
    """The names ``defn`` declares: its ``signals`` and ``updates`` (handlers' names go here
    too), and the updates its validators name (a validator declares its update's name, not
    the workflow's messages)."""
    signals = frozenset(defn.signals)
    updates = frozenset(defn.updates)
    declares = bool(signals or updates)
    updates |= frozenset(validator_names(defn.cls))
    return Messages(defn.name, defn.version, declares, signals, updates)


def _names(value: Any) -> frozenset[str] | None:
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return frozenset(value)
    return None


def messages_recorded(workflow: str, version: str, doc: Mapping[str, Any]) -> Messages | None:
    """The names a recorded document declares; ``None`` when it is malformed."""
    signals, updates = _names(doc.get("signals")), _names(doc.get("updates"))
    declares = doc.get("declares")
    validators = doc.get("validators")
    if signals is None or updates is None or not isinstance(declares, bool):
        return None
    if not isinstance(validators, list) or not all(isinstance(v, str) for v in validators):
        return None
    return Messages(workflow, version, declares, signals, updates | frozenset(validators))


def check_reserved(what: str, name: str) -> None:
    """``InvalidInputError`` for a signal or update name flowkit keeps for itself."""
    if name.startswith(RESERVED_PREFIX):
        raise InvalidInputError(None, f"{what} names starting {RESERVED_PREFIX!r} are reserved")


def _declared(names: frozenset[str]) -> str:
    return ", ".join(repr(n) for n in sorted(names)) or "none"


def refuse_signal(m: Messages, name: str) -> None:
    """``InvalidInputError`` (nothing written) for a signal name ``m`` does not declare."""
    if m.declares and name not in m.signals:
        raise InvalidInputError(
            m.workflow,
            f"version {m.version!r} declares no signal {name!r} (its signals: "
            f"{_declared(m.signals)})",
        )


def refuse_update(m: Messages, run_id: str, name: str) -> None:
    """``UpdateRejectedError`` (nothing written) for an update name ``m`` does not declare:
    nothing in the run could ever answer it."""
    if m.declares and name not in m.updates:
        why = LookupError(
            f"workflow {m.workflow!r} version {m.version!r} declares no update {name!r} "
            f"(its updates: {_declared(m.updates)})"
        )
        raise UpdateRejectedError(run_id, name, why)


# -- the recorded document -----------------------------------------------------------------
def _schema(adapter: TypeAdapter[Any]) -> Any:
    try:
        return adapter.json_schema()
    except PydanticUserError:  # (a type with no JSON schema: nothing to check it by here)
        return {}


def document(defn: WorkflowDefinition) -> dict[str, Any]:
    """The document a worker records for ``defn`` (module doc)."""
    m = messages_of(defn)

    def typed(types: dict[str, Any], names: frozenset[str]) -> dict[str, Any]:
        return {
            n: None if types.get(n) is None else _schema(_serde.adapter_for(types[n]))
            for n in sorted(names)
        }

    return {
        "format": FORMAT,
        "input": _schema(defn.input_adapter),
        "declares": m.declares,
        "signals": typed(defn.signals, m.signals),
        "updates": typed(defn.updates, m.updates),
        "validators": validator_names(defn.cls),
        # (a tool without the code shows a lane's limit and whether its queue is full)
        "singleton": None
        if defn.singleton is None
        else {"limit": defn.singleton.limit, "max_queue_depth": defn.singleton.max_queue_depth},
    }


async def record(store: Any, registry: Registry) -> None:
    """Record the document of every ``(workflow, version)`` in ``registry`` (one upsert),
    when ``store`` keeps them. Best effort: a failure is logged, never raised."""
    if not records_schemas(store):
        return
    docs = {}
    for name, version in registry.pairs():
        entry = registry.get(name, version)
        if entry is not None:
            docs[(name, version)] = document(entry[0])
    if not docs:
        return
    try:
        await cast(RecordsSchemas, store).put_workflow_schemas(docs)
    except Exception:
        log.warning("could not record the workflow schemas in the store", exc_info=True)


@dataclass(frozen=True)
class Recorded:
    """A workflow version's recorded document, read by a caller without its code."""

    messages: Messages
    doc: Mapping[str, Any]

    def schema(self, kind: str, name: str | None = None) -> Any:
        """The schema of the input (``kind="input"``) or of a message; ``None``: unchecked."""
        found = self.doc.get(kind)
        if name is not None:
            found = found.get(name) if isinstance(found, Mapping) else None
        return found if isinstance(found, Mapping | bool) else None


async def recorded(store: Any, run: Run) -> Recorded | None:
    """The document recorded for ``run``'s workflow version; ``None`` when the store keeps
    none, none was recorded, or it is not one this code reads."""
    if not records_schemas(store):
        return None
    doc = await cast(RecordsSchemas, store).workflow_schema(run.workflow, run.workflow_version)
    if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
        return None
    m = messages_recorded(run.workflow, run.workflow_version, doc)
    return None if m is None else Recorded(m, doc)


async def recorded_singleton(
    store: Any, workflow: str, version: str | None
) -> tuple[int, int | None] | None:
    """The singleton ``(limit, max_queue_depth)`` a worker recorded for ``workflow`` at
    ``version`` (``None``: the newest version the store's workers record); ``None`` when
    nothing says (no schemas kept or recorded, not a singleton, an older document)."""
    if not records_schemas(store):
        return None
    if version is None:
        version = await _newest_served(store, workflow)
        if version is None:
            return None
    doc = await cast(RecordsSchemas, store).workflow_schema(workflow, version)
    sg = doc.get("singleton") if isinstance(doc, Mapping) else None
    if not isinstance(sg, Mapping):
        return None
    limit, depth = sg.get("limit"), sg.get("max_queue_depth")
    if not isinstance(limit, int) or not (depth is None or isinstance(depth, int)):
        return None
    return limit, depth


async def _newest_served(store: Any, workflow: str) -> str | None:
    """The newest version of ``workflow`` (natural order) among the workers the store records,
    else the version of one of its runs (``None``: neither is known)."""
    if records_workers(store):
        seen: set[str] = {
            v for w in await store.workers() for wf, v in w.versions if wf == workflow
        }
        if seen:
            return max(seen, key=natural_key)
    if lists_by_search(store):  # (one indexed row, not every run of the workflow)
        runs = await store.list_runs(workflow=workflow, limit=1)
        if not runs:
            return None
        found: str = runs[0].workflow_version
        return found
    return None


@functools.lru_cache(maxsize=256)
def _validator(text: str) -> Any:
    schema = orjson.loads(text)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def validate(workflow: str, what: str, schema: Any, data: Any) -> None:
    """``InvalidInputError`` naming ``what`` when the JSON value ``data`` does not validate
    against ``schema`` (``None``: unchecked). A schema that cannot be used is logged and
    skipped (as without one)."""
    if schema is None:
        return
    try:
        error = best_match(
            _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode()).iter_errors(data)
        )
    except (SchemaError, Unresolvable, orjson.JSONEncodeError, TypeError):
        log.warning("the recorded schema of %s of %r is unusable", what, workflow, exc_info=True)
        return
    if error is not None:
        at = "" if not error.absolute_path else f" at {error.json_path}"
        raise InvalidInputError(workflow, f"{what}{at}: {error.message}")


def input_json(workflow: str, rec: Recorded | None, version: str, value: Any, cap: int) -> Any:
    """A new input (``retry``) given by a caller without the code, as stored: checked to be
    storable and against the recorded input schema. ``WorkflowNotFoundError`` when no
    document was recorded (nothing to validate it by)."""
    if rec is None:
        raise WorkflowNotFoundError(workflow, version)
    try:
        data = _serde.to_json(value, what="workflow input", max_bytes=cap)
    except SerializationError as exc:
        raise InvalidInputError(workflow, str(exc)) from None
    validate(workflow, "input", rec.schema("input"), data)
    return data


__all__ = [
    "FORMAT",
    "RESERVED_PREFIX",
    "Messages",
    "Recorded",
    "check_reserved",
    "document",
    "input_json",
    "messages_of",
    "messages_recorded",
    "record",
    "recorded",
    "refuse_signal",
    "refuse_update",
    "validate",
    "validator_names",
]
