"""``SqlStore``'s side of the encryption marker (``flowkit.stores.codec._mark``): the marker
lives in ``flowkit_meta``; a bound store records it on its first guarded write, a plain one
reads it once per store object."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..codec._mark import CODEC_META_KEY, CodecMark, refuse
from ._connection import Conn
from ._group_commit import GroupCommit, Op
from ._statements import Statements


class CodecMarked:
    """Mixed into ``SqlStore`` (which sets ``_sql``, ``_gc`` and ``_mark``)."""

    _sql: Statements
    _gc: GroupCommit
    _mark: CodecMark
    _mark_pending: asyncio.Future[str | None] | None = None

    def bind_codec(self, marker: str) -> None:
        """Called by a ``CodecStore`` wrapping this object: its payloads come encoded, and
        ``marker`` is recorded in ``flowkit_meta`` on the first write through it."""
        self._mark.bind(marker)

    async def codec_marker(self) -> str | None:
        """The marker a ``CodecStore`` recorded (``None``: payloads are stored in clear)."""
        q = self._sql.get_meta

        def op(c: Conn) -> Any:
            return c.one(q, {"key": CODEC_META_KEY})

        row = await self._gc.read(op)
        return None if row is None else str(row[0])

    async def _guard(self) -> str | None:
        """Record the bound marker (once per store object); on a plain store, the marker its
        payload writes must respect (``None``: in clear; read once per store object).
        Concurrent first calls share one round trip and resume together, so the writes they
        go on to issue still share one group commit."""
        pending = self._mark_pending
        if (
            pending is None
            or pending.done()
            or pending.get_loop() is not asyncio.get_running_loop()
        ):
            pending = self._mark_pending = asyncio.ensure_future(self._settle_mark())
        return await asyncio.shield(pending)

    async def _settle_mark(self) -> str | None:
        mark = self._mark
        if mark.bound is not None:
            q, params = self._sql.put_meta, {"key": CODEC_META_KEY, "value": mark.bound}

            def op(c: Conn, _: None) -> None:
                c.write(q, params)

            await self._gc.write(Op(op, None, ""))
            mark.settled = True
            return None
        found = await self.codec_marker()
        if found is None:
            mark.settled = True
        return found

    async def _plain(self, what: str, carries: Callable[..., bool], *args: Any) -> None:
        """Record the bound marker, or raise ``EncryptedStoreError`` (``refuse``) when this
        plain store would ``what`` on an encrypted database and ``carries(*args)`` says the
        write holds a payload. Called only while ``_mark`` is not settled."""
        found = await self._guard()
        if found is not None and carries(*args):
            raise refuse(found, what)


__all__ = ["CodecMarked"]
