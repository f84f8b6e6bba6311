"""Payload conversion: Python values <-> JSON-able values (pydantic) <-> bytes (orjson).

Adapters are cached per annotation/function because building a ``TypeAdapter`` is costly and
happens on the hot path of every step."""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
from collections.abc import Callable
from typing import Any

import orjson
import pydantic_core
from pydantic import TypeAdapter

from ..errors import SerializationError
from . import annotations as _annotations
from . import limits as _limits

JSON = Any
ANY_ADAPTER: TypeAdapter[Any] = TypeAdapter(Any)


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def adapter_for(tp: Any) -> TypeAdapter[Any]:
    """A cached ``TypeAdapter`` for an annotation."""
    try:
        return _ADAPTERS[tp]
    except KeyError:
        ad = _ADAPTERS[tp] = TypeAdapter(tp)
        return ad
    except TypeError:  # unhashable annotation
        return TypeAdapter(tp)


def _unwrap(fn: Callable[..., Any]) -> Any:
    fn = getattr(fn, "__func__", fn)
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _step_function(fn: Any, target: Any) -> tuple[Any, type | None]:
    """What carries the return annotation that types a step's result (a function, a method's
    function, a wrapper's copy, a callable object's ``__call__``) and the class defining it;
    ``(None, None)`` for builtins and classes, whose results stay ``Any``."""
    bound = getattr(fn, "__self__", None)
    if inspect.ismethod(target):  # (a partial of a bound method)
        target, bound = target.__func__, target.__self__
    if inspect.isfunction(target) or hasattr(target, "__wrapped__"):
        return target, _owner(target, bound)
    if isinstance(target, type):
        return None, None
    call = getattr(type(target), "__call__", None)  # noqa: B004
    if inspect.isfunction(call):
        return call, type(target)
    return None, None


def _owner(fn: Any, bound: Any) -> type | None:
    """The class ``fn`` is defined in, for a method called through an instance or a class."""
    if bound is None:
        return None
    cls = bound if isinstance(bound, type) else type(bound)
    for klass in cls.__mro__:
        if any(getattr(v, "__func__", v) is fn for v in vars(klass).values()):
            return klass
    return cls


def _no_activation() -> Any:
    return None


current_activation: Callable[[], Any] = _no_activation
"""The state of the activation the running task executes, or ``None``: ``flowkit._replay.branch``
installs its reader when imported (the replay layer sits above this module)."""


def _workflow_names() -> dict[str, Any]:
    """The local names of the scope the running workflow's class was declared in (a step
    function defined in the same test function as the workflow may return its models)."""
    defn = getattr(current_activation(), "defn", None)
    annotations = getattr(defn, "annotations", None)
    localns = getattr(annotations, "localns", None)
    return localns if isinstance(localns, dict) else {}


def _return_type(fn: Callable[..., Any], target: Any) -> Any:
    """The type ``fn``'s return annotation names (``Any`` when unannotated); ``TypeError``
    naming the step, the annotation and the missing name when it cannot be resolved: the
    recorded result would otherwise come back from replay as plain JSON."""
    func, owner = _step_function(fn, target)
    anns = getattr(func, "__annotations__", None)
    if not isinstance(anns, dict):
        return Any
    ann = anns.get("return", _annotations.MISSING)
    if ann is _annotations.MISSING:
        return Any
    globalns = _annotations.function_globals(func)
    localns = {**_annotations.closure_names(func), **_annotations.class_names(owner)}
    try:
        return _annotations.evaluate(ann, globalns, localns)
    except NameError:
        try:
            return _annotations.evaluate(ann, globalns, {**_workflow_names(), **localns})
        except Exception as exc:
            error: Exception = exc
    except Exception as exc:
        error = exc
    text = (
        f"step {step_name(target)!r}: cannot resolve its return annotation "
        f"{_annotations.describe(ann)!r}: {type(error).__name__}: {error}. flowkit rebuilds "
        "the recorded result with it on replay."
    )
    missing = _annotations.missing_name(error)
    if missing is not None:
        text += (
            f" Define or import {missing!r} in module {func.__module__!r} (an import under "
            "`if TYPE_CHECKING:` is not there at run time), or in the function that declares "
            "the step and its workflow; or leave the annotation out to get plain JSON back."
        )
    raise TypeError(text) from error


def return_adapter(fn: Callable[..., Any]) -> TypeAdapter[Any]:
    """The adapter for ``fn``'s return annotation (``Any`` when unannotated); ``TypeError``
    when the annotation names something that cannot be resolved."""
    ret = _return_type(fn, _unwrap(fn))
    if ret is None:
        ret = type(None)
    return adapter_for(_annotations.result_type(ret))


_META: dict[Any, tuple[str, TypeAdapter[Any], bool]] = {}


def step_meta(fn: Callable[..., Any]) -> tuple[str, TypeAdapter[Any], bool]:
    """``(step_name(fn), return_adapter(fn), is_async(fn))``, cached by the function (a step
    runs, or is replayed, many times: one dictionary lookup instead of unwrapping it again)."""
    target = _unwrap(fn)
    try:
        return _META[target]
    except KeyError:
        meta = (step_name(target), return_adapter(fn), is_async(target))
        if len(_META) >= 4096:  # (functions made on the fly: keep it bounded)
            _META.clear()
        _META[target] = meta
        return meta
    except TypeError:  # unhashable callable
        return step_name(target), return_adapter(fn), is_async(target)


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` only creates a coroutine (an ``async def`` function, a method or
    ``functools.partial`` of one, an object whose ``__call__`` is one): a step runs it on the
    event loop. Anything else is synchronous and runs in a step thread (a sync function that
    returns an awaitable too: the awaitable is then awaited on the loop)."""
    target = _unwrap(fn)
    if inspect.iscoroutinefunction(target):
        return True
    if inspect.isroutine(target) or isinstance(target, type):
        return False
    call = getattr(type(target), "__call__", None)  # noqa: B004
    return call is not None and inspect.iscoroutinefunction(call)


def step_name(fn: Callable[..., Any]) -> str:
    """Default step name: the function's ``__qualname__``."""
    target = _unwrap(fn)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name is None:
        name = type(target).__qualname__
    return str(name)


# Values that an adapter passes through unchanged both ways, by its core schema (a schema with
# any constraint, e.g. ``Annotated[int, Field(gt=0)]``, has more keys than ``type``): for
# them ``to_json`` and ``from_json`` skip pydantic. That is most step results, and pydantic's
# serializer and validator are large code that runs cold after every commit's fsync.
_PLAIN_BY_SCHEMA: dict[str, tuple[type, ...]] = {
    "any": (str, int, bool, float, type(None)),
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (float,),
    "none": (type(None),),
}
_PLAIN: dict[int, tuple[TypeAdapter[Any], tuple[type, ...]]] = {}


def _plain_types(adapter: TypeAdapter[Any]) -> tuple[type, ...]:
    got = _PLAIN.get(id(adapter))
    if got is None or got[0] is not adapter:
        try:
            schema = adapter.core_schema
            types = _PLAIN_BY_SCHEMA.get(str(schema.get("type")), ()) if len(schema) == 1 else ()
        except Exception:  # a type not fully defined: pydantic's way reports it where it can
            types = ()
        if len(_PLAIN) > 4096:  # (adapters of unhashable annotations are made per call)
            _PLAIN.clear()
        got = _PLAIN[id(adapter)] = (adapter, types)
    return got[1]


def plain_for(
    value: Any, adapter: TypeAdapter[Any], max_bytes: int = _limits.DEFAULT_MAX_PAYLOAD_BYTES
) -> bool:
    """``value`` is its own JSON form under ``adapter`` (exact types only: a ``bool`` is not
    an ``int`` here, nor an ``IntEnum``), orjson can write it, every store keeps it exactly
    and it is surely within ``max_bytes`` of JSON."""
    t = type(value)
    if t not in _plain_types(adapter):
        return False
    if t is int:
        return bool(-(2**63) <= value < 2**64 and max_bytes >= 32)  # (orjson's range)
    if t is float:
        return math.isfinite(value) and max_bytes >= 32  # (to_json refuses inf and nan)
    if t is str:
        # (not ASCII: orjson must look, a lone surrogate cannot be written; NUL: refused;
        # an escape is at most 6 bytes a character)
        return bool(value.isascii() and "\x00" not in value and len(value) * 6 + 2 <= max_bytes)
    return True


def plain_json(value: Any) -> bool:
    """``value`` is a JSON scalar that every conversion here passes through unchanged."""
    return plain_for(value, ANY_ADAPTER)


def to_json(
    value: Any,
    adapter: TypeAdapter[Any] = ANY_ADAPTER,
    what: str = "value",
    max_bytes: int = _limits.DEFAULT_MAX_PAYLOAD_BYTES,
) -> JSON:
    """Convert ``value`` to JSON types, or raise ``SerializationError`` naming ``what``: when
    it is not serializable, holds NaN, ±inf or a string with NUL anywhere (no store keeps them
    exactly), or its JSON is over ``max_bytes`` (docs/stores.md, "Limits")."""
    if plain_for(value, adapter, max_bytes):
        return value
    try:
        data = adapter.dump_python(value, mode="json")
        raw = orjson.dumps(data)
    except Exception as exc:
        raise SerializationError(
            f"{what} is not serializable ({type(value).__qualname__}): {exc}. "
            "Return pydantic models, dataclasses or JSON types."
        ) from exc
    problem = _limits.size_problem(len(raw), max_bytes)
    if problem is None and _limits.suspicious(raw):
        # NaN and inf come out of pydantic (or orjson) as null: look for them in the Python
        # form; NUL is in the JSON form itself
        problem = _limits.value_problem(data)
        if problem is None:
            try:
                problem = _limits.value_problem(adapter.dump_python(value, mode="python"))
            except Exception:  # (the JSON form came out: no float of it is lost there)
                problem = None
        if problem is not None:
            problem = (
                f"holds {problem}, which no store keeps exactly (NaN and inf are no JSON "
                'numbers, PostgreSQL cannot store NUL): docs/stores.md "Limits"'
            )
    if problem is not None:
        raise SerializationError(f"{what} ({type(value).__qualname__}) {problem}")
    return data


def from_json(data: JSON, adapter: TypeAdapter[Any] = ANY_ADAPTER) -> Any:
    """Rebuild a typed value from its JSON form."""
    if type(data) in _plain_types(adapter):
        return data
    return adapter.validate_python(data)


def dumps(data: JSON) -> bytes:
    """Canonical bytes: sorted keys, no whitespace."""
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)


def loads(raw: bytes | str) -> JSON:
    return orjson.loads(raw)


def is_async_callable(fn: Callable[..., Any]) -> bool:
    target = _unwrap(fn)
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
        getattr(target, "__call__", None)  # noqa: B004
    )


# orjson writes JSON types, UUIDs and enums itself exactly as pydantic's ``to_jsonable_python``
# followed by ``dumps`` would; anything else (dates, dataclasses, models, subclasses, non-str
# keys, services) goes to ``_not_plain`` and takes pydantic's way. (One difference: an
# ``orjson.Fragment`` argument is digested by its content, where pydantic's way wrote its type
# name, so that every fragment had the same digest.)
_DIGEST_OPTIONS = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def _not_plain(obj: Any) -> Any:
    raise TypeError


def digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A short stable digest of a step's arguments, for divergence reports (objects that are
    not JSON, such as injected services, count by their type name): the first 12 hex digits
    of the SHA-256 of their canonical JSON."""
    try:
        raw = orjson.dumps([args, kwargs], option=_DIGEST_OPTIONS, default=_not_plain)
    except TypeError:
        data = pydantic_core.to_jsonable_python(
            [list(args), kwargs], fallback=lambda o: f"<{type(o).__qualname__}>"
        )
        raw = dumps(data)
    return hashlib.sha256(raw).hexdigest()[:12]
