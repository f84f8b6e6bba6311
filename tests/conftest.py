"""Shared fixtures: one throwaway PostgreSQL server for the whole session, and the store
backends of the store tests (``store_kit``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from flowkit.stores import SqlStore
from flowkit_testing._netproxy import NetProxy

# Hypothesis profiles: "dev" (the default) explores new examples on every run; "ci" (set by
# .ci/run) is derandomized so a CI result is reproducible, with the same example budgets that
# each test declares for itself.
settings.register_profile("dev", deadline=None)
settings.register_profile(
    "ci", deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

try:
    from pg import GIB, fresh_database, memory_dir, socket_of
except ImportError:  # tests/ imported as a package
    from tests.pg import GIB, fresh_database, memory_dir, socket_of
try:
    from search_kit import FILLED, fill
except ImportError:  # tests/ imported as a package
    from tests.search_kit import FILLED, fill
try:
    from store_kit import PG, Backend, PostgresUnavailable, make_backend, start_postgres
except ImportError:  # tests/ imported as a package
    from tests.store_kit import PG, Backend, PostgresUnavailable, make_backend, start_postgres


def pytest_configure(config: pytest.Config) -> None:
    """``tmp_path`` directories go to a file system in memory (``pg.memory_dir``) unless
    ``--basetemp`` or ``PYTEST_DEBUG_TEMPROOT`` says where: the SQLite stores of the tests
    live there, and every commit's fsync on a disk makes them take twice as long. (The
    ``tmp_path_retention_policy`` of pyproject.toml keeps only failed tests' directories.)"""
    if config.option.basetemp or os.environ.get("PYTEST_DEBUG_TEMPROOT"):
        return
    root = memory_dir(2 * GIB)
    if root is not None:
        os.environ["PYTEST_DEBUG_TEMPROOT"] = root


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


@pytest.fixture(params=["memory", "sqlite", PG])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Each store in turn: MemoryStore, SqlStore on a SQLite file, on PostgreSQL."""
    b = make_backend(request.param, request, tmp_path)
    yield b
    b.close()


@pytest.fixture
def store(backend: Backend) -> object:
    """The store of ``backend`` (a test module may define its own ``store`` instead)."""
    return backend.store


@pytest.fixture(params=["sqlite", PG])
def sql_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """SqlStore on a SQLite file, then on PostgreSQL."""
    b = make_backend(request.param, request, tmp_path)
    yield b
    b.close()


@pytest.fixture(params=["sqlite", PG])
def gc_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """SqlStore with group commit on (SQLite, then PostgreSQL)."""
    b = make_backend(request.param, request, tmp_path, group_commit=True)
    yield b
    b.close()


@pytest.fixture(scope="session")
def filled_urls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The databases ``filled_store`` fills, by kind (filled once per session)."""
    return {}


@pytest.fixture(params=["sqlite", PG])
def filled_store(
    request: pytest.FixtureRequest,
    filled_urls: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SqlStore]:
    """SqlStore on a SQLite file, then on PostgreSQL, holding ``FILLED`` completed runs
    with their search rows (``search_kit.fill``), for the plan tests that READ many runs. The
    fill takes seconds, so each database is filled once per session and shared: a test
    using this fixture must not write to it. Each test gets its own store object."""
    kind = request.param
    if kind not in filled_urls:
        if kind == "sqlite":
            url = f"sqlite:///{tmp_path_factory.mktemp('filled') / 'flowkit.db'}"
        else:
            url = fresh_database(request.getfixturevalue("pg_server"), "flowkit_filled")
        first = SqlStore(url)
        try:
            fill(first, FILLED)
        finally:
            first.close()
        filled_urls[kind] = url
    store = SqlStore(filled_urls[kind])
    yield store
    store.close()


@pytest.fixture
def proxied(request: pytest.FixtureRequest) -> Iterator[tuple[NetProxy, str]]:
    """A fresh PostgreSQL database reached through a ``NetProxy`` (no delay): the proxy and
    the store URL."""
    server = request.getfixturevalue("pg_server")
    url = fresh_database(server)
    with NetProxy(socket_of(server)) as proxy:
        yield proxy, proxy.url_for(url)


@pytest.fixture(scope="session")
def chrome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One headless Chromium (Selenium 4, Debian's chromium + chromedriver) for the session's
    browser tests; skipped (or failed, with ``FLOWKIT_REQUIRE_BROWSER=1``) without them."""
    try:
        from browser_kit import BrowserUnavailable, new_driver
    except ImportError:  # tests/ imported as a package
        from tests.browser_kit import BrowserUnavailable, new_driver
    try:
        driver = new_driver(tmp_path_factory.mktemp("chrome") / "profile")
    except BrowserUnavailable as exc:
        if os.environ.get("FLOWKIT_REQUIRE_BROWSER") == "1":
            pytest.fail(f"a browser is required but unavailable: {exc}")
        pytest.skip(f"no browser: {exc}")
    try:
        yield driver
    finally:
        driver.quit()
