"""flowkit's pytest plugin in a fresh project, where pytest-asyncio runs in its default strict
mode: async tests that use ``flowkit_env`` or flowkit (``TestEnv``...) run without any
configuration, and any other async test that nothing runs fails with a message that says
exactly what to add.

Each generated project has no pytest configuration of its own (or only the file named by the
test); every run asserts pytest-asyncio's header line, so the repository's own
``asyncio_mode = "auto"`` cannot leak in unnoticed."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
# Every inner run: no cache directory, and without pytest-asyncio's own advice to a project with
# no configuration (a deprecation warning about its fixture loop scope, not about flowkit).
ARGS = (
    "-p",
    "no:cacheprovider",
    "-W",
    "ignore:The configuration option:pytest.PytestDeprecationWarning",
)


# pytest 9 reads native TOML settings: [tool.pytest] in pyproject.toml, [pytest] in pytest.toml.
PYTEST_9 = pytest.mark.skipif(
    int(pytest.__version__.split(".")[0]) < 9, reason="native TOML configuration is pytest 9's"
)


def assert_mode(result: pytest.RunResult, mode: str) -> None:
    """The run used pytest-asyncio in ``mode`` (its header: ``mode=strict`` or
    ``mode=Mode.STRICT``, depending on the version)."""
    header = [line for line in result.outlines if line.startswith("asyncio: mode=")]
    assert header, result.stdout.str()
    assert header[0].lower().startswith((f"asyncio: mode={mode},", f"asyncio: mode=mode.{mode},"))


# docs/testing.md, "The pytest plugin", as a user would paste it into a fresh project.
PLUGIN_EXAMPLE = """
import pytest

from flowkit import RunStatus, WorkflowCtx, workflow


@workflow(name="reminder")
class Reminder:
    async def run(self, ctx: WorkflowCtx, days: int) -> str:
        await ctx.sleep(days * 86400)
        return "ping"


@pytest.mark.flowkit(workflows=[Reminder()], seed=3)
async def test_reminder_waits_the_whole_month(flowkit_env):
    await flowkit_env.start("reminder", 30, "r1")
    await flowkit_env.advance(30 * 86400 - 1)
    assert (await flowkit_env.get_run("r1")).status is RunStatus.SUSPENDED
    await flowkit_env.advance(1)
    assert await flowkit_env.result("r1") == "ping"


@pytest.mark.flowkit(workflows=[Reminder()], store="sqlite")
async def test_reminder_on_a_sqlite_file(flowkit_env, flowkit_clock):
    started = flowkit_clock.now()  # the env's clock
    await flowkit_env.start("reminder", 2, "r1")
    assert await flowkit_env.result("r1") == "ping"
    assert flowkit_clock.now() - started == 2 * 86400


@pytest.fixture
def flowkit_workflows():
    return [Reminder()]  # used by the tests below that have no marker


async def test_reminder_with_default_workflows(flowkit_env):
    run = await flowkit_env.start("reminder", 1)
    assert await flowkit_env.result(run.id) == "ping"


class TestInAClass:
    async def test_a_method(self, flowkit_env):
        run = await flowkit_env.start("reminder", 2)
        assert await flowkit_env.result(run.id) == "ping"


@pytest.mark.usefixtures("flowkit_env")
async def test_through_usefixtures(request):
    env = request.getfixturevalue("flowkit_env")
    assert (await env.start("reminder", 1)).workflow == "reminder"
"""

# Tests that use flowkit in their body: TestEnv under every name it can be reached by, an
# Engine, the conformance kit.
TESTENV_TESTS = """
import flowkit_testing
import pytest
from hypothesis import given, settings, strategies as st

from flowkit import Engine, WorkflowCtx, workflow
from flowkit.stores import MemoryStore
from flowkit_testing import TestEnv
from flowkit_testing import TestEnv as Env
from flowkit_testing.conformance import CHECKS


@workflow(name="double")
class Double:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        return 2 * n


async def test_testenv():  # docs/testing.md: a month-long trial, tested in milliseconds
    async with TestEnv([Double()]) as env:
        await env.start("double", 2, "d")
        assert await env.result("d") == 4


async def test_an_alias():
    async with Env([Double()]) as env:
        assert (await env.start("double", 1)).workflow == "double"


async def test_through_the_package():
    async with flowkit_testing.TestEnv([Double()]) as env:
        assert env.engines


async def test_imported_in_the_body():
    from flowkit_testing import TestEnv

    async with TestEnv([Double()]) as env:
        assert env.engines


class MyEnv(TestEnv):
    pass


async def test_a_subclass():
    async with MyEnv([Double()]) as env:
        assert env.engines


async def test_in_a_nested_helper():
    async def run(n):
        async with TestEnv([Double()]) as env:
            await env.start("double", n, "d")
            return await env.result("d")

    assert await run(5) == 10


@settings(max_examples=3, deadline=None)
@given(n=st.integers(0, 9))
async def test_with_hypothesis(n):  # docs/simulation.md: searching with Hypothesis
    async with TestEnv([Double()], seed=n) as env:
        await env.start("double", n, "d")
        assert await env.result("d") == 2 * n


async def run_double(n):  # a helper of the test module
    async with TestEnv([Double()]) as env:
        await env.start("double", n, "d")
        return await env.result("d")


async def test_through_a_helper():
    assert await run_double(4) == 8


async def test_an_engine():
    async with Engine(MemoryStore(), [Double()]) as engine:
        await engine.start("double", 3, "d")
        assert await engine.result("d", timeout=5) == 6


async def test_the_conformance_kit():  # docs/testing.md: one test per check
    await CHECKS["create_run_idempotent"].run(MemoryStore, None)


async def test_flowkit_imported_in_the_body():
    import flowkit.stores

    assert await flowkit.stores.MemoryStore().list_runs() == []


@pytest.mark.asyncio(loop_scope="module")
async def test_an_explicit_marker_is_kept():
    async with TestEnv([Double()]) as env:
        assert env.engines
"""

OTHER_ASYNC_TEST = """
import asyncio


async def test_not_flowkit():
    await asyncio.sleep(0)
"""


def test_documented_plugin_example_runs_in_strict_mode(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_reminders=PLUGIN_EXAMPLE)
    result = pytester.runpytest(*ARGS)
    assert_mode(result, "strict")
    result.assert_outcomes(passed=5)


def test_tests_that_use_flowkit_run_in_strict_mode(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_envs=TESTENV_TESTS)
    result = pytester.runpytest(*ARGS)
    assert_mode(result, "strict")
    result.assert_outcomes(passed=12)


def test_in_a_fresh_interpreter(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin is loaded through its ``pytest11`` entry point, as in a user's project (from
    this checkout, not from wherever flowkit happens to be installed)."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    pytester.makepyfile(test_reminders=PLUGIN_EXAMPLE, test_envs=TESTENV_TESTS)
    result = pytester.runpytest_subprocess(*ARGS)
    assert_mode(result, "strict")
    result.assert_outcomes(passed=17)


@pytest.mark.parametrize(
    ("config", "content", "advice"),
    [
        (
            None,
            "",
            [
                "* add to pyproject.toml:",
                "    [[]tool.pytest.ini_options]",
                '    asyncio_mode = "auto"',
            ],
        ),
        (
            "pyproject.toml",
            "[tool.pytest.ini_options]\nxfail_strict = true\n",
            [
                "* add to /*/pyproject.toml:",
                "    [[]tool.pytest.ini_options]",
                '    asyncio_mode = "auto"',
            ],
        ),
        pytest.param(
            "pyproject.toml",
            "[tool.pytest]\nxfail_strict = true\n",
            ["* add to /*/pyproject.toml:", "    [[]tool.pytest]", '    asyncio_mode = "auto"'],
            marks=PYTEST_9,
        ),
        pytest.param(
            "pytest.toml",
            "[pytest]\nxfail_strict = true\n",
            ["* add to /*/pytest.toml:", "    [[]pytest]", '    asyncio_mode = "auto"'],
            marks=PYTEST_9,
        ),
        (
            "pytest.ini",
            "[pytest]\n",
            ["* add to /*/pytest.ini:", "    [[]pytest]", "    asyncio_mode = auto"],
        ),
        (
            "tox.ini",
            "[pytest]\n",
            ["* add to /*/tox.ini:", "    [[]pytest]", "    asyncio_mode = auto"],
        ),
        (
            "setup.cfg",
            "[tool:pytest]\n",
            ["* add to /*/setup.cfg:", "    [[]tool:pytest]", "    asyncio_mode = auto"],
        ),
    ],
    ids=[
        "no-config",
        "pyproject",
        "pyproject-native",
        "pytest.toml",
        "pytest.ini",
        "tox.ini",
        "setup.cfg",
    ],
)
def test_another_async_test_fails_with_what_to_add(
    pytester: pytest.Pytester, config: str | None, content: str, advice: list[str]
) -> None:
    if config is not None:
        pytester.makefile(config[config.index(".") :], **{config[: config.index(".")]: content})
    pytester.makepyfile(test_other=OTHER_ASYNC_TEST)
    result = pytester.runpytest(*ARGS)
    assert_mode(result, "strict")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "test_other.py::test_not_flowkit is an async test and no plugin ran it: "
            "pytest-asyncio is installed, but in strict mode (its default) it only runs async "
            "tests marked @pytest.mark.asyncio (flowkit marks the tests that use flowkit_env "
            "or flowkit itself). To run every async test with pytest-asyncio," + advice[0],
            *advice[1:],
            "or mark this test with @pytest.mark.asyncio.",
        ]
    )
    result.stdout.no_fnmatch_line("*install a suitable plugin*")


def test_without_pytest_asyncio_the_message_says_to_install_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_envs=TESTENV_TESTS.split("@settings")[0])
    result = pytester.runpytest(*ARGS, "-p", "no:asyncio")
    result.assert_outcomes(failed=6)
    result.stdout.fnmatch_lines(
        [
            "*test_envs.py::test_testenv is an async test and no plugin ran it. flowkit's tests "
            "run on pytest-asyncio: install it (pip install pytest-asyncio*"
        ]
    )


def test_other_frameworks_and_modes_are_left_alone(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'anyio: run with anyio')\n"
    )
    pytester.makepyfile(
        test_frameworks="""
import pytest
from flowkit_testing import TestEnv


@pytest.mark.anyio
async def test_left_to_anyio():
    async with TestEnv([]) as env:
        pass


def test_an_ordinary_failure_keeps_its_message():
    pytest.fail("my own message")
"""
    )
    # (anyio's own pytest plugin, installed with the dashboard's extras, would run the anyio
    # test on asyncio and trio: this models a framework flowkit knows nothing of)
    result = pytester.runpytest(*ARGS, "-p", "no:anyio")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*install a suitable plugin*", "*my own message*"])
    result.stdout.no_fnmatch_line("*no plugin ran it*")

    # auto mode runs everything itself, with or without flowkit
    pytester.makeini("[pytest]\nasyncio_mode = auto\n")
    pytester.makepyfile(test_other=OTHER_ASYNC_TEST, test_reminders=PLUGIN_EXAMPLE)
    result = pytester.runpytest(*ARGS, "test_other.py", "test_reminders.py")
    assert_mode(result, "auto")
    result.assert_outcomes(passed=6)
