"""flowkit's pytest plugin (``flowkit_testing.pytest_plugin``, a ``pytest11`` entry point),
tested with ``pytester``: small generated test files use the ``flowkit_env``,
``flowkit_store``, ``flowkit_clock`` and ``history_snapshot`` fixtures, the ``flowkit`` marker
and the ``--flowkit-store`` option; the outcomes are asserted."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

INI = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
{extra}
"""

WORKFLOWS = """
import pytest
from flowkit import RunStatus, Singleton, WorkflowCtx, workflow


@workflow(name="reminder")
class Reminder:
    async def run(self, ctx: WorkflowCtx, days: int) -> str:
        await ctx.sleep(days * 86400)
        return "ping"


@workflow(name="lane", singleton=Singleton(key=lambda i: "one"))
class Lane:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        await ctx.wait_for_signal("go")
        return n
"""


@pytest.fixture
def pt(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini(INI.format(extra=""))
    return pytester


def test_flowkit_env_with_the_marker_and_default_workflows(pt: pytest.Pytester) -> None:
    pt.makepyfile(
        WORKFLOWS
        + """

@pytest.mark.flowkit(workflows=[Reminder()], seed=3)
async def test_reminder_waits_the_whole_month(flowkit_env):
    assert flowkit_env.seed == 3 and len(flowkit_env.engines) == 1
    await flowkit_env.start("reminder", 30, "r1")
    await flowkit_env.advance(30 * 86400 - 1)
    assert (await flowkit_env.get_run("r1")).status is RunStatus.SUSPENDED
    await flowkit_env.advance(1)
    assert await flowkit_env.result("r1") == "ping"


@pytest.mark.flowkit(workflows=[Lane()], instances=3, lease_ttl=5)
async def test_testenv_options_pass_through(flowkit_env):
    assert len(flowkit_env.engines) == 3 and flowkit_env.lease_ttl == 5
    for i in range(3):
        await flowkit_env.start("lane", i, f"run-{i}")
    await flowkit_env.signal("run-0", "go")
    assert await flowkit_env.result("run-0") == 0
    assert (await flowkit_env.get_run("run-1")).admitted


@pytest.fixture
def flowkit_workflows():
    return [Reminder()]


async def test_default_workflows_come_from_the_fixture(flowkit_env):
    run = await flowkit_env.start("reminder", 1)
    assert await flowkit_env.result(run.id) == "ping"


async def test_every_test_gets_a_fresh_env(flowkit_env):
    assert await flowkit_env.store.list_runs() == []
"""
    )
    pt.runpytest().assert_outcomes(passed=4)


STORE_TESTS = (
    WORKFLOWS
    + """
import os
from pathlib import Path

from flowkit.stores import MemoryStore, SqlStore


@pytest.mark.flowkit(workflows=[Reminder()])
async def test_default_store(flowkit_env, flowkit_store, tmp_path):
    assert flowkit_env.store is flowkit_store
    assert type(flowkit_store).__name__ == os.environ["EXPECTED_STORE"]
    if isinstance(flowkit_store, SqlStore):
        assert flowkit_store.url == f"sqlite:///{tmp_path / 'flowkit.db'}"
    await flowkit_env.start("reminder", 2, "r1")
    assert await flowkit_env.result("r1") == "ping"
    if isinstance(flowkit_store, SqlStore):
        assert (tmp_path / "flowkit.db").stat().st_size > 0


@pytest.mark.flowkit(workflows=[Reminder()], store="sqlite")
async def test_marker_sqlite(flowkit_env, tmp_path):
    assert isinstance(flowkit_env.store, SqlStore)
    await flowkit_env.start("reminder", 1, "r1")
    assert await flowkit_env.result("r1") == "ping"
    assert (await flowkit_env.history("r1")).types[-1] == "run_completed"


@pytest.mark.flowkit(workflows=[Reminder()], store="memory")
async def test_marker_memory_beats_the_option(flowkit_env):
    assert isinstance(flowkit_env.store, MemoryStore)


class MyStore(MemoryStore):
    pass


@pytest.mark.flowkit(workflows=[Reminder()], store=MyStore)
async def test_marker_store_factory(flowkit_env):
    assert type(flowkit_env.store) is MyStore
    await flowkit_env.start("reminder", 1, "r1")
    assert await flowkit_env.result("r1") == "ping"
"""
)


@pytest.mark.parametrize(
    ("args", "ini", "expected"),
    [
        ((), "", "MemoryStore"),
        (("--flowkit-store=memory",), "", "MemoryStore"),
        (("--flowkit-store=sqlite",), "", "SqlStore"),
        ((), "flowkit_store = sqlite", "SqlStore"),
        (("--flowkit-store=memory",), "flowkit_store = sqlite", "MemoryStore"),
    ],
    ids=["default", "option-memory", "option-sqlite", "ini-sqlite", "option-beats-ini"],
)
def test_store_choice(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    ini: str,
    expected: str,
) -> None:
    pytester.makeini(INI.format(extra=ini))
    pytester.makepyfile(STORE_TESTS)
    monkeypatch.setenv("EXPECTED_STORE", expected)
    pytester.runpytest(*args).assert_outcomes(passed=4)


def test_bad_store_choices_are_usage_errors(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI.format(extra=""))
    pytester.makepyfile(
        """
import pytest

@pytest.mark.flowkit(store="postgres")
async def test_unknown_store(flowkit_env):
    pass
"""
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*flowkit(store=...) takes 'memory', 'sqlite'*"])
    result = pytester.runpytest("--flowkit-store=oracle")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--flowkit-store*invalid choice*oracle*"])
    pytester.makeini(INI.format(extra="flowkit_store = oracle"))
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*flowkit_store must be one of memory, sqlite*"])


def test_the_marker_is_registered(pt: pytest.Pytester) -> None:
    result = pt.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.flowkit(workflows=None, instances=1, seed=0, *"])
    pt.makepyfile(
        """
import pytest

@pytest.mark.flowkit(seed=1)
def test_marked():
    pass
"""
    )
    pt.runpytest("--strict-markers").assert_outcomes(passed=1)


def test_flowkit_clock(pt: pytest.Pytester) -> None:
    pt.makepyfile(
        WORKFLOWS
        + """
from datetime import UTC, datetime

from flowkit_testing import DEFAULT_START


def test_a_fresh_clock_without_env(flowkit_clock):
    assert flowkit_clock.now() == DEFAULT_START
    flowkit_clock.advance(5)
    assert flowkit_clock.now() == DEFAULT_START + 5


@pytest.mark.flowkit(start=datetime(2030, 1, 1, tzinfo=UTC))
def test_marker_start(flowkit_clock):
    assert flowkit_clock.now() == datetime(2030, 1, 1, tzinfo=UTC).timestamp()


@pytest.mark.flowkit(workflows=[Reminder()], start=1_000_000.0)
async def test_the_env_clock_when_both_are_used(flowkit_clock, flowkit_env):
    assert flowkit_clock is flowkit_env.clock
    assert flowkit_clock.now() == 1_000_000.0
    await flowkit_env.start("reminder", 1, "r1")
    await flowkit_env.advance(86400)
    assert flowkit_clock.now() == 1_000_000.0 + 86400
    assert await flowkit_env.result("r1") == "ping"


async def test_env_first_then_clock(flowkit_env, flowkit_clock):
    assert flowkit_clock is flowkit_env.clock
"""
    )
    pt.runpytest().assert_outcomes(passed=4)


SNAPSHOT_TEST = (
    WORKFLOWS
    + """

@pytest.mark.flowkit(workflows=[Reminder()])
async def test_golden(flowkit_env, history_snapshot):
    await flowkit_env.start("reminder", {days}, "r1")
    await flowkit_env.result("r1")
    assert history_snapshot == await flowkit_env.history("r1")
"""
)


def test_history_snapshot_fixture(pt: pytest.Pytester) -> None:
    pt.makepyfile(test_golden=SNAPSHOT_TEST.format(days=30))
    result = pt.runpytest("--snapshot-update")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*1 snapshot generated*"])
    golden = pt.path / "__snapshots__" / "test_golden" / "test_golden.json"
    text = golden.read_text()
    assert '    {"seq": 2, "type": "timer_started", "at": "t+0", "fire_at": "t+2592000"' in text
    assert text.count("\n") == 9  # {, run_id, "events": [, four events, ], }
    # the same history passes on every later run
    result = pt.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*1 snapshot passed*"])
    # a changed workflow changes the history: the comparison fails, with a diff
    pt.makepyfile(test_golden=SNAPSHOT_TEST.format(days=31))
    result = pt.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(['*+*"fire_at": "t+2678400"*', "*1 snapshot failed*"])
    assert golden.read_text() == text  # nothing rewritten without --snapshot-update


def test_subprocess_run_loads_the_plugin_from_its_entry_point(pt: pytest.Pytester) -> None:
    pt.makepyfile(
        WORKFLOWS
        + """

@pytest.mark.flowkit(workflows=[Reminder()], store="sqlite")
async def test_in_a_fresh_interpreter(flowkit_env):
    await flowkit_env.start("reminder", 3, "r1")
    assert await flowkit_env.result("r1") == "ping"
"""
    )
    result = pt.runpytest_subprocess("--flowkit-store=memory", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
