"""Shared fixtures: one throwaway PostgreSQL server for the whole session."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

try:
    from pg import PostgresUnavailable, start_postgres
except ImportError:  # tests/ imported as a package
    from tests.pg import PostgresUnavailable, start_postgres


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A PostgreSQL server on a unix socket, started from the installed binaries and stopped
    after the session; skipped (or failed, with ``FLOWKIT_REQUIRE_POSTGRES=1``) when none can
    be started. Tests take a fresh database from it (``pg.fresh_database``)."""
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(start_postgres())
        except PostgresUnavailable as exc:
            if os.environ.get("FLOWKIT_REQUIRE_POSTGRES") == "1":
                pytest.fail(f"PostgreSQL required but unavailable: {exc}")
            pytest.skip(f"PostgreSQL unavailable: {exc}")
        yield url
