"""The workflows an engine has registered (``Registry``): every ``(name, version)`` pair, and
the newest version of each name by natural order (``natural_key``).

Several classes may share one workflow name with different versions (docs/writing-workflows.md,
"Versions"): new runs take the newest, a pinned start takes the one it names, and a run always
resumes on the version it started on, so the worker needs every pair, not one definition per
name."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from .definition import WorkflowDefinition

_PARTS = re.compile(r"(\d+)")


def natural_key(version: str) -> tuple[tuple[int, int, str], ...]:
    """The sort key of natural order: the version split into digit runs and the text between
    them; digit runs compare as numbers (``"10" > "9"``, ``"1.10" > "1.9"``, ``"2" > "1"``),
    text compares as text, and a number sorts before text at the same place (``"1.0" <
    "1.a"``). Equal numbers with different spellings (``"01"``, ``"1"``) are told apart by the
    spelling, so two different versions never compare equal."""
    out: list[tuple[int, int, str]] = []
    for i, part in enumerate(_PARTS.split(version)):
        if not part:
            continue
        if i % 2:  # a digit run
            out.append((0, int(part), part))
        else:
            out.append((1, 0, part))
    return tuple(out)


Entry = tuple[WorkflowDefinition, Any]
"""A registered version: its definition and the instance whose ``run`` is the body."""


class Registry:
    """Workflow ``(name, version)`` → ``(definition, instance)``, for one engine."""

    def __init__(self) -> None:
        self._by_name: dict[str, dict[str, Entry]] = {}
        self._newest: dict[str, str] = {}
        self._pairs: tuple[tuple[str, str], ...] | None = None  # (cached: every claim asks)

    def add(self, defn: WorkflowDefinition, instance: Any) -> None:
        """Register one version; ``ValueError`` for a ``(name, version)`` already here."""
        versions = self._by_name.setdefault(defn.name, {})
        if defn.version in versions:
            raise ValueError(
                f"duplicate workflow {defn.name!r} version {defn.version!r} on one engine"
            )
        versions[defn.version] = (defn, instance)
        self._pairs = None
        newest = self._newest.get(defn.name)
        if newest is None or natural_key(defn.version) > natural_key(newest):
            self._newest[defn.name] = defn.version

    def get(self, name: str, version: str | None = None) -> Entry | None:
        """The entry of ``name`` at ``version`` (``None``: its newest), or ``None``."""
        versions = self._by_name.get(name)
        if versions is None:
            return None
        return versions.get(self._newest[name] if version is None else version)

    def newest(self, name: str) -> str | None:
        """The newest registered version of ``name`` by natural order, or ``None``."""
        return self._newest.get(name)

    def versions(self, name: str) -> list[str]:
        """The registered versions of ``name``, oldest first (natural order)."""
        return sorted(self._by_name.get(name, ()), key=natural_key)

    def pairs(self) -> tuple[tuple[str, str], ...]:
        """Every registered ``(name, version)``, sorted: what a worker claims."""
        if self._pairs is None:
            self._pairs = tuple(
                sorted((name, v) for name, versions in self._by_name.items() for v in versions)
            )
        return self._pairs

    def names(self) -> tuple[str, ...]:
        """The registered workflow names, sorted."""
        return tuple(sorted(self._by_name))

    def __contains__(self, name: object) -> bool:
        """Whether some version of the workflow ``name`` is registered."""
        return name in self._by_name

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_name.values())

    def __repr__(self) -> str:
        return f"Registry({list(self.pairs())!r})"


__all__ = ["Entry", "Registry", "natural_key"]
