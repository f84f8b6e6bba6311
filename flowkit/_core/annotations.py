"""Resolving the annotations flowkit validates with (a workflow's input and output, a step's
result) to real types, or saying clearly which name is missing. Never a silent ``Any``."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

MISSING: Any = inspect.Parameter.empty


def evaluate(annotation: Any, globalns: dict[str, Any], localns: Mapping[str, Any]) -> Any:
    """The type that ``annotation`` (a type, a string, or a generic with strings inside) names,
    evaluated as ``typing.get_type_hints`` does but keeping ``Annotated`` metadata (its
    constraints are part of the validation). Raises what the evaluation raises: ``NameError``
    for a name defined nowhere."""
    holder = types.SimpleNamespace(__annotations__={"a": annotation})
    return typing.get_type_hints(holder, globalns, dict(localns), include_extras=True)["a"]


_NEVER: tuple[Any, ...] = (typing.NoReturn, typing.Never)


def result_type(tp: Any) -> Any:
    """The type a value returned under the annotation ``tp`` is validated with: ``tp``, but
    ``Any`` for ``NoReturn``/``Never`` (a function that never returns normally, as Temporal's
    samples annotate an activity that always raises: no result to validate, and pydantic has
    no schema for them)."""
    return Any if any(tp is never for never in _NEVER) else tp


def function_globals(fn: Callable[..., Any]) -> dict[str, Any]:
    """The module namespace ``fn``'s annotations are evaluated in (through ``__wrapped__``)."""
    ns = getattr(inspect.unwrap(fn), "__globals__", None)
    return ns if isinstance(ns, dict) else {}


def closure_names(fn: Callable[..., Any]) -> dict[str, Any]:
    """The variables ``fn`` closes over that have a value (a local model a nested function
    uses in its body is visible to its annotations too)."""
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    out: dict[str, Any] = {}
    if code is None:
        return out
    for name, cell in zip(code.co_freevars, cells, strict=False):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # (an empty cell: assigned later in the enclosing function)
            continue
    return out


def class_names(owner: type | None) -> dict[str, Any]:
    """The class-body names an annotation of a method of ``owner`` can use (a nested
    ``class Input(BaseModel)``), the subclass's shadowing its bases'."""
    out: dict[str, Any] = {}
    if owner is None:
        return out
    for klass in reversed(owner.__mro__[:-1]):  # (not object)
        out.update(vars(klass))
    return out


def missing_name(exc: BaseException) -> str | None:
    """The undefined name a ``NameError`` is about."""
    name = getattr(exc, "name", None)
    return name if isinstance(name, str) else None


def describe(annotation: Any) -> str:
    """An annotation as the user wrote it."""
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__qualname__", None) or repr(annotation)
