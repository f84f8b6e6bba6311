"""A file-change signal for the SQLite wake-up watcher (Linux ``inotify`` through ``ctypes``):
a commit of any process writes the database's directory (its ``-wal`` file, or the file
itself), and the kernel makes a descriptor readable. The watcher waits on it in the event loop
instead of checking ``PRAGMA data_version`` every 10 ms: an idle engine then wakes for nothing
(each wake-up of an event loop costs ~0.1 ms of CPU; a hundred a second were ~1.5 % of a core).
Elsewhere (no ``inotify``) ``open_dir_watch`` answers ``None`` and the watcher polls."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys

_IN_MODIFY = 0x00000002
_IN_CREATE = 0x00000100
_IN_MOVED_TO = 0x00000080
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000


def open_dir_watch(directory: str) -> int | None:
    """A non-blocking descriptor that becomes readable when a file of ``directory`` is
    written or created, or ``None`` where ``inotify`` is missing or refused."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        init = libc.inotify_init1
        add = libc.inotify_add_watch
    except (OSError, AttributeError):
        return None
    fd = int(init(_IN_NONBLOCK | _IN_CLOEXEC))
    if fd < 0:
        return None
    mask = _IN_MODIFY | _IN_CREATE | _IN_MOVED_TO
    if int(add(fd, os.fsencode(directory), mask)) < 0:
        os.close(fd)
        return None
    return fd


def drain(fd: int) -> None:
    """Read every queued event (their content does not matter: any write means look)."""
    with contextlib.suppress(BlockingIOError, InterruptedError):
        while os.read(fd, 65536):
            pass


__all__ = ["drain", "open_dir_watch"]
