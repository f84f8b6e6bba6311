"""Run every benchmark; ``--smoke`` runs tiny sizes (CI keeps it from rotting).

One throwaway PostgreSQL (tests/pg.py; skipped with a note when its binaries are missing) and
one temporary directory of SQLite files serve every bench (handover_bench also starts two worker
processes on them). Results are printed and written as JSON under bench/results/ (ignored by
git), with the seconds each bench took under ``bench_seconds``."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import _results
import browse_bench
import child_bench
import dbos_bench
import deepq_bench
import events_bench
import handover_bench
import idle_bench
import latency_bench
import lock_bench
import million_bench
import otel_bench
import replay_bench
import scaling_model
import schedule_bench
import search_bench
import singleton_bench
import store_bench
import sync_steps_bench
import timer_bench
import ui_bench
import workers_bench


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for CI")
    args = parser.parse_args()
    results = _results.start()
    m = results["machine"]
    print(f"python {m['python']} on {m['platform']}, nproc={m['nproc']}", end="")
    print(f", load average {os.getloadavg()[0]:.2f} (other work skews every figure)")
    with (
        tempfile.TemporaryDirectory(prefix="flowkit-bench-") as tmp,
        store_bench.postgres_server() as pg_url,
    ):
        stores = store_bench.admission_stores(Path(tmp), pg_url)
        benches: dict[str, Callable[[], Coroutine[Any, Any, dict[str, Any]]]] = {
            "singleton": lambda: singleton_bench.main(args.smoke, stores),
            "store": lambda: store_bench.main(args.smoke, pg_url, Path(tmp)),
            "handover_xproc": lambda: handover_bench.main(args.smoke, pg_url, Path(tmp)),
            "dbos": lambda: dbos_bench.main(args.smoke, pg_url, Path(tmp)),
            "replay": lambda: replay_bench.main(args.smoke),
            "sqlite_lock_wait": lambda: lock_bench.main(args.smoke, Path(tmp)),
            "timer_lateness": lambda: timer_bench.main(args.smoke, pg_url, Path(tmp)),
            "latency": lambda: latency_bench.main(args.smoke, pg_url),
            "sync_steps": lambda: sync_steps_bench.main(args.smoke),
            "children": lambda: child_bench.main(args.smoke, pg_url, Path(tmp)),
            "search": lambda: search_bench.main(args.smoke, pg_url, Path(tmp)),
            "events": lambda: events_bench.run_all(args.smoke, pg_url, Path(tmp)),
            "schedules": lambda: schedule_bench.run_all(args.smoke, Path(tmp)),
            "browse": lambda: browse_bench.main(args.smoke, pg_url, Path(tmp)),
            "otel": lambda: otel_bench.main(args.smoke, Path(tmp)),
            "ui_ttfb": lambda: ui_bench.main(args.smoke, pg_url, Path(tmp)),
            "deep_queues": lambda: deepq_bench.main(args.smoke, pg_url, Path(tmp)),
            "idle_engine": lambda: idle_bench.main(args.smoke, pg_url, Path(tmp)),
            "scaling_model": lambda: scaling_model.main(args.smoke),
            "workers": lambda: workers_bench.main(args.smoke, pg_url, Path(tmp)),
            "million_runs": lambda: million_bench.main(args.smoke, pg_url, Path(tmp)),
        }
        results["bench_seconds"] = {}
        for name, bench in benches.items():
            t = time.perf_counter()
            results[name] = asyncio.run(bench())
            results["bench_seconds"][name] = time.perf_counter() - t
    _results.finish(results, "smoke.json" if args.smoke else "latest.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
