"""``ctx.upsert_search``: search attributes (event ``search_upserted``),
docs/search-and-retention.md.

The call takes its position and is decided when it is made (validated, matched against the
history): it needs no await. Its event rides with the run's next write (the store merges it
into the run's map in that write: ``stores.base.Update``), as ``ctx.patched``'s marker does;
awaited, it is written at once."""

from __future__ import annotations

from collections.abc import Awaitable, Generator
from typing import Any

from .._core.search_terms import check_attrs
from ..events import SearchUpserted
from .guard import made_on, unawaited
from .matching import search_name
from .state import ActivationState


class Upserted:
    """What ``ctx.upsert_search`` returns: awaiting it writes the event now, if it still
    waits for a write (replayed, or written meanwhile: nothing to do)."""

    __slots__ = ("_ev", "_st")

    def __init__(self, st: ActivationState, ev: SearchUpserted | None) -> None:
        self._st = st
        self._ev = ev

    def __await__(self) -> Generator[Any, Any, None]:
        st, ev = self._st, self._ev
        if ev is None or not any(e is ev for e in st.pending):
            return
        br = st.branch()  # (the branch awaiting it: a ctx.gather child, maybe)
        br.depth += 1  # (its writes may yield to the event loop: a ctx call's own)
        try:
            yield from st.record([]).__await__()
        finally:
            br.depth -= 1

    def __repr__(self) -> str:
        return "<ctx.upsert_search>"


def upsert_search(st: ActivationState, attrs: dict[str, Any]) -> Awaitable[None]:
    """``ctx.upsert_search``: validates (``InvalidInputError`` in the body, nothing written,
    no position taken), takes its position, and defers ``SearchUpserted`` to the next write."""
    clean = check_attrs(attrs, st.defn.name)
    br = made_on(st)
    if br.next != br.counter + 1:  # (it starts now: the calls made before it must have)
        raise unawaited(st, br)
    pos = br.next_pos()
    br.next = br.counter + 1
    if st.take(pos, "upsert_search", search_name(clean)):
        return Upserted(st, None)  # (replayed: recorded already)
    if st.replay_only:
        raise st.stop_replay(pos, "upsert_search")
    st.check_alive()
    ev = SearchUpserted(pos=pos, attrs=clean, at=st.host.now())
    # (with the next write, not observed: the branch's clock must not move, as a replay
    # that finds the event does not see it move)
    st.pending.append(ev)
    return Upserted(st, ev)


__all__ = ["Upserted", "upsert_search"]
