"""Run every benchmark; ``--smoke`` runs tiny sizes (CI keeps it from rotting).

Results are printed and written as JSON under bench/results/ (ignored by git)."""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import singleton_bench  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for CI")
    args = parser.parse_args()
    results = {
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "singleton": asyncio.run(singleton_bench.main(args.smoke)),
    }
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    name = "smoke.json" if args.smoke else "latest.json"
    (out / name).write_text(json.dumps(results, indent=2))
    print(f"results written to {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
