"""Running the ``flowkit`` command in a child process, as a user would, for the CLI tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def flowkit(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m flowkit.cli ARGS`` in ``tmp``, with this checkout's flowkit (not the one the
    virtualenv has installed), piped output 200 columns wide."""
    return subprocess.run(
        [sys.executable, "-m", "flowkit.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "PYTHONPATH": f"{tmp}{os.pathsep}{ROOT}"},
    )
