"""Every sample runs as a user would run it (``python samples/<name>.py``) and says it worked.

``samples/demo.py`` is left to its own test: it is the interactive showcase behind
``make demo``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
SKIP = {"demo.py"}

# One line each sample prints only when it got all the way through.
EXPECTED = {
    "deploy_a_change.py": "ok: runs in flight kept the old branch, new runs took the patch",
    "order_saga.py": "ok: the failed shipment undid the payment, then the reservation",
    "meter_loop.py": "ok: every history stayed bounded and the slot stayed with the chain",
    "hourly_report.py": "ok: one run per hour, none twice, on three instances",
    "hello.py": "result: Receipt(order_id='o-42', charged_cents=1999, approved_by='alice')",
    "sync_inventory.py": "ok: no two syncs of one store overlapped",
    "approval.py": "ok: the rejected update wrote nothing, the valid one was answered",
    "order_events.py": "ok: each payment reached its order once, buffered or delivered",
}


def _samples() -> list[Path]:
    return sorted(p for p in SAMPLES.glob("*.py") if p.name not in SKIP)


def test_every_sample_has_an_expected_line() -> None:
    missing = [p.name for p in _samples() if p.name not in EXPECTED]
    assert not missing, f"add the line these samples print on success to EXPECTED: {missing}"


@pytest.mark.parametrize("sample", _samples(), ids=lambda p: p.name)
def test_sample_runs(sample: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(sample)],
        cwd=SAMPLES.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, output
    assert EXPECTED.get(sample.name, "\0") in proc.stdout, output
