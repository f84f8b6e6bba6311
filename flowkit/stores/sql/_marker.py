"""``SqlStore``'s side of the encryption marker (``flowkit.stores._codec_mark``): the marker
lives in ``flowkit_meta``; a bound store records it on its first guarded write, a plain one
reads it once per store object."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .._codec_mark import CODEC_META_KEY, CodecMark, refuse
from ._connection import Conn
from ._group_commit import GroupCommit, Op
from ._statements import Statements


class CodecMarked:
    """Mixed into ``SqlStore`` (which sets ``_sql``, ``_gc`` and ``_mark``)."""

    _sql: Statements
    _gc: GroupCommit
    _mark: CodecMark
    _marker_reads: dict[asyncio.AbstractEventLoop, asyncio.Task[str | None]]

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
        payload writes must respect (``None``: in clear; read once per store object)."""
        mark = self._mark
        if mark.bound is not None:
            q, params = self._sql.put_meta, {"key": CODEC_META_KEY, "value": mark.bound}

            def op(c: Conn, _: None) -> None:
                c.write(q, params)

            await self._gc.write(Op(op, None, ""))
            mark.settled = True
            return None
        found = await self._read_marker()
        if found is None:
            mark.settled = True
        return found

    async def _read_marker(self) -> str | None:
        """``codec_marker()``, one read for the calls of a loop that want it at once (the
        first calls of a fresh store, before the marker is settled)."""
        loop = asyncio.get_running_loop()
        task = self._marker_reads.get(loop)
        if task is None:
            task = self._marker_reads[loop] = loop.create_task(self.codec_marker())

            def done(t: asyncio.Task[str | None]) -> None:
                self._marker_reads.pop(loop, None)
                if not t.cancelled():
                    t.exception()  # (retrieved: its callers may all have been cancelled)

            task.add_done_callback(done)
        return await asyncio.shield(task)

    async def _plain(self, what: str, carries: Callable[..., bool], *args: Any) -> None:
        """Record the bound marker, or raise ``EncryptedStoreError`` (``refuse``) when this
        plain store would ``what`` on an encrypted database and ``carries(*args)`` says the
        write holds a payload. Called only while ``_mark`` is not settled."""
        found = await self._guard()
        if found is not None and carries(*args):
            raise refuse(found, what)


__all__ = ["CodecMarked"]
