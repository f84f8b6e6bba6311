"""Runs the documentation's program snippets for ``tests/test_docs.py``, in one interpreter.

``python tests/docs_runner.py MANIFEST RESULTS``: MANIFEST is a JSON list of
``{"id", "dir", "file"}``; each file runs as ``python FILE`` would run it (``__name__ ==
"__main__"``, its directory as the working directory and first on ``sys.path``), with its own
globals, one after the other. One interpreter for all of them saves an interpreter start and
the imports per snippet. RESULTS gets one JSON line as each snippet starts and one as it ends
(``ok``, ``stdout``, ``stderr``, ``error``, ``seconds``), so the last line names the snippet
that hung if the runner is killed."""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import signal
import sys
import time
import traceback
from types import FrameType

TIMEOUT = 60  # seconds per snippet


class SnippetTimeout(Exception):
    pass


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise SnippetTimeout(f"the snippet ran longer than {TIMEOUT} s")


def _traceback(exc: BaseException, path: str) -> str:
    """The traceback from the snippet's own frames on (without the runner's and runpy's)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != path:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


def run(manifest: list[dict[str, str]], results: io.TextIOBase) -> None:
    signal.signal(signal.SIGALRM, _alarm)
    for entry in manifest:
        results.write(json.dumps({"id": entry["id"], "started": True}) + "\n")
        results.flush()
        out, err = io.StringIO(), io.StringIO()
        error = None
        started = time.monotonic()
        os.chdir(entry["dir"])
        sys.path[0] = entry["dir"]
        signal.alarm(TIMEOUT)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                runpy.run_path(os.path.join(entry["dir"], entry["file"]), run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                error = f"SystemExit({exc.code!r})"
        except BaseException as exc:
            error = _traceback(exc, os.path.join(entry["dir"], entry["file"]))
        finally:
            signal.alarm(0)
        results.write(
            json.dumps(
                {
                    "id": entry["id"],
                    "ok": error is None,
                    "stdout": out.getvalue(),
                    "stderr": err.getvalue(),
                    "error": error,
                    "seconds": round(time.monotonic() - started, 3),
                }
            )
            + "\n"
        )
        results.flush()


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        entries = json.load(f)
    with open(sys.argv[2], "w") as out_file:
        run(entries, out_file)
