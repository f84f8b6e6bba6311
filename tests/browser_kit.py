"""The dashboard's browser tests' kit (tests/test_ui_browser*.py): a real headless Chromium
driven by Selenium 4 through Debian's ``/usr/bin/chromium`` and ``/usr/bin/chromedriver``
(nothing is downloaded: no Selenium Manager), a real ``flowkit ui`` process and a real
``flowkit worker`` process (tests/ui_app.py) on one database, full-page screenshots, and
waits on conditions (never sleeps).

Without chromium/chromedriver the tests skip, or fail with ``FLOWKIT_REQUIRE_BROWSER=1`` (set
by .ci/run, which installs them), like ``FLOWKIT_REQUIRE_POSTGRES``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import ui_app

from flowkit import Engine, Run, RunStatus
from flowkit.stores import SqlStore

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DOCS_IMAGES = ROOT / "docs" / "images"
BOUND = 30.0  # seconds any one condition may take before a test fails (never a sleep)
CHROME_ARGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--window-size=1280,900",
)
T = TypeVar("T")


class BrowserUnavailable(RuntimeError):
    """No Chromium or no chromedriver on this machine (or Selenium is not installed)."""


def find_browser() -> tuple[str, str]:
    """Paths of Chromium and chromedriver (Debian's first, then ``PATH``);
    ``BrowserUnavailable`` when either is missing."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        raise BrowserUnavailable("selenium is not installed (the test extra)") from None
    found = []
    for fixed, names in (
        (CHROMIUM, ("chromium", "chromium-browser")),
        (CHROMEDRIVER, ("chromedriver",)),
    ):
        path = fixed if os.access(fixed, os.X_OK) else None
        for name in names:
            path = path or shutil.which(name)
        if path is None:
            raise BrowserUnavailable(
                f"{fixed} not found (apt-get install chromium chromium-driver)"
            )
        found.append(path)
    return found[0], found[1]


def new_driver(profile: Path) -> Any:
    """A headless Chromium with a fresh profile in ``profile``: Debian's driver is passed
    explicitly and ``SE_OFFLINE`` is set, so Selenium Manager never reaches the internet."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = find_browser()
    os.environ["SE_OFFLINE"] = "true"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in CHROME_ARGS:
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={profile}")
    # a confirm() left open must not be dismissed behind the test's back
    options.unhandled_prompt_behavior = "ignore"
    service = Service(chromedriver, log_output=str(profile.parent / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(BOUND)
    driver.set_script_timeout(BOUND)
    return driver


def wait_for(driver: Any, cond: Callable[[Any], T], what: str, limit: float = BOUND) -> T:
    """``WebDriverWait`` until ``cond(driver)`` is truthy (exceptions count as not yet); the
    failure names the last exception seen."""
    from selenium.common.exceptions import TimeoutException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    last: list[BaseException] = []

    def safe(d: Any) -> T | bool:
        try:
            return cond(d)
        except (WebDriverException, LookupError, ValueError, AssertionError) as exc:
            last[:] = [exc]
            return False

    wait: WebDriverWait[Any] = WebDriverWait(driver, limit, poll_frequency=0.05)
    try:
        return wait.until(safe)  # type: ignore[arg-type]
    except TimeoutException:
        why = (
            f" (last: {type(last[0]).__name__}: {str(last[0]).splitlines()[0][:300]})"
            if last
            else ""
        )
        try:
            text = driver.execute_script("return document.body.innerText;")[:600]
        except WebDriverException:
            text = "?"
        raise AssertionError(
            f"timed out after {limit:.0f} s waiting for {what}{why}; at {driver.current_url}; "
            f"the page says: {text!r}"
        ) from None


def poll(cond: Callable[[], T], what: str, limit: float = BOUND) -> T:
    """Poll ``cond()`` (no browser involved) until it is truthy; fail after ``limit`` s."""
    end = time.monotonic() + limit
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def screenshot(driver: Any, path: Path) -> Path:
    """The whole page (beyond the viewport) as a PNG at ``path``."""
    import base64

    metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
    size = metrics.get("cssContentSize") or metrics["contentSize"]
    width = max(int(size["width"]), 1280)
    height = max(int(size["height"]), 200)
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
        },
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def _env() -> dict[str, str]:
    paths = [str(ROOT), str(ROOT / "tests")]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1"}


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group ``proc`` leads, then SIGKILL if it lingers."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(15)


@contextlib.contextmanager
def run_ui(db: str, tmp: Path, token: str, *extra: str, name: str = "ui") -> Iterator[str]:
    """``flowkit --db DB ui --port 0 --token TOKEN`` in its own process group; yields the base
    URL (``http://127.0.0.1:PORT``) once the printed line came and the server answers.
    Its stderr goes to ``tmp/<name>.log``; the group is killed afterwards."""
    args = [sys.executable, "-m", "flowkit.cli", "--db", db, "ui", "--port", "0"]
    args += ["--token", token, *extra]
    log = (tmp / f"{name}.log").open("wb")
    proc = subprocess.Popen(
        args, env=_env(), cwd=tmp, stdout=subprocess.PIPE, stderr=log, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        line = _read_line(proc, "flowkit ui: serving http", log.name)
        url = line.split("serving ", 1)[1].strip()
        threading.Thread(target=_drain, args=(proc, log), daemon=True).start()
        base = url.split("/?", 1)[0].rstrip("/")
        poll(lambda: _answers(base), f"{base} to answer")
        yield base
    finally:
        _stop(proc)
        log.close()


def _read_line(proc: subprocess.Popen[bytes], marker: str, log: str) -> str:
    """The first stdout line of ``proc`` containing ``marker`` (within ``BOUND`` seconds)."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    end = time.monotonic() + BOUND
    seen = b""
    while time.monotonic() < end:
        if not sel.select(timeout=0.2):
            continue
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        seen += chunk
        *lines, _partial = seen.split(b"\n")
        for raw in lines:
            text = raw.decode(errors="replace")
            if marker in text:
                return text
    raise AssertionError(
        f"no {marker!r} line from the dashboard (exit {proc.poll()}); stdout {seen!r}; "
        f"log: {Path(log).read_text(errors='replace')[-2000:]}"
    )


def _drain(proc: subprocess.Popen[bytes], log: Any) -> None:
    """Copy the rest of ``proc``'s stdout to its log, so a full pipe never blocks it."""
    assert proc.stdout is not None
    with contextlib.suppress(OSError, ValueError):
        for chunk in iter(lambda: os.read(proc.stdout.fileno(), 4096), b""):  # type: ignore[union-attr]
            log.write(chunk)
            log.flush()


def _answers(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/runs", timeout=5):
            return True
    except urllib.error.HTTPError:
        return True  # 401 without the token: it answers
    except OSError:
        return False


@contextlib.contextmanager
def run_worker(db: str, tmp: Path, name: str = "worker") -> Iterator[subprocess.Popen[bytes]]:
    """``flowkit worker ui_app:WORKFLOWS`` on ``db`` in its own process group (log in
    ``tmp/<name>.log``), stopped (drained) afterwards."""
    args = [sys.executable, "-m", "flowkit.cli", "worker", "ui_app:WORKFLOWS", "--db", db]
    args += ["--instance-id", name, "--grace", "2"]
    with (tmp / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(
            args, env=_env(), cwd=tmp, stdout=log, stderr=log, start_new_session=True
        )
    try:
        yield proc
    finally:
        _stop(proc)


def with_engine(db: str, fn: Callable[[Engine], Awaitable[T]]) -> T:
    """Run ``fn(engine)`` with an Engine on ``db`` that executes nothing itself (the worker
    process does): how a test starts, signals and reads runs from outside the dashboard."""

    async def go() -> T:
        store = SqlStore(db)
        try:
            engine = Engine(store, ui_app.WORKFLOWS, worker=False)
            return await fn(engine)
        finally:
            store.close()

    return asyncio.run(go())


# -- the seeded dashboard ----------------------------------------------------------------


@dataclass
class Dash:
    """A running dashboard + worker on one database, and the ids of the seeded runs."""

    base: str
    db: str
    tmp: Path
    token: str
    ids: dict[str, str] = field(default_factory=dict)

    def runs(self) -> list[Run]:
        return with_engine(self.db, lambda e: e.list_runs())

    def run(self, run_id: str) -> Run:
        return with_engine(self.db, lambda e: e.get_run(run_id))

    def status(self, run_id: str) -> str:
        return str(self.run(run_id).status)


async def seed(engine: Engine) -> dict[str, str]:
    """Realistic data: a deploy lane with a holder and two waiters, a lone holder, a
    pending approval, a failed charge, an order with a child shipment, greetings."""
    ids: dict[str, str] = {}
    for name, wf, inp, kw in [
        ("greet-1", ui_app.Greet, "ada", {"tags": ["batch:morning"]}),
        ("order", ui_app.Order, "o-1042", {"search": {"customer": "c-17"}}),
        ("prod-1", ui_app.Deploy, {"env": "prod", "version": "1.4.0"}, {"tags": ["team:web"]}),
        ("staging-1", ui_app.Deploy, {"env": "staging", "version": "1.5.0-rc1"}, {}),
        ("charge", ui_app.Charge, "order 1042", {}),
        ("prod-2", ui_app.Deploy, {"env": "prod", "version": "1.4.1"}, {}),
        ("approval", ui_app.Approval, "expense #88: 120 EUR", {}),
        ("prod-3", ui_app.Deploy, {"env": "prod", "version": "1.5.0"}, {}),
        ("greet-2", ui_app.Greet, "grace", {"tags": ["batch:morning"]}),
    ]:
        ids[name] = (await engine.start(wf, inp, **kw)).id
    return ids


def settled_seed(d: Dash) -> bool:
    """Whether the worker brought every seeded run to where the tests expect it."""
    by_id = {r.id: r for r in d.runs()}
    s = {name: by_id[i].status for name, i in d.ids.items()}
    return (
        s["greet-1"] == s["greet-2"] == s["order"] == RunStatus.COMPLETED
        and s["charge"] == RunStatus.FAILED
        and s["approval"] == RunStatus.SUSPENDED
        and by_id[d.ids["prod-1"]].admitted
        and s["prod-1"] == RunStatus.SUSPENDED
        and by_id[d.ids["staging-1"]].admitted
        and s["staging-1"] == RunStatus.SUSPENDED
        and not by_id[d.ids["prod-2"]].admitted
        and not by_id[d.ids["prod-3"]].admitted
    )


@contextlib.contextmanager
def dashboard(db: str, tmp: Path, token: str) -> Iterator[Dash]:
    """Seed ``db`` (``seed``), then run ``flowkit worker`` and ``flowkit ui`` on it until
    the worker has brought the seeded runs where the tests expect them."""
    d = Dash("", db, tmp, token)
    d.ids = with_engine(db, seed)
    with run_worker(db, tmp), run_ui(db, tmp, token) as base:
        d.base = base
        poll(lambda: settled_seed(d), "the worker to settle the seeded runs")
        yield d


def keep(driver: Any, tmp: Path, name: str, docs: str | None = None) -> None:
    """Screenshot the page to ``tmp/screenshots/<name>.png`` (the test's artifact) and, with
    ``FLOWKIT_UPDATE_SCREENSHOTS=1``, to ``docs/images/<docs>.png``."""
    shot = screenshot(driver, tmp / "screenshots" / f"{name}.png")
    if docs is not None and os.environ.get("FLOWKIT_UPDATE_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        (DOCS_IMAGES / f"{docs}.png").write_bytes(shot.read_bytes())


def newest_first(runs: list[Run]) -> list[tuple[str, str]]:
    return [(r.id, str(r.status)) for r in sorted(runs, key=lambda r: (r.created_at, r.id))][::-1]


def store_counts(runs: list[Run]) -> dict[str, int]:
    counts = {str(s): 0 for s in RunStatus}
    for r in runs:
        counts[str(r.status)] += 1
    counts["total"] = len(runs)
    return counts


async def start_all(engine: Engine, starts: list[tuple[Any, Any]]) -> list[str]:
    return [(await engine.start(wf, inp)).id for wf, inp in starts]
