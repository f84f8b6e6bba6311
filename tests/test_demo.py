"""`make demo` is the README's first command: run it the way a newcomer would."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_demo_runs_and_reports_one_run_per_lane() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "samples" / "demo.py"), "--fast"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "rejected A-5" in out
    assert "max concurrent runs per key: 1" in out
    for ev in ("singleton_gated", "singleton_admitted", "singleton_released", "run_completed"):
        assert ev in out
