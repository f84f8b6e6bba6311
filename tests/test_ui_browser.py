"""The dashboard (``flowkit ui``, docs/ui.md) in a real headless Chromium driven by Selenium,
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
from browser_dom import (
    accept_confirm,
    attr,
    click,
    css,
    goto,
    href,
    lane_members,
    marker,
    no_alert,
    one,
    page_counts,
    page_rows,
    row_cells,
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
    poll,
    run_ui,
    start_all,
    store_counts,
    wait_for,
    with_engine,
)

from flowkit import Engine
from flowkit.cli.ui._views import EVENT_PAGE

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
    assert attr(chrome, "body", "data-read-only") == "false"
    wait_live(chrome)
    assert text(chrome, "span#live-status").strip() == "live"
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
    assert "status=failed" in href(chrome, '#counts a.count[data-status="failed"]')
    assert css(chrome, "#runs-empty") == []
    keep(chrome, tmp_path, "runs", "ui-runs")


def test_filters_by_workflow_and_status(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    from selenium.webdriver.support.ui import Select

    goto(chrome, dash.base, "/runs", TOKEN, "runs")
    form = one(chrome, "form#filters")
    one(form, "input[name=workflow]").send_keys("deploy")
    one(form, "button#apply-filters").click()
    wait_for(chrome, lambda d: "workflow=deploy" in d.current_url, "the workflow filter")

    def deploys() -> list[tuple[str, str]]:
        return newest_first([r for r in dash.runs() if r.workflow == "deploy"])

    wait_for(chrome, lambda d: page_rows(d) == deploys(), "deploy rows")
    assert {r["workflow"] for r in row_cells(chrome)} == {"deploy"}
    wait_for(chrome, lambda d: page_counts(d)["total"] == len(deploys()), "deploy count")
    keep(chrome, tmp_path, "runs-deploy")

    # and by status: the workflow stays, the status narrows
    Select(one(chrome, "form#filters select[name=status]")).select_by_value("suspended")
    one(chrome, "button#apply-filters").click()
    wait_for(chrome, lambda d: "status=suspended" in d.current_url, "the status filter")

    def suspended() -> list[tuple[str, str]]:
        return newest_first(
            [r for r in dash.runs() if r.workflow == "deploy" and r.status == "suspended"]
        )

    rows = wait_for(
        chrome, lambda d: page_rows(d) == suspended() and page_rows(d), "suspended deploys"
    )
    assert {s for _, s in rows} == {"suspended"}

    # status alone, from a fresh form: only the failed charge
    one(chrome, "a#clear-filters").click()
    wait_for(chrome, lambda d: d.current_url.rstrip("/").endswith("/runs"), "cleared filters")
    Select(one(chrome, "form#filters select[name=status]")).select_by_value("failed")
    one(chrome, "button#apply-filters").click()

    def failed() -> list[tuple[str, str]]:
        return newest_first([r for r in dash.runs() if r.status == "failed"])

    rows = wait_for(chrome, lambda d: page_rows(d) == failed() and page_rows(d), "failed rows")
    assert dash.ids["charge"] in {i for i, _ in rows}

    # a filter nothing matches: the empty state
    goto(chrome, dash.base, "/runs?workflow=no-such-workflow", TOKEN, "runs")
    assert "No runs match" in text(chrome, "#runs-empty")
    assert page_rows(chrome) == []
    keep(chrome, tmp_path, "runs-empty")


def test_pages_of_runs(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    """``limit`` rows a page, ``a#next-page`` to older ones, ``a#first-page`` back."""
    goto(chrome, dash.base, "/runs?workflow=deploy&limit=2", TOKEN, "runs")

    def deploys() -> list[tuple[str, str]]:
        return newest_first([r for r in dash.runs() if r.workflow == "deploy"])

    first = wait_for(chrome, lambda d: page_rows(d) == deploys()[:2] and page_rows(d), "page 1")
    assert css(chrome, "a#first-page") == []
    click(chrome, "a#next-page")
    wait_for(chrome, lambda d: "before=" in d.current_url, "the next page")
    assert "workflow=deploy" in chrome.current_url
    wait_for(chrome, lambda d: page_rows(d) == deploys()[2:4], "page 2")
    assert not {i for i, _ in page_rows(chrome)} & {i for i, _ in first}
    keep(chrome, tmp_path, "runs-page-2")
    click(chrome, "a#first-page")
    wait_for(chrome, lambda d: page_rows(d) == deploys()[:2], "back to page 1")


def test_run_page_shows_timeline_and_lane(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    goto(chrome, dash.base, "/runs?workflow=deploy", TOKEN, "runs")
    waiter = dash.ids["prod-2"]
    click(chrome, f'tr.run[data-run-id="{waiter}"] a.run-link')
    wait_for(chrome, lambda d: d.current_url == f"{dash.base}/runs/{waiter}", "the run page")
    wait_for(chrome, lambda d: text(d, "#run-id") == waiter, "the run id")
    run = dash.run(waiter)
    assert attr(chrome, "span#run-status", "data-status") == str(run.status)
    assert f"status-{run.status}" in (attr(chrome, "span#run-status", "class") or "").split()
    assert text(chrome, "#run-workflow") == "deploy"
    assert text(chrome, "#run-key") == "env:prod"
    assert json.loads(text(chrome, "#run-input pre")) == {"env": "prod", "version": "1.4.1"}
    # its lane: the holder, then the two waiters in FIFO order; this one is current
    assert attr(chrome, "section#lane", "data-workflow") == "deploy"
    assert attr(chrome, "section#lane", "data-key") == "env:prod"
    assert lane_members(chrome) == [
        (dash.ids["prod-1"], "holder", "0", False),
        (waiter, "waiter", "1", True),
        (dash.ids["prod-3"], "waiter", "2", False),
    ]
    assert text(chrome, "span#lane-depth").strip() == "2"
    keep(chrome, tmp_path, "run-waiter", "ui-run")

    # the holder's timeline: the store's events, in order, times relative to the first
    holder = dash.ids["prod-1"]
    goto(chrome, dash.base, f"/runs/{holder}", TOKEN, "run")
    events = with_engine(dash.db, lambda e: e.history(holder))
    items = timeline(chrome)
    assert [(i["type"], i["seq"]) for i in items] == [(ev.type, ev.seq) for ev in events]
    types = [i["label"] for i in items]
    assert types[0] == "run_started" and "step_completed" in types
    assert items[0]["at"] == "+0.000s"
    assert all(i["at"].startswith("+") and i["at"].endswith("s") for i in items)
    assert "prepared prod" in items[types.index("step_completed")]["body"]
    # each event's time in the browser's time zone (app.js), to the millisecond
    local = chrome.execute_script(
        "return arguments[0].map(ts => { const d = new Date(ts * 1000);"
        " const p = (n, w) => String(n).padStart(w || 2, '0');"
        " return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}"
        ":${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`; });",
        [i["ts"] for i in items],
    )
    assert [i["time"] for i in items] == local and all(ev.at > 0 for ev in events)
    assert lane_members(chrome)[0] == (holder, "holder", "0", True)
    keep(chrome, tmp_path, "run-holder")

    # a parent links its child, and the child its parent
    order = dash.ids["order"]
    goto(chrome, dash.base, f"/runs/{order}", TOKEN, "run")
    assert css(chrome, "#lane-none") and not css(chrome, "section#lane")
    assert len(css(chrome, "ul#run-children li a")) == 1
    child_id = f"{order}.child.1"
    assert href(chrome, "ul#run-children li a") == f"{dash.base}/runs/{child_id}"
    assert json.loads(text(chrome, "#run-output pre")) == "order o-1042: parcel-o-1042"
    click(chrome, "ul#run-children li a")
    wait_for(chrome, lambda d: text(d, "#run-id") == child_id, "the child's page")
    assert href(chrome, "#run-parent a") == f"{dash.base}/runs/{order}"
    keep(chrome, tmp_path, "run-child")

    # a failed run shows its error
    goto(chrome, dash.base, f"/runs/{dash.ids['charge']}", TOKEN, "run")
    assert "card declined for order 1042" in text(chrome, "#run-error pre")


def test_lanes_page(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    goto(chrome, dash.base, "/lanes", TOKEN, "lanes")
    prod = 'table#lanes tr.lane[data-workflow="deploy"][data-key="env:prod"]'
    staging = 'table#lanes tr.lane[data-workflow="deploy"][data-key="env:staging"]'
    assert (text(chrome, f"{prod} td.holders"), text(chrome, f"{prod} td.depth")) == ("1", "2")
    assert (text(chrome, f"{staging} td.holders"), text(chrome, f"{staging} td.depth")) == (
        "1",
        "0",
    )
    assert float(attr(chrome, f"{prod} td.oldest-wait time", "data-ts") or 0) == pytest.approx(
        dash.run(dash.ids["prod-2"]).created_at, abs=1.0
    )
    assert text(chrome, f"{staging} td.oldest-wait") == "—"
    assert css(chrome, "#lanes-empty") == []
    keep(chrome, tmp_path, "lanes", "ui-lanes")
    click(chrome, f"{prod} td.key a.lane-link")
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
    assert attr(chrome, "#flash", "data-kind") == "ok"
    wait_live(chrome)
    set_marker(chrome)
    wait_for(
        chrome,
        lambda d: attr(d, "span#run-status", "data-status") == "cancelled",
        "the badge to turn cancelled",
    )
    assert "status-cancelled" in attr(chrome, "span#run-status", "class").split()
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
    assert int(attr(chrome, "body", "data-refreshed")) >= 1
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
    assert attr(chrome, "span#run-status", "data-status") == "suspended"
    set_marker(chrome)
    with_engine(dash.db, lambda e: e.cancel(run_id))
    wait_for(
        chrome,
        lambda d: attr(d, "span#run-status", "data-status") == "cancelled",
        "the badge to turn cancelled",
    )
    assert marker(chrome) == 1
    last = with_engine(dash.db, lambda e: e.history(run_id))[-1].type
    wait_for(chrome, lambda d: timeline(d)[-1]["type"] == last, "the last event on the timeline")
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
    assert text(chrome, f'tr.run[data-run-id="{run_id}"] td.workflow') == "greet"
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
    assert attr(chrome, "#flash", "data-kind") == "error"
    assert dash.status(run_id) == "suspended"
    keep(chrome, tmp_path, "signal-bad-json")

    form = one(chrome, "form#signal-form")
    one(form, "input[name=name]").clear()
    one(form, "input[name=name]").send_keys("approve")
    one(form, "textarea[name=payload]").clear()
    one(form, "textarea[name=payload]").send_keys('{"approved": true, "by": "grace"}')
    one(form, "button#signal-button").click()
    accept_confirm(chrome)
    wait_for(chrome, lambda d: attr(d, "#flash", "data-kind") == "ok", "ok flash")
    wait_for(
        chrome,
        lambda d: attr(d, "span#run-status", "data-status") == "completed",
        "the signalled run to complete",
    )
    assert json.loads(text(chrome, "#run-output pre")) == {"approved": True, "by": "grace"}
    types = [i["type"] for i in timeline(chrome)]
    assert "signal_received" in types
    assert with_engine(dash.db, lambda e: e.result(run_id)) == {"approved": True, "by": "grace"}
    keep(chrome, tmp_path, "signal-completed")


def test_retry_through_the_form(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    """Retry a failed run through ``form#retry-form``: a second attempt (which fails again).
    The form offers a new input without the workflow's code: the input schema its worker
    recorded checks it (docs/updates.md, "Callers without the code")."""
    (run_id,) = with_engine(dash.db, lambda e: start_all(e, [(ui_app.Charge, "order 7")]))
    poll(lambda: dash.status(run_id) == "failed", "the charge to fail")
    goto(chrome, dash.base, f"/runs/{run_id}", TOKEN, "run")
    assert text(chrome, "#run-attempt") == "1"
    assert css(chrome, "form#retry-form textarea") and not css(chrome, "#retry-same-input")

    def retry() -> None:
        form = one(chrome, "form#retry-form")
        one(form, "button#retry-button").click()
        accept_confirm(chrome)
        wait_for(chrome, lambda d: css(d, "#flash"), "the action's flash")

    retry()
    assert attr(chrome, "#flash", "data-kind") == "ok"
    wait_for(
        chrome,
        lambda d: (
            text(d, "#run-attempt") == "2" and attr(d, "span#run-status", "data-status") == "failed"
        ),
        "the second attempt to fail",
    )
    assert "card declined for order 7" in text(chrome, "#run-error pre")
    assert dash.run(run_id).attempt == 2
    keep(chrome, tmp_path, "retried")


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
    assert json.loads(text(chrome, "#run-input pre")) == XSS
    assert XSS in json.loads(text(chrome, "#run-error pre"))["message"]
    assert chrome.execute_script(
        "return [...document.querySelectorAll('ul#run-tags li.tag')].map(li => li.innerText);"
    ) == [XSS]
    assert json.dumps(XSS) in text(chrome, "#run-search")  # the value, as JSON text
    assert css(chrome, "img[src=x]") == []
    assert all(s.get_attribute("src") for s in css(chrome, "script"))  # no inline script
    keep(chrome, tmp_path, "xss-run")

    key = f"env:{XSS}"
    goto(chrome, dash.base, f"/runs/{deploy}", TOKEN, "run")
    assert no_alert(chrome)
    assert text(chrome, "#run-key") == key
    assert attr(chrome, "section#lane", "data-key") == key
    goto(chrome, dash.base, "/runs", TOKEN, "runs")
    assert no_alert(chrome)
    assert text(chrome, f'tr.run[data-run-id="{deploy}"] td.key') == key
    goto(chrome, dash.base, "/lanes", TOKEN, "lanes")
    assert no_alert(chrome)
    links = chrome.execute_script(
        "return [...document.querySelectorAll('table#lanes tr.lane td.key a.lane-link')]"
        ".map(a => a.innerText);"
    )
    assert key in links
    assert css(chrome, "img[src=x]") == []
    keep(chrome, tmp_path, "xss-lanes")
    with_engine(dash.db, lambda e: e.cancel(deploy))


def test_read_only_shows_no_action_forms(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    with run_ui(dash.db, tmp_path, "read-only-token", "--read-only", name="ui-ro") as base:
        goto(chrome, base, f"/runs/{dash.ids['approval']}", "read-only-token", "run")
        assert attr(chrome, "body", "data-read-only") == "true"
        assert text(chrome, "#run-id") == dash.ids["approval"]
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
    wait_for(chrome, lambda d: attr(d, "body", "data-page") == "lanes", "lanes")
    assert "token=" not in chrome.current_url
    chrome.get(f"{dash.base}/runs")  # the cookie is kept
    assert attr(chrome, "body", "data-page") == "runs"


def _events_of(dash: Dash, run_id: str) -> list[int]:
    return [ev.seq for ev in with_engine(dash.db, lambda e: e.history(run_id))]


def _waits_after(dash: Dash, run_id: str, steps: int) -> bool:
    """Whether the stepper made ``steps`` steps in all and waits for a signal again."""
    history = with_engine(dash.db, lambda e: e.history(run_id))
    done = sum(ev.type == "step_completed" for ev in history)
    return done == steps and bool(dash.run(run_id).waiting_signals)


def test_a_long_timeline_is_paged_and_grows_live(chrome: Any, dash: Dash, tmp_path: Path) -> None:
    """A run's page shows its newest ``EVENT_PAGE`` events with a link to earlier ones; new
    events are appended live (no reload: ``window.__marker`` survives); an earlier page says
    newer events exist instead of appending them; the actions follow the status live."""
    (run_id,) = with_engine(dash.db, lambda e: start_all(e, [(ui_app.Stepper, "s")]))
    poll(lambda: dash.status(run_id) == "suspended", "the stepper to wait")
    with_engine(dash.db, lambda e: e.signal(run_id, "more", EVENT_PAGE + 20))
    poll(lambda: _waits_after(dash, run_id, EVENT_PAGE + 20), "the steps")
    seqs = _events_of(dash, run_id)
    goto(chrome, dash.base, f"/runs/{run_id}", TOKEN, "run")
    wait_live(chrome)
    assert [i["seq"] for i in timeline(chrome)] == seqs[-EVENT_PAGE:]
    assert text(chrome, "#event-count") == str(len(seqs))
    assert href(chrome, "a#events-earlier").endswith(f"?before={seqs[-EVENT_PAGE]}")
    assert {"cancel-form", "signal-form"} <= {f.get_attribute("id") for f in css(chrome, "form")}
    set_marker(chrome)

    with_engine(dash.db, lambda e: e.signal(run_id, "more", 3))
    poll(lambda: _waits_after(dash, run_id, EVENT_PAGE + 23), "three more steps")
    grown = _events_of(dash, run_id)
    wait_for(
        chrome,
        lambda d: [i["seq"] for i in timeline(d)] == seqs[-EVENT_PAGE:] + grown[len(seqs) :],
        "the new events appended",
    )
    assert marker(chrome) == 1  # (appended, not reloaded)
    assert int(attr(chrome, "body", "data-appended")) == len(grown) - len(seqs)
    wait_for(chrome, lambda d: text(d, "#event-count") == str(len(grown)), "the count")
    keep(chrome, tmp_path, "run-appended")

    # an earlier page: the events before, and newer ones announced, not appended
    click(chrome, "a#events-earlier")
    wait_for(chrome, lambda d: "before=" in d.current_url, "the earlier page")
    wait_live(chrome)
    first = seqs[-EVENT_PAGE]
    assert [i["seq"] for i in timeline(chrome)] == grown[: first - 1][-EVENT_PAGE:]
    assert attr(chrome, "ol#timeline", "data-follow") == "false"
    assert href(chrome, "a#events-newest") == f"{dash.base}/runs/{run_id}"
    set_marker(chrome)
    with_engine(dash.db, lambda e: e.signal(run_id, "more", None))
    wait_for(chrome, lambda d: d.find_element("id", "events-newer").is_displayed(), "newer")
    assert [i["seq"] for i in timeline(chrome)] == grown[: first - 1][-EVENT_PAGE:]
    # the run completed: its actions go, live (nothing to cancel, retry or signal)
    wait_for(chrome, lambda d: css(d, "#no-actions"), "the actions to go")
    assert not css(chrome, "form#cancel-form") and not css(chrome, "form#signal-form")
    assert attr(chrome, "span#run-status", "data-status") == "completed"
    assert marker(chrome) == 1
    keep(chrome, tmp_path, "run-earlier-page")
