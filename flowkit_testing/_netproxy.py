"""``NetProxy``: a TCP proxy on loopback that makes a database link misbehave on demand.

It forwards every connection to a target (a TCP ``(host, port)`` or a unix socket path, such
as a test PostgreSQL server's ``.s.PGSQL.5432``) and can add latency in each direction, stall
every connection (open but silent), reset them all, or accept new connections and never
answer. It runs its own event loop in a daemon thread, so a stall of the code under test never
stalls the proxy. For tests and ``bench/`` only: it is not part of the public API."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

Target = tuple[str, int] | str
"""``(host, port)`` or the path of a unix socket."""

_CHUNK = 1 << 16


class _Link:
    """One proxied connection: the client's and the target's streams."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self) -> None:
        """Close both sides at once with a TCP reset where the socket allows it."""
        for w in (self.client, self.upstream):
            sock = w.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.transport.abort()
        for t in self.tasks:
            t.cancel()


class NetProxy:
    """``with NetProxy(target) as proxy:`` listens on ``127.0.0.1:proxy.port``.

    ``delay``: seconds added to every chunk in each direction (order kept). ``stall()`` /
    ``resume()``: stop and restart forwarding on every connection, new ones included, without
    closing anything. ``reset()``: abort every open connection. ``blackhole``: new connections
    are accepted and never forwarded or answered."""

    def __init__(self, target: Target, *, delay: float = 0.0) -> None:
        self.target = target
        self.delay = delay
        self.blackhole = False
        self.port = 0
        self.connections = 0  # accepted so far
        self._links: set[_Link] = set()
        self._held: set[asyncio.StreamWriter] = set()  # blackholed clients
        self._flowing: asyncio.Event | None = None
        self._flowing_t = threading.Event()  # (the same, for the delayers' threads)
        self._flowing_t.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifetime -------------------------------------------------------------------------------
    def start(self) -> NetProxy:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10) or self.port == 0:
            raise RuntimeError("the proxy did not start")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        self._call(self._shutdown)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    def __enter__(self) -> NetProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def url_for(self, url: str) -> str:
        """``url`` (a ``postgresql+psycopg://`` URL) pointed at this proxy instead."""
        import sqlalchemy as sa

        u = sa.engine.make_url(url)
        query = {k: v for k, v in u.query.items() if k not in ("host", "port")}
        return u.set(host="127.0.0.1", port=self.port, query=query).render_as_string(
            hide_password=False
        )

    # -- faults (callable from any thread) ----------------------------------------------------
    def stall(self) -> None:
        self._flowing_t.clear()
        self._call(lambda: self._flow().clear())

    def resume(self) -> None:
        self._flowing_t.set()
        self._call(lambda: self._flow().set())

    def reset(self) -> int:
        """Abort every open connection; how many there were."""
        return int(self._call(self._reset_all))

    def open_connections(self) -> int:
        return int(self._call(lambda: len(self._links)))

    # -- inside the proxy's thread ------------------------------------------------------------
    def _call(self, fn: Callable[[], Any]) -> Any:
        loop = self._loop
        if loop is None:
            raise RuntimeError("the proxy is not running")
        done = threading.Event()
        box: list[Any] = []

        def run() -> None:
            try:
                box.append(fn())
            finally:
                done.set()

        loop.call_soon_threadsafe(run)
        if not done.wait(10):
            raise RuntimeError("the proxy did not answer")
        return box[0] if box else None

    def _flow(self) -> asyncio.Event:
        assert self._flowing is not None
        return self._flowing

    def _main(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._flowing = asyncio.Event()
        self._flowing.set()
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._accept, "127.0.0.1", 0)
            )
            self.port = self._server.sockets[0].getsockname()[1]
        finally:
            ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        self._reset_all()
        for w in self._held:
            w.transport.abort()
        self._held.clear()

    def _reset_all(self) -> int:
        links = list(self._links)
        self._links.clear()
        for link in links:
            link.abort()
        return len(links)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.blackhole:
            self._held.add(writer)
            return
        try:
            if isinstance(self.target, str):
                up_r, up_w = await asyncio.open_unix_connection(self.target)
            else:
                up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        link = _Link(writer, up_w)
        self._links.add(link)
        link.tasks = [
            asyncio.ensure_future(self._pump(reader, up_w, link)),
            asyncio.ensure_future(self._pump(up_r, writer, link)),
        ]

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, link: _Link
    ) -> None:
        """Copy ``src`` to ``dst``, each chunk ``delay`` after it arrived, in order. The delay
        is kept by a thread (``_Delayer``): asyncio's timers wake up to a millisecond late,
        which would add about 0.5 ms to each 2 ms delay."""
        delayer = _Delayer(self, asyncio.get_running_loop(), dst, link)
        delayer.start()
        try:
            while True:
                await self._flow().wait()
                data = await src.read(_CHUNK)
                if not data:
                    break
                delayer.queue.put((time.perf_counter() + self.delay, data))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            delayer.queue.put(None)

    def _close(self, link: _Link) -> None:
        """(on the loop) One side ended: close the whole link."""
        if link in self._links:
            self._links.discard(link)
            link.abort()


class _Delayer(threading.Thread):
    """Hands each chunk of one direction to the loop for writing once its time has come (a
    thread's sleep is precise to tens of microseconds), in order, and holds them while the
    proxy is stalled."""

    def __init__(
        self,
        proxy: NetProxy,
        loop: asyncio.AbstractEventLoop,
        dst: asyncio.StreamWriter,
        link: _Link,
    ) -> None:
        super().__init__(daemon=True)
        self.queue: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()
        self._proxy = proxy
        self._loop = loop
        self._dst = dst
        self._link = link

    def _write(self, data: bytes) -> None:
        if not self._dst.is_closing():
            self._dst.write(data)

    def run(self) -> None:
        try:
            while True:
                item = self.queue.get()
                if item is None:
                    break
                due, data = item
                while (left := due - time.perf_counter()) > 0:
                    time.sleep(left)
                self._proxy._flowing_t.wait()
                self._loop.call_soon_threadsafe(self._write, data)
            self._loop.call_soon_threadsafe(self._proxy._close, self._link)
        except RuntimeError:  # the proxy's loop is closed: it stopped
            pass


__all__ = ["NetProxy", "Target"]
