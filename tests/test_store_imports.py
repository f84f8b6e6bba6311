"""What importing flowkit costs: SQLAlchemy loads only with the SQL store, and the store names
stay importable (and typed) from ``flowkit.stores``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("module", ["flowkit", "flowkit_testing", "flowkit.stores"])
def test_importing_does_not_import_sqlalchemy(module: str) -> None:
    done = _fresh(f"import {module}, sys; assert 'sqlalchemy' not in sys.modules, {module!r}")
    assert done.returncode == 0, done.stderr


def test_the_store_names_load_on_first_use() -> None:
    done = _fresh(
        "import sys\n"
        "from flowkit.stores import AESGCMCodec, CodecStore, MemoryStore, SqlStore\n"
        "import flowkit.stores as s\n"
        "assert 'sqlalchemy' in sys.modules\n"
        "assert SqlStore.__name__ == 'SqlStore' and CodecStore.__name__ == 'CodecStore'\n"
        "assert {'SqlStore', 'CodecStore', 'AESGCMCodec'} <= set(dir(s))\n"
        "try:\n"
        "    s.NoSuchStore\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('no error')\n"
    )
    assert done.returncode == 0, done.stderr


def test_store_errors_keep_their_old_import_paths() -> None:
    from flowkit import errors
    from flowkit.stores import CodecError, ConflictError
    from flowkit.stores.base import ConflictError as BaseConflict
    from flowkit.stores.codec import CodecError as CodecCodecError
    from flowkit.stores.sql import (
        SchemaVersionError,
        StoreUnavailableError,
        UnsupportedDatabaseError,
    )

    assert ConflictError is BaseConflict is errors.ConflictError
    assert CodecError is CodecCodecError is errors.CodecError
    assert SchemaVersionError is errors.SchemaVersionError
    assert StoreUnavailableError is errors.StoreUnavailableError
    assert UnsupportedDatabaseError is errors.UnsupportedDatabaseError
