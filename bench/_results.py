"""What every bench entry point records around its figures: the machine, the load average at
start and end, the seconds taken; written as JSON under ``bench/results/`` (ignored by git)."""

from __future__ import annotations

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


def finish(results: dict[str, Any], name: str) -> Path:
    """Stamp the seconds taken and the closing load average, write ``results/<name>``."""
    results["seconds"] = time.perf_counter() - results.pop("_t0")
    results["machine"]["loadavg_at_end"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(results, indent=2))
    print(f"results written to {path} ({results['seconds']:.0f} s)")
    return path
