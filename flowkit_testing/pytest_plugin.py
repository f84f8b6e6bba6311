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

``flowkit_env`` is an async fixture run by pytest-asyncio. Under pytest-asyncio's default
strict mode, which only runs async tests marked ``@pytest.mark.asyncio``, the plugin itself
marks the async tests that request ``flowkit_env`` or use flowkit in their body (``TestEnv``,
an ``Engine``, the conformance kit...), so they run without any configuration. Another async
test that nothing runs fails with a message naming exactly what to add (``asyncio_mode =
"auto"`` in the project's pytest configuration, or the marker) instead of pytest's generic
"install a suitable plugin"."""

from __future__ import annotations

import inspect
import sys
import tomllib
import types
from collections.abc import AsyncIterator, Callable, Generator, Iterator
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


# Markers by which a test says which async framework runs it: flowkit leaves those alone.
_FRAMEWORK_MARKERS = frozenset({"asyncio", "anyio", "trio"})
# The start of pytest's own failure for an async test that no plugin ran.
_PYTEST_ASYNC_FAIL = "async def functions are not natively supported"


def _asyncio_mode(config: pytest.Config) -> str | None:
    """pytest-asyncio's mode (``"strict"``, its default, or ``"auto"``); ``None`` when
    pytest-asyncio is not active."""
    if not config.pluginmanager.hasplugin("asyncio"):
        return None
    mode = config.getoption("asyncio_mode", None) or config.getini("asyncio_mode")
    return str(mode or "strict")


def _async_test_function(obj: Any) -> Any:
    """The coroutine function a test item would run (through hypothesis' ``@given`` too), or
    ``None`` for anything else."""
    inner = getattr(getattr(obj, "hypothesis", None), "inner_test", None)
    for func in (obj, inner):
        if inspect.iscoroutinefunction(func):
            return func
    return None


def _names(code: types.CodeType) -> set[str]:
    """The global and attribute names a function's code (nested functions included) uses."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _is_flowkit_module(name: str) -> bool:
    return name.partition(".")[0] in ("flowkit", "flowkit_testing")


def _is_flowkit_object(name: str, value: Any) -> bool:
    """Whether ``value``, bound to ``name`` where a test can see it, comes from flowkit: one of
    its modules, a class derived from one of its classes (``TestEnv``, a store...), or an object
    a flowkit module holds under the same name (functions, constants such as ``CHECKS``)."""
    if isinstance(value, types.ModuleType):
        return _is_flowkit_module(value.__name__)
    if isinstance(value, type) and any(
        _is_flowkit_module(getattr(cls, "__module__", "")) for cls in value.__mro__
    ):
        return True
    if value is None or isinstance(value, (str, int, float, bool)):
        return False  # too common to tell where it came from
    return any(
        _is_flowkit_module(module_name) and getattr(module, name, None) is value
        for module_name, module in list(sys.modules.items())
    )


def _uses_flowkit(func: Any, depth: int = 3, seen: set[int] | None = None) -> bool:
    """Whether the body of ``func`` (nested functions included) uses anything from flowkit or
    flowkit_testing, imported at module level or in the body, directly or through functions of
    its own module that it calls (``depth`` levels deep). flowkit runs on asyncio only, so such
    a test can only be meant for pytest-asyncio."""
    code = getattr(func, "__code__", None)
    seen = set() if seen is None else seen
    if code is None or id(code) in seen:
        return False
    seen.add(id(code))
    names = _names(code)
    scope = getattr(func, "__globals__", {})
    if any(_is_flowkit_module(name) and name in sys.modules for name in names):
        return True  # ``import flowkit...`` / ``from flowkit... import`` in the body
    values = [(name, scope[name]) for name in names if name in scope]
    if any(_is_flowkit_object(name, value) for name, value in values):
        return True
    return depth > 0 and any(
        _uses_flowkit(value, depth - 1, seen)
        for _, value in values
        if isinstance(value, types.FunctionType) and value.__module__ == func.__module__
    )


def _requested_fixtures(collector: pytest.Collector, obj: Any) -> set[str]:
    """Fixtures a test function asks for by parameter or by ``usefixtures``."""
    try:
        names = set(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        names = set()
    marks = [*getattr(obj, "pytestmark", []), *collector.iter_markers("usefixtures")]
    for mark in marks:
        if getattr(mark, "name", None) == "usefixtures":
            names.update(str(arg) for arg in mark.args)
    return names


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> None:
    """Mark the async tests that request ``flowkit_env`` or use flowkit in their body (a
    ``TestEnv``, an ``Engine``, the conformance kit...) with ``@pytest.mark.asyncio`` when
    pytest-asyncio is in strict mode, before it collects them: they can only run on asyncio,
    so they should not need any configuration."""
    if _asyncio_mode(collector.config) != "strict":
        return  # auto mode marks every async test; without pytest-asyncio nothing can run it
    func = _async_test_function(obj)
    if func is None or not isinstance(collector, (pytest.Module, pytest.Class)):
        return
    if not collector.istestfunction(obj, name):
        return
    own = {getattr(mark, "name", None) for mark in getattr(obj, "pytestmark", [])}
    inherited = {mark.name for mark in collector.iter_markers()}
    if (own | inherited) & _FRAMEWORK_MARKERS:
        return  # the test (or its class or module) already says who runs it
    if "flowkit_env" in _requested_fixtures(collector, obj) or _uses_flowkit(func):
        pytest.mark.asyncio(obj)


def _pyproject_table(path: Path) -> str:
    """The table a ``pyproject.toml`` keeps pytest's settings in: ``[tool.pytest]`` when it
    already uses pytest 9's native form (the two cannot be mixed), else the classic one."""
    try:
        with path.open("rb") as f:
            tool = tomllib.load(f).get("tool", {}).get("pytest", {})
    except (OSError, tomllib.TOMLDecodeError):
        tool = {}
    native = isinstance(tool, dict) and any(key != "ini_options" for key in tool)
    return "[tool.pytest]" if native else "[tool.pytest.ini_options]"


def _async_config_help(item: pytest.Function) -> str:
    """What exactly to add so that pytest-asyncio runs ``item``, for its project's config."""
    inipath = item.config.inipath
    if inipath is None:
        where, setting = "pyproject.toml", '[tool.pytest.ini_options]\n    asyncio_mode = "auto"'
    elif inipath.name == "pyproject.toml":
        where, setting = str(inipath), f'{_pyproject_table(inipath)}\n    asyncio_mode = "auto"'
    elif inipath.suffix == ".toml":
        where, setting = str(inipath), '[pytest]\n    asyncio_mode = "auto"'
    elif inipath.name == "setup.cfg":
        where, setting = str(inipath), "[tool:pytest]\n    asyncio_mode = auto"
    else:
        where, setting = str(inipath), "[pytest]\n    asyncio_mode = auto"
    run_them = (
        f"To run every async test with pytest-asyncio, add to {where}:\n\n    {setting}\n\n"
        f"or mark this test with @pytest.mark.asyncio."
    )
    if _asyncio_mode(item.config) is None:
        return (
            f"{item.nodeid} is an async test and no plugin ran it. flowkit's tests run on "
            f"pytest-asyncio: install it (pip install pytest-asyncio, or flowkit's test extra). "
            f"Tests that use flowkit_env or flowkit then run without configuration. {run_them}"
        )
    return (
        f"{item.nodeid} is an async test and no plugin ran it: pytest-asyncio is installed, "
        f"but in strict mode (its default) it only runs async tests marked "
        f"@pytest.mark.asyncio (flowkit marks the tests that use flowkit_env or flowkit "
        f"itself). {run_them}"
    )


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """Replace pytest's generic failure for an async test that no plugin ran with one that
    names the setting (or marker) to add."""
    try:
        return (yield)
    except pytest.fail.Exception as exc:
        own = {mark.name for mark in pyfuncitem.iter_markers()}
        if not str(exc.msg).startswith(_PYTEST_ASYNC_FAIL) or own & {"anyio", "trio"}:
            raise
        raise pytest.fail.Exception(_async_config_help(pyfuncitem), pytrace=False) from None


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
