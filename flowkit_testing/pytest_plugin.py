"""pytest plugin (``pytest11`` entry point ``flowkit``): fixtures for testing workflows.

* ``flowkit_env``: a running ``TestEnv``, configured with the marker
  ``@pytest.mark.flowkit(workflows=[...], instances=1, seed=0, store="memory")`` (any other
  ``TestEnv`` keyword too); without ``workflows`` it registers the ``flowkit_workflows``
  fixture's list.
* ``flowkit_store``: the store ``flowkit_env`` runs on: the marker's ``store`` (``"memory"``,
  ``"sqlite"`` for a ``SqlStore`` on a file in ``tmp_path``, or a callable returning a store),
  else ``--flowkit-store=memory|sqlite``, else the ``flowkit_store`` ini value, else memory.
  Override it in a ``conftest.py`` to run every test on your own store.
* ``flowkit_clock``: the env's ``VirtualClock`` when the test also uses ``flowkit_env``,
  otherwise a fresh one (at the marker's ``start`` if given).
* ``history_snapshot``: syrupy's ``snapshot`` with ``HistorySnapshotExtension`` (golden
  histories; needs syrupy).

``flowkit_env`` is an async fixture: it needs pytest-asyncio (``asyncio_mode = "auto"``, or
``@pytest.mark.asyncio`` on the tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ._clock import DEFAULT_START, VirtualClock
from ._env import TestEnv

STORE_KINDS = ("memory", "sqlite")
_MARKER = (
    "flowkit(workflows=None, instances=1, seed=0, store=None, **testenv_options): configure "
    "the flowkit_env fixture; store is 'memory', 'sqlite' or a callable returning a store"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("flowkit", "flowkit workflow testing")
    group.addoption(
        "--flowkit-store",
        dest="flowkit_store",
        choices=STORE_KINDS,
        default=None,
        help="store of the flowkit_env fixture when the test's flowkit marker does not say: "
        "memory (a MemoryStore) or sqlite (a SqlStore on a file in tmp_path). "
        "Default: the flowkit_store ini value, else memory.",
    )
    parser.addini(
        "flowkit_store", "default store of the flowkit_env fixture: memory or sqlite", default=""
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _MARKER)
    _default_kind(config)  # a bad ini value is a usage error at startup, not in every test


def _default_kind(config: pytest.Config) -> str:
    kind = config.getoption("flowkit_store", None) or config.getini("flowkit_store") or "memory"
    if kind not in STORE_KINDS:
        raise pytest.UsageError(
            f"flowkit_store must be one of {', '.join(STORE_KINDS)}, not {kind!r}"
        )
    return str(kind)


def _marker_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker("flowkit")
    if marker is None:
        return {}
    if marker.args:
        raise pytest.UsageError("@pytest.mark.flowkit takes keyword arguments only")
    return dict(marker.kwargs)


def _close(store: Any) -> None:
    close = getattr(store, "close", None)
    if callable(close):
        close()


@pytest.fixture
def flowkit_workflows() -> list[Any]:
    """Workflows registered in ``flowkit_env``; override in a conftest or use the marker."""
    return []


@pytest.fixture
def flowkit_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The store ``flowkit_env`` runs on (see the module docstring for how it is chosen)."""
    choice: Any = _marker_options(request).get("store") or _default_kind(request.config)
    if callable(choice) and not isinstance(choice, str):
        factory: Callable[[], Any] = choice
        store = factory()
    elif choice == "memory":
        from flowkit.stores import MemoryStore

        store = MemoryStore()
    elif choice == "sqlite":
        from flowkit.stores import SqlStore

        tmp_path: Path = request.getfixturevalue("tmp_path")
        store = SqlStore(f"sqlite:///{tmp_path / 'flowkit.db'}")
    else:
        raise pytest.UsageError(
            f"@pytest.mark.flowkit(store=...) takes 'memory', 'sqlite' or a callable returning "
            f"a store, not {choice!r}"
        )
    yield store
    _close(store)


@pytest.fixture
def flowkit_clock(request: pytest.FixtureRequest) -> VirtualClock:
    """The ``VirtualClock`` of ``flowkit_env`` when the test uses it too, else a fresh one."""
    if "flowkit_env" in request.fixturenames:
        env: TestEnv = request.getfixturevalue("flowkit_env")
        return env.clock
    return VirtualClock(_marker_options(request).get("start", DEFAULT_START))


@pytest.fixture
def history_snapshot(request: pytest.FixtureRequest) -> Any:
    """syrupy's ``snapshot`` serializing flowkit histories with ``HistorySnapshotExtension``:
    ``assert history_snapshot == await env.history(run_id)``."""
    try:
        from ._snapshot import HistorySnapshotExtension
    except ImportError as exc:  # pragma: no cover - syrupy is part of the test extra
        pytest.fail(f"history_snapshot needs syrupy (pip install syrupy): {exc}", pytrace=False)
    snapshot = request.getfixturevalue("snapshot")
    return snapshot.use_extension(HistorySnapshotExtension)


try:
    import pytest_asyncio

    @pytest_asyncio.fixture
    async def flowkit_env(
        request: pytest.FixtureRequest, flowkit_workflows: list[Any], flowkit_store: Any
    ) -> AsyncIterator[TestEnv]:
        """A running ``TestEnv`` on ``flowkit_store`` with a ``VirtualClock``."""
        opts = _marker_options(request)
        opts.pop("store", None)
        workflows = opts.pop("workflows", None) or flowkit_workflows
        async with TestEnv(workflows, store=flowkit_store, **opts) as env:
            yield env

except ImportError:  # pragma: no cover - pytest-asyncio is part of the test extra

    @pytest.fixture
    def flowkit_env() -> None:
        """Needs pytest-asyncio."""
        pytest.fail("flowkit_env needs pytest-asyncio (pip install pytest-asyncio)", pytrace=False)
