"""The ids of a continue-as-new chain (docs/composing-workflows.md): ``base``, ``base~1``, ...;
pure functions of an id, shared by continue-as-new, children and the CLI."""

from __future__ import annotations

import re

_SUFFIX = re.compile(r"~([0-9]+)\Z")


def successor_id(run_id: str) -> str:
    """The id of the run that ``run_id`` continues as: ``base~(n+1)`` for ``base~n``, else
    ``run_id~1`` (the same on every try: a retried continuation never makes two)."""
    m = _SUFFIX.search(run_id)
    if m is None:
        return f"{run_id}~1"
    return f"{run_id[: m.start()]}~{int(m.group(1)) + 1}"


def base_id(run_id: str) -> str:
    """The id of a chain's first run: ``run_id`` without its ``~n`` suffix."""
    m = _SUFFIX.search(run_id)
    return run_id if m is None else run_id[: m.start()]


def predecessor_id(run_id: str) -> str | None:
    """The id of the run that ``run_id`` would continue (``base~(n-1)``, ``base`` for
    ``base~1``), or ``None`` for a chain's first id. Only ``Run.continued_as`` of that run
    says whether it did."""
    m = _SUFFIX.search(run_id)
    if m is None or int(m.group(1)) < 1:
        return None
    base, n = run_id[: m.start()], int(m.group(1))
    return base if n == 1 else f"{base}~{n - 1}"


__all__ = ["base_id", "predecessor_id", "successor_id"]
