"""The dashboard's main flow in a real headless Chromium on PostgreSQL (the SQLite flow and
the rest: tests/test_ui_browser.py): real ``flowkit ui`` and ``flowkit worker`` processes on
a fresh database of the session's throwaway server; the runs page converges on the store, a
run opened by its link shows its timeline and lane, a cancel through the form settles live
and a new run appears live, without a reload."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ui_app
from browser_dom import (
    accept_confirm,
    attr,
    click,
    goto,
    lane_members,
    marker,
    one,
    page_counts,
    page_rows,
    set_marker,
    text,
    timeline,
    wait_live,
)
from browser_kit import (
    Dash,
    dashboard,
    keep,
    newest_first,
    start_all,
    store_counts,
    wait_for,
    with_engine,
)
from pg import fresh_database

pytestmark = [pytest.mark.browser, pytest.mark.postgres]

TOKEN = "browser-pg-token"


@pytest.fixture(scope="module")
def pg_dash(
    tmp_path_factory: pytest.TempPathFactory, chrome: Any, pg_server: str
) -> Iterator[Dash]:
    """``flowkit ui`` and ``flowkit worker`` on a seeded PostgreSQL database."""
    tmp = tmp_path_factory.mktemp("ui-pg")
    with dashboard(fresh_database(pg_server, "flowkit_ui"), tmp, TOKEN) as d:
        yield d


def status_is(status: str) -> Any:
    return lambda d: attr(d, "span#run-status", "data-status") == status


def test_main_flow_on_postgres(chrome: Any, pg_dash: Dash, tmp_path: Path) -> None:
    d = pg_dash
    goto(chrome, d.base, "/runs", TOKEN, "runs")
    wait_live(chrome)
    wait_for(chrome, lambda c: page_rows(c) == newest_first(d.runs()), "rows = store")
    wait_for(chrome, lambda c: page_counts(c) == store_counts(d.runs()), "counts = store")
    keep(chrome, tmp_path, "runs")

    # a new run appears live
    set_marker(chrome)
    (greet,) = with_engine(d.db, lambda e: start_all(e, [(ui_app.Greet, "pg")]))
    wait_for(chrome, lambda c: page_rows(c)[0] == (greet, "completed"), "the new run's row")
    assert marker(chrome) == 1

    # filter, then open the lane's first waiter by its link
    goto(chrome, d.base, "/runs?workflow=deploy", TOKEN, "runs")
    waiter = d.ids["prod-2"]
    click(chrome, f'tr.run[data-run-id="{waiter}"] a.run-link')
    wait_for(chrome, lambda c: text(c, "#run-id") == waiter, "the run page")
    assert lane_members(chrome) == [
        (d.ids["prod-1"], "holder", "0", False),
        (waiter, "waiter", "1", True),
        (d.ids["prod-3"], "waiter", "2", False),
    ]
    keep(chrome, tmp_path, "run-waiter")

    # the holder: its timeline, then cancel it through the form and watch it settle live
    holder = d.ids["prod-1"]
    goto(chrome, d.base, f"/runs/{holder}", TOKEN, "run")
    events = with_engine(d.db, lambda e: e.history(holder))
    assert [i["type"] for i in timeline(chrome)] == [ev.type for ev in events]
    assert json.loads(text(chrome, "#run-input pre")) == {"env": "prod", "version": "1.4.0"}
    one(chrome, "form#cancel-form button#cancel-button").click()
    accept_confirm(chrome)
    wait_for(chrome, lambda c: attr(c, "#flash", "data-kind") == "ok", "ok flash")
    wait_live(chrome)
    set_marker(chrome)
    wait_for(chrome, status_is("cancelled"), "the badge to turn cancelled")
    assert marker(chrome) == 1
    assert d.status(holder) == "cancelled"
    keep(chrome, tmp_path, "run-cancelled")

    # the lane moved up: the first waiter holds it now
    goto(chrome, d.base, "/lanes", TOKEN, "lanes")
    prod = 'table#lanes tr.lane[data-workflow="deploy"][data-key="env:prod"]'
    wait_for(
        chrome,
        lambda c: (text(c, f"{prod} td.holders"), text(c, f"{prod} td.depth")) == ("1", "1"),
        "one holder and one waiter left",
    )
    keep(chrome, tmp_path, "lanes")
