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
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import orjson
from pydantic import TypeAdapter
from pydantic.json_schema import PydanticJsonSchemaWarning

from .._core import serde as _serde
from .._model.registry import natural_key
from ..errors import (
    InvalidInputError,
    SerializationError,
    UpdateRejectedError,
    WorkflowNotFoundError,
)
from ..stores.base import RecordsSchemas, lists_by_search, records_schemas, records_workers

if TYPE_CHECKING:
    from .._core.run import Run
    from .._model.definition import WorkflowDefinition
    from .._model.registry import Registry

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
_RESHAPING = frozenset({"function-before", "function-wrap", "function-plain"})


def _by_name_or_alias(node: dict[str, Any]) -> bool:
    """Whether a model (dataclass, typed dict) schema takes its fields by name as well as by
    their aliases (``populate_by_name`` / ``validate_by_name``) and has aliases."""
    config = node.get("config")
    if not isinstance(config, dict) or not (
        config.get("validate_by_name") or config.get("populate_by_name")
    ):
        return False
    inner = node.get("schema")
    fields = inner.get("fields") if isinstance(inner, dict) else None
    if isinstance(fields, dict):
        fields = list(fields.values())
    return isinstance(fields, list) and any(
        isinstance(f, dict) and f.get("validation_alias") is not None for f in fields
    )


def _reshapes_input(core: Any) -> bool:
    """Whether a pydantic core schema holds a validator of the user's that runs before (or
    instead of) the type's own: ``mode="before"`` / ``"wrap"`` / ``"plain"`` field and model
    validators, ``BeforeValidator``... The JSON schema describes the type after it, so what it
    takes (a string it splits into a list, an old shape it upgrades) would be refused. So
    would a field given by its name where the model takes its name or its alias."""
    stack, seen = [core], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            if _by_name_or_alias(node):
                return True  # (its JSON schema names the aliases only)
            if node.get("type") in _RESHAPING:
                fn = node.get("function")
                fn = fn.get("function") if isinstance(fn, dict) else fn
                if not str(getattr(fn, "__module__", "") or "").startswith("pydantic"):
                    return True  # (pydantic's own: the JSON schema says what they take)
            # (not how it serializes: ``serialization`` holds functions of its own)
            stack.extend(v for k, v in node.items() if k != "serialization")
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return False


def _schema(adapter: TypeAdapter[Any]) -> Any:
    if _reshapes_input(adapter.core_schema):
        return {}  # (what the user's validators take is theirs to check: the body does)
    try:
        with warnings.catch_warnings():  # (e.g. a default it leaves out: an error under -W error)
            warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
            return adapter.json_schema()
    except Exception:  # (a type with no JSON schema: nothing to check it by here)
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
    try:
        docs = {}
        for name, version in registry.pairs():
            entry = registry.get(name, version)
            if entry is not None:
                docs[(name, version)] = document(entry[0])
        if not docs:
            return
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
    # (by the run's namespace: the tools are unscoped, its workers may not be)
    doc = await cast(RecordsSchemas, store).workflow_schema(
        run.workflow, run.workflow_version, run.namespace
    )
    if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
        return None
    m = messages_recorded(run.workflow, run.workflow_version, doc)
    return None if m is None else Recorded(m, doc)


async def recorded_singleton(
    store: Any, workflow: str, version: str | None, namespace: str | None = None
) -> tuple[int, int | None] | None:
    """The singleton ``(limit, max_queue_depth)`` a worker recorded for ``workflow`` at
    ``version`` (``None``: the newest version the store's workers record), in ``namespace``
    (the runs' own: an unscoped store reads theirs first); ``None`` when
    nothing says (no schemas kept or recorded, not a singleton, an older document)."""
    if not records_schemas(store):
        return None
    if version is None:
        version = await _newest_served(store, workflow)
        if version is None:
            return None
    doc = await cast(RecordsSchemas, store).workflow_schema(workflow, version, namespace)
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
    import jsonschema  # (here: ``import flowkit`` stays light, only such callers load it)

    schema = orjson.loads(text)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return _lax(cls)(schema)


# -- validating like pydantic -------------------------------------------------------------
# The body validates a payload with pydantic in its lax mode, which converts more than a JSON
# schema states: a numeric string to an int or float, ``"yes"`` / ``0`` to a bool, a number
# of seconds to a datetime, date, time or timedelta, a list with repeats to a set. What the
# code would accept is not refused here (a false refusal would lose a valid message); what it
# refuses that this lets through is refused by the body, as without a recorded schema.
_BOOL_WORDS = frozenset({"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"})
_TIME_FORMATS = frozenset({"date-time", "date", "time", "duration"})


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            return float(value.strip().replace("_", ""))
    except (ValueError, OverflowError):  # (not a number; an int beyond a float's range)
        return None
    return None


def _lax_number(_checker: Any, value: Any) -> bool:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return True
    return _as_number(value) is not None


def _lax_integer(_checker: Any, value: Any) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return True
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return True
    number = _as_number(value)
    return number is not None and number.is_integer()


def _lax_boolean(_checker: Any, value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, str):
        return value.strip().lower() in _BOOL_WORDS
    return _as_number(value) in (0.0, 1.0)


@functools.cache
def _lax(base: Any) -> Any:
    """``base`` (a jsonschema validator class) accepting what pydantic's lax mode converts."""
    from jsonschema import validators

    checker = base.TYPE_CHECKER.redefine_many(
        {"number": _lax_number, "integer": _lax_integer, "boolean": _lax_boolean}
    )
    strict_type = base.VALIDATORS["type"]

    def type_(validator: Any, types: Any, instance: Any, schema: Any) -> Any:
        if schema.get("format") in _TIME_FORMATS and _as_number(instance) is not None:
            return  # (seconds: pydantic takes them for a datetime, date, time or timedelta)
        yield from strict_type(validator, types, instance, schema)

    def unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Any:
        return iter(())  # (pydantic makes a set of a list with repeats)

    def on_number(keyword: str) -> Any:
        strict = base.VALIDATORS[keyword]

        def check(validator: Any, bound: Any, instance: Any, schema: Any) -> Any:
            if isinstance(instance, str):  # (a numeric string: bounds apply to its number)
                number = _as_number(instance)
                instance = instance if number is None else number
            yield from strict(validator, bound, instance, schema)

        return check

    numeric = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
    kept = {k: on_number(k) for k in numeric if k in base.VALIDATORS}
    replaced = {"type": type_, "uniqueItems": unique_items, **kept}
    return validators.extend(base, replaced, type_checker=checker)


def validate(workflow: str, what: str, schema: Any, data: Any) -> None:
    """``InvalidInputError`` naming ``what`` when the JSON value ``data`` does not validate
    against ``schema`` (``None``: unchecked). A schema that cannot be used is logged and
    skipped (as without one)."""
    if schema is None:
        return
    from jsonschema.exceptions import SchemaError, best_match
    from referencing.exceptions import Unresolvable

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
