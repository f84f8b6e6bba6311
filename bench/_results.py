"""What every bench entry point records around its figures: the machine, the load average at
start and end, the seconds taken; written as JSON under ``bench/results/`` (ignored by git)."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def start() -> dict[str, Any]:
    """A results document with the machine facts; ``finish`` completes and writes it."""
    return {
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "nproc": os.cpu_count(),
            "loadavg_at_start": os.getloadavg(),
        },
        "_t0": time.perf_counter(),
    }


def _cpu_times() -> tuple[int, int] | None:
    """All CPUs' (idle, total) jiffies since boot (Linux ``/proc/stat``; ``None`` elsewhere).
    Time waiting on the disk counts as busy: another process's fsyncs slow ours down too."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[3], sum(fields[:8])  # idle; user .. steal (guests are inside user)


async def settle(
    max_wait_s: float = 20.0, busy_below: float = 0.15, window_s: float = 0.25
) -> dict[str, Any]:
    """Wait until the machine is quiet before a latency measurement: two windows in a row
    with the CPUs' busy share (iowait included) below ``busy_below``, ``max_wait_s`` at most.

    A latency measured while the previous phase's work still runs measures that work: after
    the throughput phase PostgreSQL's checkpointer and autovacuum keep a core busy for a few
    seconds. Returns the seconds waited, the last window's busy share and whether it settled
    (``False`` is printed as a warning by the caller); off Linux it returns at once."""
    t0 = time.perf_counter()
    before = _cpu_times()
    if before is None:
        return {"waited_s": 0.0, "busy": None, "settled": False}
    quiet = 0
    busy = 1.0
    while quiet < 2 and time.perf_counter() - t0 < max_wait_s:
        await asyncio.sleep(window_s)
        now = _cpu_times()
        assert now is not None
        total = now[1] - before[1]
        busy = 1 - (now[0] - before[0]) / total if total > 0 else 0.0
        quiet = quiet + 1 if busy < busy_below else 0
        before = now
    return {"waited_s": time.perf_counter() - t0, "busy": busy, "settled": quiet >= 2}


def finish(results: dict[str, Any], name: str) -> Path:
    """Stamp the seconds taken and the closing load average, write ``results/<name>``."""
    results["seconds"] = time.perf_counter() - results.pop("_t0")
    results["machine"]["loadavg_at_end"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(results, indent=2))
    print(f"results written to {path} ({results['seconds']:.0f} s)")
    return path
