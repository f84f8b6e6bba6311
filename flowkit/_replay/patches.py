"""Patching: ``ctx.patched(id)`` and ``ctx.deprecate_patch(id)``, which let a deploy change a
body in place while runs recorded by the old code are in flight.

A patch call takes no position (a ``patch_marker`` event has none), so the calls around it keep
theirs. ``patched(id)`` is True when the history has a marker for ``id`` (anywhere), False
when the run was already recorded *past this point* without one (the old code ran here), and
otherwise (new ground: the live frontier of this line of execution) True, recording a marker.

"Past this point" is a function of the history and the call's place alone, never of timing,
so every activation and every replay decides the same way: the history ends in a terminal
event (no ``run_retried`` after it), or holds an event at a later position of the calling
branch, or of one of its ancestors after the ``ctx.gather`` the branch belongs to (that
gather had returned). Progress of sibling branches says nothing about this one and does not
count. Once decided, one id's answer is fixed for the rest of the activation."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .._core import limits as _limits
from ..events import (
    Event,
    PatchMarker,
    RunCancelled,
    RunCompleted,
    RunDead,
    RunFailed,
    RunRetried,
)

_TERMINAL = (RunCompleted, RunFailed, RunCancelled, RunDead)


def check_patch_id(patch_id: object, workflow: str) -> str:
    """``patch_id`` when it is a usable patch id, else ``InvalidInputError`` (a programming
    error in the body: the activation fails the run, and nothing is recorded for it)."""
    _limits.check_identifier("patch id", patch_id, _limits.MAX_PATCH_ID_LENGTH, workflow)
    assert isinstance(patch_id, str)
    return patch_id


def parse_pos(pos: str) -> tuple[int, ...]:
    """A position as numbers: ``"3.1/2"`` (call 2 of branch 1 of the gather at 3) is
    ``(3, 1, 2)``; calls sit at even indexes, a gather's branch numbers at odd ones."""
    return tuple(int(part) for part in pos.replace("/", ".").split("."))


def passed(point: tuple[int, ...], positions: Iterable[tuple[int, ...]]) -> bool:
    """Whether one of ``positions`` lies after ``point`` on its line of execution.

    ``point`` is the calling branch's path with, last, the number of calls it has made:
    ``(g0, b0, ..., gk-1, bk-1, n)``. A position is after it when, at some level ``j``, it
    shares the first ``2j`` numbers (it is in the same ancestor branch) and its call number
    there is greater (a later call of that branch, or anything inside one)."""
    levels = range(0, len(point), 2)
    for q in positions:
        for j in levels:
            if len(q) <= j or q[:j] != point[:j]:
                break
            if q[j] > point[j]:
                return True
            if q[j] < point[j]:
                break
    return False


@dataclass(frozen=True)
class PatchCall:
    """A patch call the body made in this activation, for the divergence report."""

    patch_id: str
    deprecated: bool
    taken: bool  # the answer (deprecate_patch: whether the history had or got the marker)


class Patches:
    """The patch markers of one activation's history and the answers it has given."""

    def __init__(self, events: Sequence[Event]) -> None:
        self.markers: dict[str, PatchMarker] = {}
        self.ended = False
        for ev in events:
            if isinstance(ev, PatchMarker):
                self.markers.setdefault(ev.patch_id, ev)
            elif isinstance(ev, _TERMINAL):
                self.ended = True
            elif isinstance(ev, RunRetried):
                self.ended = False
        self.decided: dict[str, bool] = {}
        self.calls: dict[PatchCall, None] = {}  # (in the order made, once each)
        self._positions: list[tuple[int, ...]] | None = None

    def past(self, point: tuple[int, ...], index: Iterable[str]) -> bool:
        """The run was already recorded past ``point`` (see the module's docstring)."""
        if self.ended:
            return True
        if self._positions is None:  # (parsed once, when a first patch call needs them)
            self._positions = [parse_pos(p) for p in index]
        return passed(point, self._positions)

    def note(self) -> str:
        """What the patches have to do with a divergence, for its report ("" when nothing)."""
        notes: list[str] = []
        asked = {c.patch_id for c in self.calls}
        for pid, marker in self.markers.items():
            if pid not in asked:
                notes.append(
                    f"the history took patch {pid!r} ({marker.type}#{marker.seq}) but the code "
                    f"has not called ctx.patched({pid!r}) before this point: was its patched "
                    "branch removed while such runs were in flight?"
                )
        for c in self.calls:
            if c.taken:
                continue
            if c.deprecated:
                notes.append(
                    f"ctx.deprecate_patch({c.patch_id!r}) ran on a history recorded without "
                    f"patch {c.patch_id!r} (before ctx.patched({c.patch_id!r}) was deployed): "
                    "such runs must settle before the deprecate deploy"
                )
            else:
                notes.append(
                    f"ctx.patched({c.patch_id!r}) returned False: the history was recorded "
                    "without the patch, so the code must take the old branch"
                )
        return "; ".join(notes)
