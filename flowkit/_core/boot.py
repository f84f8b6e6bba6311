"""The first thing ``import flowkit`` does, in a ``flowkit worker`` process only: catch
SIGTERM/SIGINT, before the rest of flowkit (and the app, and the store) is imported, so that
a stop signal in the worker's first second stops it cleanly (exit 0) instead of killing it
(exit 143). Standard library only: it runs before anything else is loaded.

Which process that is, ``sys.orig_argv`` says exactly (``flowkit worker ...`` or
``python -m flowkit.cli worker ...``): a program that merely imports flowkit keeps its own
signal handling. ``flowkit.cli`` takes over from here (``_serve.catch_stop_signals``)."""

from __future__ import annotations

import os
import signal
import sys

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
EARLY: list[int] = []
"""The stop signals received before ``Engine.serve`` installed its own handlers."""


def caught_early(signum: int, frame: object) -> None:
    """The handler until ``serve``: remember the first signal; a second one exits at once."""
    EARLY.append(signum)
    if len(EARLY) > 1:
        os._exit(128 + signum)


_WITH_VALUE = frozenset({"-X", "-W", "--check-hash-based-pycs"})
"""The interpreter's options that take the next argument as their value."""


def worker_command(argv: list[str]) -> bool:
    """Whether ``argv`` (``sys.orig_argv``) runs the ``flowkit worker`` command."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return argv[i + 1 : i + 2] == ["flowkit.cli"] and "worker" in argv[i + 2 :]
        if arg == "-c" or arg == "-":
            return False
        if not arg.startswith("-"):  # (the script: the console script ``flowkit``)
            return os.path.basename(arg) == "flowkit" and "worker" in argv[i + 1 :]
        i += 2 if arg in _WITH_VALUE else 1
    return False


def catch_if_worker() -> bool:
    """Catch the stop signals now if this process is ``flowkit worker``; whether it did."""
    if not worker_command(list(getattr(sys, "orig_argv", ()))):
        return False
    try:
        for sig in STOP_SIGNALS:
            signal.signal(sig, caught_early)
    except ValueError:  # (not the main thread: flowkit imported from a thread)
        return False
    return True


CAUGHT = catch_if_worker()
"""Whether this process caught the stop signals at import."""
