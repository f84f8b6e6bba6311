"""The ``flowkit`` command's search and retention parts (docs/search-and-retention.md): ``runs
--search``, the search attributes ``show`` prints, and ``prune --older-than 30d``."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .._core.run import TERMINAL_STATUSES, RunStatus
from .._core.search_terms import SearchValue, Term, parse_filter
from .._worker.retention import prune_store
from ..errors import InvalidInputError
from ._common import CliError

_TERM = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*(==|!=|<=|>=|=|<|>)\s*(.*)$", re.DOTALL)
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


UsageError = CliError
"""A command-line value that does not parse (the CLI prints it as its error)."""


def _value(text: str) -> SearchValue:
    """A filter value: JSON when it reads as a number, ``true``/``false`` or a quoted
    string; else the text itself."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, bool | int | float | str):
        return value
    return text


def search_terms(specs: Sequence[str] | None) -> tuple[Term, ...]:
    """``--search`` arguments (``key=value``, ``key!=value``, ``key>=5``...) as filter terms."""
    terms: list[Term] = []
    for raw in specs or ():  # (each one a term of its own: two may bound one attribute)
        m = _TERM.match(raw)
        if m is None:
            raise UsageError(f"--search takes key=value (or key!=, <, <=, >, >=), got {raw!r}")
        name, op, text = m.groups()
        try:
            terms.extend(parse_filter({name: (("==" if op == "=" else op), _value(text))}))
        except InvalidInputError as exc:
            raise UsageError(str(exc)) from None
    return tuple(terms)


def duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s`` (or plain seconds) as seconds."""
    m = _DURATION.match(text)
    if m is None:
        raise UsageError(f"a duration like 30d, 12h, 90m or 45s, got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def shown(search: Mapping[str, SearchValue]) -> str:
    """A run's search attributes on one line (``flowkit show``)."""
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(search.items()))


def add_prune_parser(sub: Any) -> None:
    """The ``prune`` subcommand's arguments."""
    pr = sub.add_parser("prune", help="delete terminal runs settled longer ago than a duration")
    pr.add_argument(
        "--older-than", required=True, metavar="AGE", help="30d, 12h, 90m, 45s (settled before)"
    )
    pr.add_argument("--workflow", help="only runs of this workflow")
    pr.add_argument("--status", choices=sorted(s.value for s in TERMINAL_STATUSES))


async def prune(args: argparse.Namespace, out: Any, store: Any) -> int:
    """``flowkit prune``: delete in batches, print how many."""
    age = duration(args.older_than)
    status = RunStatus(args.status) if args.status else None
    n = await prune_store(store, args.clock.now() - age, args.workflow, status)
    out.line(f"pruned {n} run{'' if n == 1 else 's'} settled more than {args.older_than} ago")
    return 0


__all__ = ["UsageError", "add_prune_parser", "duration", "prune", "search_terms", "shown"]
