"""The dashboard (``flowkit ui``, DESIGN §12) in a real headless Chromium driven by Selenium,
against a real ``flowkit ui`` process and a real ``flowkit worker`` process (tests/ui_app.py)
on a SQLite file: the runs page (counts, rows, filters), a run (timeline, lane, parent and
children), the lanes page, live updates without a reload (a cancel settling, a new run, a lane
moving), cancel and signal through the action forms, escaping of ``<script>`` in the browser,
read-only mode and the login form. The DOM they drive: /work/wt/UI_DOM.md (docs/ui.md).

Every test keeps PNG screenshots of the pages it looked at under its tmp dir; with
``FLOWKIT_UPDATE_SCREENSHOTS=1`` the runs, run and lanes pages are also written to
docs/images/ui-*.png. The same main flow on PostgreSQL: tests/test_ui_browser_pg.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ui_app
from browser_kit import (
    Dash,
    accept_confirm,
    css,
    dashboard,
    goto,
    keep,
    lane_members,
    marker,
    newest_first,
    no_alert,
    one,
    page_counts,
    page_rows,
    poll,
    row_cells,
    run_ui,
    set_marker,
    start_all,
    store_counts,
    wait_for,
    wait_live,
    with_engine,
)

from flowkit import Engine

pytestmark = pytest.mark.browser

TOKEN = "browser-test-token"


@pytest.fixture(scope="module")
def dash(tmp_path_factory: pytest.TempPathFactory, chrome: Any) -> Iterator[Dash]:
    """``flowkit ui`` and ``flowkit worker`` on a seeded SQLite file."""
    tmp = tmp_path_factory.mktemp("ui-sqlite")
    with dashboard(f"sqlite:///{tmp / 'ui.db'}", tmp, TOKEN) as d:
        yield d


def test_runs_page_shows_counts_and_rows_newest_first(
    chrome: Any, dash: Dash, tmp_path: Path
) -> None:
    goto(chrome, dash.base, "/", TOKEN, "runs")  # `/` redirects to /runs
    assert chrome.current_url == f"{dash.base}/runs"
    assert one(chrome, "body").get_attribute("data-read-only") == "false"
    wait_live(chrome)
    assert one(chrome, "span#live-status").text.strip() == "live"
    # the page converges on the store (live updates), whatever ran since the seed
    wait_for(chrome, lambda d: page_rows(d) == newest_first(dash.runs()), "rows = store")
    wait_for(chrome, lambda d: page_counts(d) == store_counts(dash.runs()), "counts = store")
    runs = {r.id: r for r in dash.runs()}
    rows = wait_for(chrome, lambda d: row_cells(d), "the rows")
    assert [r["id"] for r in rows] == [i for i, _ in newest_first(list(runs.values()))]
    for row in rows:
        run = runs[row["id"]]
        assert row["workflow"] == run.workflow
        assert "badge" in row["badge"] and f"status-{run.status}" in row["badge"]
        assert row["key"] == (run.singleton_key or "")
        assert row["href"] == f"{dash.base}/runs/{run.id}"
        assert row["iso"] and float(row["created"]) == pytest.approx(run.created_at, abs=1.0)
    # counts link to their status
    failed = one(chrome, '#counts a.count[data-status="failed"]')
    assert "status=failed" in failed.get_attribute("href")
    assert css(chrome, "#runs-empty") == []
    keep(chrome, tmp_path, "runs", "ui-runs")


def test_filters_by_workflow_and_status(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    from selenium.webdriver.support.ui import Select

    goto(chrome, dash.base, "/runs", TOKEN, "runs")
    form = one(chrome, "form#filters")
    one(form, "input[name=workflow]").send_keys("deploy")
    one(form, "button#apply-filters").click()
    wait_for(chrome, lambda d: "workflow=deploy" in d.current_url, "the workflow filter")
    deploys = [r for r in dash.runs() if r.workflow == "deploy"]
    wait_for(chrome, lambda d: page_rows(d) == newest_first(deploys), "deploy rows")
    assert {one(r, "td.workflow").text for r in css(chrome, "tr.run")} == {"deploy"}
    assert page_counts(chrome)["total"] == len(deploys)
    keep(chrome, tmp_path, "runs-deploy")

    # and by status: the workflow stays, the status narrows
    Select(one(chrome, "form#filters select[name=status]")).select_by_value("suspended")
    one(chrome, "button#apply-filters").click()
    wait_for(chrome, lambda d: "status=suspended" in d.current_url, "the status filter")
    want = [r for r in dash.runs() if r.workflow == "deploy" and r.status == "suspended"]
    wait_for(chrome, lambda d: page_rows(d) == newest_first(want), "suspended deploy rows")
    assert want and {s for _, s in page_rows(chrome)} == {"suspended"}

    # status alone, from a fresh form: only the failed charge
    one(chrome, "a#clear-filters").click()
    wait_for(chrome, lambda d: d.current_url.rstrip("/").endswith("/runs"), "cleared filters")
    Select(one(chrome, "form#filters select[name=status]")).select_by_value("failed")
    one(chrome, "button#apply-filters").click()
    failed = [r for r in dash.runs() if r.status == "failed"]
    wait_for(chrome, lambda d: page_rows(d) == newest_first(failed), "failed rows")
    assert dash.ids["charge"] in {i for i, _ in page_rows(chrome)}

    # a filter nothing matches: the empty state
    goto(chrome, dash.base, "/runs?workflow=no-such-workflow", TOKEN, "runs")
    assert "No runs match" in one(chrome, "#runs-empty").text
    assert page_rows(chrome) == []
    keep(chrome, tmp_path, "runs-empty")


def test_run_page_shows_timeline_and_lane(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    goto(chrome, dash.base, "/runs?workflow=deploy", TOKEN, "runs")
    waiter = dash.ids["prod-2"]
    one(chrome, f'tr.run[data-run-id="{waiter}"] a.run-link').click()
    wait_for(chrome, lambda d: d.current_url == f"{dash.base}/runs/{waiter}", "the run page")
    wait_for(chrome, lambda d: one(d, "#run-id").text == waiter, "the run id")
    run = dash.run(waiter)
    status = one(chrome, "span#run-status")
    assert status.get_attribute("data-status") == str(run.status)
    assert f"status-{run.status}" in status.get_attribute("class").split()
    assert one(chrome, "#run-workflow").text == "deploy"
    assert one(chrome, "#run-key").text == "env:prod"
    assert json.loads(one(chrome, "#run-input pre").text) == {"env": "prod", "version": "1.4.1"}
    # its lane: the holder, then the two waiters in FIFO order; this one is current
    lane = one(chrome, "section#lane")
    assert lane.get_attribute("data-workflow") == "deploy"
    assert lane.get_attribute("data-key") == "env:prod"
    assert lane_members(chrome) == [
        (dash.ids["prod-1"], "holder", "0", False),
        (waiter, "waiter", "1", True),
        (dash.ids["prod-3"], "waiter", "2", False),
    ]
    assert one(chrome, "span#lane-depth").text.strip() == "2"
    keep(chrome, tmp_path, "run-waiter", "ui-run")

    # the holder's timeline: the store's events, in order, times relative to the first
    holder = dash.ids["prod-1"]
    goto(chrome, dash.base, f"/runs/{holder}", TOKEN, "run")
    events = with_engine(dash.db, lambda e: e.history(holder))
    items = css(chrome, "ol#timeline li.event")
    assert [li.get_attribute("data-type") for li in items] == [ev.type for ev in events]
    assert [int(li.get_attribute("data-seq")) for li in items] == [ev.seq for ev in events]
    types = [one(li, "span.event-type").text for li in items]
    assert types[0] == "run_started" and "step_completed" in types
    assert one(items[0], "span.event-at").text == "+0.000s"
    step = items[types.index("step_completed")]
    assert "prepared prod" in one(step, "pre.event-body").text
    assert lane_members(chrome)[0] == (holder, "holder", "0", True)
    keep(chrome, tmp_path, "run-holder")

    # a parent links its child, and the child its parent
    order = dash.ids["order"]
    goto(chrome, dash.base, f"/runs/{order}", TOKEN, "run")
    assert css(chrome, "#lane-none") and not css(chrome, "section#lane")
    children = css(chrome, "ul#run-children li a")
    assert len(children) == 1
    child_id = f"{order}.child.1"
    assert children[0].get_attribute("href") == f"{dash.base}/runs/{child_id}"
    assert json.loads(one(chrome, "#run-output pre").text) == "order o-1042: parcel-o-1042"
    children[0].click()
    wait_for(chrome, lambda d: one(d, "#run-id").text == child_id, "the child's page")
    assert one(chrome, "#run-parent a").get_attribute("href") == f"{dash.base}/runs/{order}"
    keep(chrome, tmp_path, "run-child")

    # a failed run shows its error
    goto(chrome, dash.base, f"/runs/{dash.ids['charge']}", TOKEN, "run")
    assert "card declined for order 1042" in one(chrome, "#run-error pre").text


def test_lanes_page(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    goto(chrome, dash.base, "/lanes", TOKEN, "lanes")
    rows = {
        (r.get_attribute("data-workflow"), r.get_attribute("data-key")): r
        for r in css(chrome, "table#lanes tr.lane")
    }
    prod, staging = rows[("deploy", "env:prod")], rows[("deploy", "env:staging")]
    assert (one(prod, "td.holders").text, one(prod, "td.depth").text) == ("1", "2")
    assert (one(staging, "td.holders").text, one(staging, "td.depth").text) == ("1", "0")
    oldest = one(prod, "td.oldest-wait time")
    assert float(oldest.get_attribute("data-ts")) == pytest.approx(
        dash.run(dash.ids["prod-2"]).created_at, abs=1.0
    )
    assert one(staging, "td.oldest-wait").text.strip() == "—"
    assert css(chrome, "#lanes-empty") == []
    keep(chrome, tmp_path, "lanes", "ui-lanes")
    one(prod, "td.key a.lane-link").click()
    wait_for(chrome, lambda d: len(lane_members(d)) == 3, "the lane page")
    assert [(m[0], m[1], m[2]) for m in lane_members(chrome)] == [
        (dash.ids["prod-1"], "holder", "0"),
        (dash.ids["prod-2"], "waiter", "1"),
        (dash.ids["prod-3"], "waiter", "2"),
    ]
    keep(chrome, tmp_path, "lane")


def test_cancel_through_the_form_settles_live(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    """Cancel a lane's holder through ``form#cancel-form``: after the action's redirect its
    badge turns ``cancelled`` and, in another tab, its waiter becomes the holder, both by
    live updates (``window.__marker`` survives: no reload)."""
    ids = with_engine(
        dash.db,
        lambda e: start_all(e, [(ui_app.Deploy, {"env": "qa", "version": str(v)}) for v in (1, 2)]),
    )
    holder, waiter = ids
    poll(lambda: dash.run(holder).admitted and dash.status(holder) == "suspended", "qa holder")
    # the waiter's page in a second tab, watched live
    first = chrome.current_window_handle
    chrome.switch_to.new_window("tab")
    goto(chrome, dash.base, f"/runs/{waiter}", TOKEN, "run")
    wait_live(chrome)
    assert lane_members(chrome)[1] == (waiter, "waiter", "1", True)
    set_marker(chrome)
    second = chrome.current_window_handle
    chrome.switch_to.window(first)

    goto(chrome, dash.base, f"/runs/{holder}", TOKEN, "run")
    one(chrome, "form#cancel-form button#cancel-button").click()
    assert accept_confirm(chrome)
    wait_for(chrome, lambda d: css(d, "#flash"), "the action's flash")
    assert one(chrome, "#flash").get_attribute("data-kind") == "ok"
    wait_live(chrome)
    set_marker(chrome)
    wait_for(
        chrome,
        lambda d: one(d, "span#run-status").get_attribute("data-status") == "cancelled",
        "the badge to turn cancelled",
    )
    assert "status-cancelled" in one(chrome, "span#run-status").get_attribute("class").split()
    assert marker(chrome) == 1
    assert dash.status(holder) == "cancelled"
    keep(chrome, tmp_path, "run-cancelled")

    chrome.switch_to.window(second)
    wait_for(
        chrome,
        lambda d: lane_members(d) == [(waiter, "holder", "0", True)],
        "the waiter to become the holder",
    )
    assert marker(chrome) == 1
    assert int(one(chrome, "body").get_attribute("data-refreshed")) >= 1
    keep(chrome, tmp_path, "run-promoted")
    chrome.close()
    chrome.switch_to.window(first)
    with_engine(dash.db, lambda e: e.signal(waiter, "go"))


def test_status_changes_live_without_reload(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    """A cancel made elsewhere (an Engine in the test) turns the badge live."""
    (run_id,) = with_engine(dash.db, lambda e: start_all(e, [(ui_app.Approval, "live")]))
    poll(lambda: dash.status(run_id) == "suspended", "the approval to wait")
    goto(chrome, dash.base, f"/runs/{run_id}", TOKEN, "run")
    wait_live(chrome)
    assert one(chrome, "span#run-status").get_attribute("data-status") == "suspended"
    set_marker(chrome)
    with_engine(dash.db, lambda e: e.cancel(run_id))
    wait_for(
        chrome,
        lambda d: one(d, "span#run-status").get_attribute("data-status") == "cancelled",
        "the badge to turn cancelled",
    )
    assert marker(chrome) == 1
    assert [li.get_attribute("data-type") for li in css(chrome, "ol#timeline li.event")][-1] == (
        with_engine(dash.db, lambda e: e.history(run_id))[-1].type
    )
    keep(chrome, tmp_path, "run-cancelled-live")


def test_new_run_appears_live(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    goto(chrome, dash.base, "/runs", TOKEN, "runs")
    wait_live(chrome)
    wait_for(chrome, lambda d: page_rows(d) == newest_first(dash.runs()), "rows = store")
    before = page_counts(chrome)["total"]
    set_marker(chrome)
    (run_id,) = with_engine(dash.db, lambda e: start_all(e, [(ui_app.Greet, "live visitor")]))
    wait_for(chrome, lambda d: page_rows(d)[0] == (run_id, "completed"), "the new run's row")
    assert marker(chrome) == 1
    assert page_counts(chrome)["total"] == before + 1
    assert one(chrome, f'tr.run[data-run-id="{run_id}"] td.workflow').text == "greet"
    keep(chrome, tmp_path, "runs-new-run")


def test_signal_through_the_form(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    (run_id,) = with_engine(dash.db, lambda e: start_all(e, [(ui_app.Approval, "signal me")]))
    poll(lambda: dash.status(run_id) == "suspended", "the approval to wait")
    goto(chrome, dash.base, f"/runs/{run_id}", TOKEN, "run")
    form = one(chrome, "form#signal-form")
    # bad JSON: an error flash, nothing delivered
    one(form, "input[name=name]").clear()
    one(form, "input[name=name]").send_keys("approve")
    one(form, "textarea[name=payload]").clear()
    one(form, "textarea[name=payload]").send_keys("{not json")
    one(form, "button#signal-button").click()
    accept_confirm(chrome)
    wait_for(chrome, lambda d: css(d, "#flash"), "the error flash")
    assert one(chrome, "#flash").get_attribute("data-kind") == "error"
    assert dash.status(run_id) == "suspended"
    keep(chrome, tmp_path, "signal-bad-json")

    form = one(chrome, "form#signal-form")
    one(form, "input[name=name]").clear()
    one(form, "input[name=name]").send_keys("approve")
    one(form, "textarea[name=payload]").clear()
    one(form, "textarea[name=payload]").send_keys('{"approved": true, "by": "grace"}')
    one(form, "button#signal-button").click()
    accept_confirm(chrome)
    wait_for(chrome, lambda d: one(d, "#flash").get_attribute("data-kind") == "ok", "ok flash")
    wait_for(
        chrome,
        lambda d: one(d, "span#run-status").get_attribute("data-status") == "completed",
        "the signalled run to complete",
    )
    assert json.loads(one(chrome, "#run-output pre").text) == {"approved": True, "by": "grace"}
    types = [li.get_attribute("data-type") for li in css(chrome, "ol#timeline li.event")]
    assert "signal_received" in types
    assert with_engine(dash.db, lambda e: e.result(run_id)) == {"approved": True, "by": "grace"}
    keep(chrome, tmp_path, "signal-completed")


XSS = '<script>alert("xss")</script><img src=x onerror="alert(1)">'


def test_script_in_payloads_is_shown_literally(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    async def start(e: Engine) -> list[str]:
        charge = await e.start(ui_app.Charge, XSS, tags=[XSS], search={"customer": XSS})
        deploy = await e.start(ui_app.Deploy, {"env": XSS, "version": XSS})
        return [charge.id, deploy.id]

    charge, deploy = with_engine(dash.db, start)
    poll(lambda: dash.status(charge) == "failed", "the charge to fail")
    goto(chrome, dash.base, f"/runs/{charge}", TOKEN, "run")
    assert no_alert(chrome)
    assert json.loads(one(chrome, "#run-input pre").text) == XSS
    assert XSS in json.loads(one(chrome, "#run-error pre").text)["message"]
    assert [li.text for li in css(chrome, "ul#run-tags li.tag")] == [XSS]
    assert XSS in one(chrome, "#run-search").text
    assert css(chrome, "img[src=x]") == []
    assert all(s.get_attribute("src") for s in css(chrome, "script"))  # no inline script
    keep(chrome, tmp_path, "xss-run")

    key = f"env:{XSS}"
    goto(chrome, dash.base, f"/runs/{deploy}", TOKEN, "run")
    assert no_alert(chrome)
    assert one(chrome, "#run-key").text == key
    assert one(chrome, "section#lane").get_attribute("data-key") == key
    goto(chrome, dash.base, "/runs", TOKEN, "runs")
    assert no_alert(chrome)
    assert one(chrome, f'tr.run[data-run-id="{deploy}"] td.key').text == key
    goto(chrome, dash.base, "/lanes", TOKEN, "lanes")
    assert no_alert(chrome)
    links = [a.text for a in css(chrome, "table#lanes tr.lane td.key a.lane-link")]
    assert key in links
    assert css(chrome, "img[src=x]") == []
    keep(chrome, tmp_path, "xss-lanes")
    with_engine(dash.db, lambda e: e.cancel(deploy))


def test_read_only_shows_no_action_forms(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    with run_ui(dash.db, tmp_path, "read-only-token", "--read-only", name="ui-ro") as base:
        goto(chrome, base, f"/runs/{dash.ids['approval']}", "read-only-token", "run")
        assert one(chrome, "body").get_attribute("data-read-only") == "true"
        assert one(chrome, "#run-id").text == dash.ids["approval"]
        assert css(chrome, "section#actions") == []
        assert css(chrome, "form#cancel-form, form#retry-form, form#signal-form") == []
        assert [f for f in css(chrome, "form") if f.get_attribute("method") == "post"] == []
        keep(chrome, tmp_path, "read-only-run")
        goto(chrome, base, "/runs", "read-only-token", "runs")
        assert css(chrome, "form#filters")  # browsing still works
        assert [f for f in css(chrome, "form") if f.get_attribute("method") == "post"] == []


def test_login_form(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    chrome.delete_all_cookies()
    chrome.get(f"{dash.base}/lanes")
    form = one(chrome, "form#login")
    assert css(chrome, "table#lanes") == []
    keep(chrome, tmp_path, "login")
    one(form, "input[name=token]").send_keys(TOKEN)
    one(form, "button#login-button").click()
    wait_for(chrome, lambda d: one(d, "body").get_attribute("data-page") == "lanes", "lanes")
    assert "token=" not in chrome.current_url
    chrome.get(f"{dash.base}/runs")  # the cookie is kept
    assert one(chrome, "body").get_attribute("data-page") == "runs"
