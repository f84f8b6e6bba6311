"""Reading and driving the dashboard's DOM (/work/wt/UI_DOM.md, docs/ui.md) in the browser
tests: most reads are one ``execute_script`` each, since a live update may swap an element
out between two Selenium calls (tests/browser_kit.py starts the browser and the processes)."""

from __future__ import annotations

from typing import Any

from browser_kit import BOUND, wait_for


def css(driver: Any, selector: str) -> list[Any]:
    """Every element matching the CSS ``selector`` (``[]`` when none)."""
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def one(driver: Any, selector: str) -> Any:
    """The element matching ``selector`` (``NoSuchElementException`` when none)."""
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def goto(driver: Any, base: str, path: str, token: str, page: str | None = None) -> None:
    """Open ``path`` logged in with ``?token=`` (the dashboard sets its cookie and redirects
    to the same URL without the token), then wait for ``body[data-page=page]``."""
    sep = "&" if "?" in path else "?"
    driver.get(f"{base}{path}{sep}token={token}")
    wait_for(driver, lambda d: "token=" not in d.current_url, "the redirect without the token")
    if page is not None:
        wait_for(driver, lambda d: one(d, "body").get_attribute("data-page") == page, page)


def wait_live(driver: Any) -> None:
    """Wait until the page's server-sent events connection is open (``#live-status``)."""
    wait_for(
        driver,
        lambda d: one(d, "span#live-status").get_attribute("data-state") == "open",
        "the live connection to open",
    )


def set_marker(driver: Any) -> None:
    """Set ``window.__marker``: it survives live updates, not a page load."""
    driver.execute_script("window.__marker = 1;")


def marker(driver: Any) -> Any:
    return driver.execute_script("return window.__marker;")


def page_rows(driver: Any) -> list[tuple[str, str]]:
    """``(run id, status)`` of the runs table's rows, top to bottom (read in one script: a
    live update may swap the table between two Selenium calls)."""
    got = driver.execute_script(
        "return [...document.querySelectorAll('table#runs tr.run')]"
        ".map(r => [r.dataset.runId, r.dataset.status]);"
    )
    return [(i, s) for i, s in got]


def page_counts(driver: Any) -> dict[str, int]:
    """The runs page's counts: status -> number, and ``total`` (read in one script)."""
    got: dict[str, str] = driver.execute_script(
        "const o = {};"
        "document.querySelectorAll('#counts a.count[data-status]').forEach(a =>"
        "  o[a.dataset.status] = a.querySelector('span.n').textContent.trim());"
        "o.total = document.querySelector('#count-total span.n').textContent.trim();"
        "return o;"
    )
    return {k: int(v) for k, v in got.items()}


def row_cells(driver: Any) -> list[dict[str, Any]]:
    """Each runs table row's id, status, cells and link (read in one script)."""
    got: list[dict[str, Any]] = driver.execute_script(
        "return [...document.querySelectorAll('table#runs tr.run')].map(r => ({"
        "  id: r.dataset.runId, status: r.dataset.status,"
        "  workflow: r.querySelector('td.workflow').textContent.trim(),"
        "  badge: [...r.querySelector('td.status span.badge').classList],"
        "  key: r.querySelector('td.key').textContent.trim(),"
        "  href: r.querySelector('td.id a.run-link').href,"
        "  created: r.querySelector('td.created time').dataset.ts,"
        "  iso: r.querySelector('td.created time').getAttribute('datetime'),"
        "  updated: r.querySelector('td.updated time').dataset.ts}));"
    )
    return got


def lane_members(driver: Any) -> list[tuple[str, str, str, bool]]:
    """``(run id, role, position, current)`` of ``ol#lane-members``, top to bottom (read in
    one script)."""
    got = driver.execute_script(
        "return [...document.querySelectorAll('ol#lane-members li.lane-member')].map(li =>"
        "  [li.dataset.runId, li.dataset.role, li.dataset.position,"
        "   li.classList.contains('current')]);"
    )
    return [(i, r, p, bool(c)) for i, r, p, c in got]


def accept_confirm(driver: Any) -> str:
    """Accept the ``window.confirm`` an action form asks; returns its text."""
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    alert = WebDriverWait(driver, BOUND).until(ec.alert_is_present(), "the confirm dialog")
    text = str(alert.text)
    alert.accept()
    return text


def no_alert(driver: Any) -> bool:
    """Whether no alert/confirm dialog is open."""
    from selenium.common.exceptions import NoAlertPresentException

    try:
        _ = driver.switch_to.alert.text
    except NoAlertPresentException:
        return True
    return False


def text(driver: Any, selector: str) -> str:
    """The rendered text of the element at ``selector``, read in one script (so a live swap
    cannot make it stale); ``LookupError`` when there is none."""
    got = driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;", selector
    )
    if got is None:
        raise LookupError(f"no element {selector!r}")
    return str(got).strip()


def attr(driver: Any, selector: str, name: str) -> str | None:
    """An attribute of the element at ``selector``, read in one script; ``LookupError`` when
    there is none."""
    found, value = driver.execute_script(
        "const e = document.querySelector(arguments[0]);"
        "return e ? [true, e.getAttribute(arguments[1])] : [false, null];",
        selector,
        name,
    )
    if not found:
        raise LookupError(f"no element {selector!r}")
    return None if value is None else str(value)


def click(driver: Any, selector: str) -> None:
    """Click the element at ``selector``, finding it again if a live swap replaced it."""
    from selenium.common.exceptions import StaleElementReferenceException

    def go(d: Any) -> bool:
        try:
            one(d, selector).click()
        except StaleElementReferenceException:
            return False
        return True

    wait_for(driver, go, f"a click on {selector}")


def timeline(driver: Any) -> list[dict[str, Any]]:
    """``ol#timeline``'s events (type, seq, label, time since the run's creation, the time as
    shown and its epoch seconds, and the fields as text), in one script."""
    got: list[dict[str, Any]] = driver.execute_script(
        "return [...document.querySelectorAll('ol#timeline li.event')].map(li => ({"
        "  type: li.dataset.type, seq: Number(li.dataset.seq),"
        "  label: li.querySelector('span.event-type').innerText.trim(),"
        "  at: li.querySelector('span.event-at').innerText.trim(),"
        "  time: li.querySelector('time.event-time').innerText.trim(),"
        "  ts: Number(li.querySelector('time.event-time').dataset.ts),"
        "  body: li.querySelector('dl.event-fields') ?"
        "        li.querySelector('dl.event-fields').innerText : ''}));"
    )
    return got


def href(driver: Any, selector: str) -> str:
    """The absolute URL a link at ``selector`` points to (its ``href`` property)."""
    got = driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.href : null;", selector
    )
    if got is None:
        raise LookupError(f"no link {selector!r}")
    return str(got)
