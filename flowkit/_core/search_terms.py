"""Search attributes (docs/search-and-retention.md), the part every layer shares: what a valid
attribute is, what a ``list_runs(search=...)`` filter means, and how an ``Update`` changes a run's
map.

A run's search attributes map identifier names to a ``str``, an ``int``, a ``float`` or a
``bool`` (a ``bool`` is never a number here: ``True`` does not equal ``1``). Values of
different kinds never compare equal, and a range operator only compares values of its own
kind, so a filter means the same on every store (stores push it into SQL: docs/stores.md)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import InvalidInputError
from .limits import text_problem

SearchValue = str | int | float | bool
"""What a search attribute holds."""

MAX_SEARCH_NAME_LENGTH = 64
"""Characters of a search attribute's name (an ASCII identifier: ``str.isidentifier``)."""
MAX_SEARCH_TEXT_LENGTH = 255
"""Characters of a search attribute's ``str`` value (indexed as ``VARCHAR(255)``)."""
MAX_SEARCH_ATTRS = 32
"""Search attributes one ``start`` or ``upsert_search`` call sets."""
MAX_SEARCH_INT = 2**53
"""The largest ``abs()`` of an ``int`` value: the SQL index keeps numbers as doubles, which
hold every integer up to this one exactly."""

Op = Literal["==", "!=", "<", "<=", ">", ">=", "in"]
OPS: tuple[str, ...] = ("==", "!=", "<", "<=", ">", ">=", "in")
RANGE_OPS = frozenset({"<", "<=", ">", ">="})

Kind = Literal["text", "num", "flag"]


def kind_of(value: SearchValue) -> Kind:
    """The kind of a valid value: ``text`` (str), ``num`` (int, float), ``flag`` (bool)."""
    if isinstance(value, bool):
        return "flag"
    if isinstance(value, str):
        return "text"
    return "num"


def value_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a search attribute's value, else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if abs(value) > MAX_SEARCH_INT:
            return f"the int {value} is beyond ±2**53 (kept exactly as a double)"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value!r} is not a finite number"
    if isinstance(value, str):
        if len(value) > MAX_SEARCH_TEXT_LENGTH:
            return f"a string of {len(value)} characters (at most {MAX_SEARCH_TEXT_LENGTH})"
        problem = text_problem(value)
        return None if problem is None else f"a string holding {problem}"
    return f"{value!r:.80} is a {type(value).__name__}, not a str, int, float or bool"


def name_problem(name: Any) -> str | None:
    """Why ``name`` cannot name a search attribute, else ``None``."""
    if not isinstance(name, str) or not name.isascii() or not name.isidentifier():
        return f"{name!r:.80} is not an ASCII identifier"
    if len(name) > MAX_SEARCH_NAME_LENGTH:
        return f"{name[:40]!r}... is longer than {MAX_SEARCH_NAME_LENGTH} characters"
    return None


def check_attrs(attrs: Any, workflow: str | None = None) -> dict[str, SearchValue]:
    """The search attributes ``attrs`` as a plain dict; ``InvalidInputError`` (naming the
    first bad name or value) when one is not valid."""
    if not isinstance(attrs, Mapping):
        raise InvalidInputError(workflow, f"search attributes must be a mapping, got {attrs!r:.80}")
    if len(attrs) > MAX_SEARCH_ATTRS:
        raise InvalidInputError(
            workflow, f"{len(attrs)} search attributes at once (at most {MAX_SEARCH_ATTRS})"
        )
    out: dict[str, SearchValue] = {}
    for name, value in attrs.items():
        problem = name_problem(name)
        if problem is None:
            problem = value_problem(value)
            if problem is not None:
                problem = f"search attribute {name!r}: {problem}"
        else:
            problem = f"search attribute name {problem}"
        if problem is not None:
            raise InvalidInputError(workflow, problem)
        out[name] = value
    return out


@dataclass(frozen=True)
class Term:
    """One condition of a ``list_runs(search=...)`` filter: attribute ``name`` ``op``
    ``values`` (one value, or the alternatives of ``in``; an empty ``in`` matches nothing)."""

    name: str
    op: Op
    values: tuple[SearchValue, ...]


def parse_filter(search: Mapping[str, Any] | None) -> tuple[Term, ...]:
    """The terms of a filter (combined with AND): each attribute maps to a value (``==``), to
    ``(op, value)``, op one of ``OPS`` (``in``: a list or tuple of values), or to a list of
    such pairs (``[(">=", 100), ("<", 500)]``: a range). Range operators take a ``str`` or a
    number. ``InvalidInputError`` for anything else."""
    if search is None:
        return ()
    if not isinstance(search, Mapping):
        raise InvalidInputError(None, f"search must be a mapping, got {search!r:.80}")
    terms: list[Term] = []
    for name, spec in search.items():
        problem = name_problem(name)
        if problem is not None:
            raise InvalidInputError(None, f"search filter: attribute name {problem}")
        if _several(spec):  # [(op, value), ...]: a range, several terms of one attribute
            terms.extend(_term(name, one) for one in spec)
        else:
            terms.append(_term(name, spec))
    return tuple(terms)


def _several(spec: Any) -> bool:
    """Whether ``spec`` is a list of ``(op, value)`` pairs (``[(">=", 100), ("<", 500)]``)."""
    return (
        isinstance(spec, list)
        and bool(spec)
        and all(isinstance(one, tuple | list) and len(one) == 2 and one[0] in OPS for one in spec)
    )


def _term(name: str, spec: Any) -> Term:
    op: Any = "=="
    value: Any = spec
    if isinstance(spec, tuple | list):
        if len(spec) != 2 or spec[0] not in OPS:
            raise InvalidInputError(
                None, f"search filter {name!r}: {spec!r:.80} is not (op, value), op in {OPS}"
            )
        op, value = spec
    if op == "in":
        if not isinstance(value, list | tuple | set | frozenset):
            raise InvalidInputError(None, f"search filter {name!r}: 'in' takes a list or tuple")
        values = tuple(value)
    else:
        values = (value,)
    for v in values:
        problem = value_problem(v)
        if problem is not None:
            raise InvalidInputError(None, f"search filter {name!r}: {problem}")
        if op in RANGE_OPS and isinstance(v, bool):
            raise InvalidInputError(None, f"search filter {name!r}: {op} does not take a bool")
    return Term(name, op, values)


def same(a: SearchValue, b: SearchValue) -> bool:
    """Equality of search values: of one kind, and equal (``True != 1``)."""
    return kind_of(a) == kind_of(b) and a == b


def matches(attrs: Mapping[str, SearchValue], terms: Iterable[Term]) -> bool:
    """Whether a run with search attributes ``attrs`` passes every term. A run without the
    attribute never passes (not even ``!=``); ``!=`` passes a value of another kind."""
    for t in terms:
        if t.name not in attrs:
            return False
        have = attrs[t.name]
        if t.op == "!=":
            ok = not same(have, t.values[0])
        elif t.op in ("==", "in"):
            ok = any(same(have, v) for v in t.values)
        else:
            want = t.values[0]
            ok = kind_of(have) == kind_of(want) and _compare(have, t.op, want)
        if not ok:
            return False
    return True


def _compare(a: Any, op: str, b: Any) -> bool:
    if op == "<":
        return bool(a < b)
    if op == "<=":
        return bool(a <= b)
    if op == ">":
        return bool(a > b)
    return bool(a >= b)


def merged(base: Mapping[str, SearchValue], events: Iterable[Any]) -> dict[str, SearchValue] | None:
    """``base`` with the attributes of the ``search_upserted`` events among ``events``
    merged in, in order; ``None`` when there is none (the map does not change)."""
    out: dict[str, SearchValue] | None = None
    for ev in events:
        if getattr(ev, "type", None) == "search_upserted":
            if out is None:
                out = dict(base)
            out.update(ev.attrs)
    return out


def upserts(events: Iterable[Any]) -> bool:
    """Whether ``events`` hold a ``search_upserted`` (a commit that changes the map)."""
    return any(getattr(ev, "type", None) == "search_upserted" for ev in events)


__all__ = [
    "MAX_SEARCH_ATTRS",
    "MAX_SEARCH_INT",
    "MAX_SEARCH_NAME_LENGTH",
    "MAX_SEARCH_TEXT_LENGTH",
    "OPS",
    "SearchValue",
    "Term",
    "check_attrs",
    "kind_of",
    "matches",
    "merged",
    "parse_filter",
    "same",
    "upserts",
]
