"""The harness of the PostgreSQL chaos and failover tests: a workload of runs, worker
processes (tests/chaos_worker.py) each behind its own ``NetProxy`` when asked, the execution
log they write, and the checks.

The invariants (``violations``), each one a way a store or engine bug would show:

* every run completed, with every step's label in order;
* no step recorded twice in a history (one ``step_completed`` per position and per label);
* **no committed step re-runs**: no execution of a step begins after the ``at`` of its
  ``step_completed`` (``at`` is taken before the commit, so this is conservative); and no
  execution of step *k* begins after an execution of step *k + 1* of the same run began (a
  worker starts *k + 1* only once the record of *k* was acknowledged, so a later *k* means an
  acknowledged commit was lost, even when the history no longer shows it);
* no two processes execute one run at the same time (a worker that lost its lease never goes
  on beside the new owner);
* no two runs of one singleton key execute at the same time (no key with two holders).

``recovery`` measures, for one fault, how long the runs that were in flight took to make
progress again (history timestamps, the engine's ``SystemClock``, and the harness's
``time.time()``: one machine, one clock)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa

from flowkit import Engine, Run, RunStatus
from flowkit.events import Event
from flowkit.stores.sql import SqlStore
from flowkit_testing._netproxy import NetProxy

try:
    import chaos_worker
except ImportError:  # tests/ imported as a package
    from tests import chaos_worker

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(chaos_worker.__file__).resolve()
TERMINAL = ("completed", "failed", "cancelled")


@dataclass(frozen=True)
class Workload:
    """``plain`` runs of ``chaos-plain`` and ``single`` runs of ``chaos-single`` spread over
    ``keys`` keys, each of ``steps`` steps that hold ``hold`` seconds."""

    plain: int = 24
    single: int = 12
    keys: int = 3
    steps: int = 5
    hold: float = 0.15

    def runs(self) -> list[tuple[str, str, dict[str, Any]]]:
        out: list[tuple[str, str, dict[str, Any]]] = []
        base = {"steps": self.steps, "hold": self.hold}
        for i in range(max(self.plain, self.single)):
            if i < self.single:
                out.append((f"s-{i:03d}", chaos_worker.SINGLE, {**base, "key": i % self.keys}))
            if i < self.plain:
                out.append((f"p-{i:03d}", chaos_worker.PLAIN, dict(base)))
        return out

    def key_of(self, run_id: str) -> str | None:
        return f"k{int(run_id[2:]) % self.keys}" if run_id.startswith("s-") else None

    def labels(self) -> list[str]:
        return [f"s{i}" for i in range(self.steps)]


@dataclass
class Execution:
    instance: str
    pid: int
    run_id: str
    label: str
    begin: float
    end: float | None  # None: the process died in the step


def read_executions(marks: Path) -> list[Execution]:
    """Every step execution logged in ``marks`` (all processes), begin and end paired."""
    out: list[Execution] = []
    open_: dict[tuple[int, str, str], Execution] = {}
    text = marks.read_text() if marks.exists() else ""
    for line in text.splitlines():
        kind, instance, pid, run_id, label, at = line.split()
        k = (int(pid), run_id, label)
        if kind == "B":
            e = Execution(instance, int(pid), run_id, label, float(at), None)
            open_[k] = e
            out.append(e)
        elif k in open_:
            open_.pop(k).end = float(at)
    return out


def completed_steps(marks: Path) -> int:
    text = marks.read_text() if marks.exists() else ""
    return sum(1 for line in text.splitlines() if line.startswith("E "))


def connect_params(url: str) -> dict[str, Any]:
    """psycopg keyword arguments for a SQLAlchemy URL (multi-host URLs included)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        _, params = engine.dialect.create_connect_args(engine.url)
    finally:
        engine.dispose()
    params = dict(params)
    params.pop("context", None)
    params.setdefault("connect_timeout", 2)
    return params


def unsettled(url: str) -> int | None:
    """How many runs are not terminal, read with a plain connection; None when unreachable."""
    try:
        with psycopg.connect(**connect_params(url), autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM flowkit_runs WHERE status <> ALL(%s)", [list(TERMINAL)]
            ).fetchone()
            return int(row[0]) if row else None
    except psycopg.Error:
        return None


async def start_runs(url: str, work: Workload, marks: Path) -> None:
    """Create every run of ``work`` through a client engine (``worker=False``)."""
    store = SqlStore(url)
    try:
        m = chaos_worker.Marks(marks, "client")
        client = Engine(store, [chaos_worker.Plain(m), chaos_worker.Single(m)], worker=False)
        for run_id, wf, inp in work.runs():
            await client.start(wf, inp, run_id)
    finally:
        store.close()


async def _snapshot(url: str, ids: list[str]) -> dict[str, tuple[Run | None, list[Event]]]:
    store = SqlStore(url)
    try:
        return {i: (await store.get_run(i), await store.load_events(i)) for i in ids}
    finally:
        store.close()


def snapshot(url: str, ids: list[str]) -> dict[str, tuple[Run | None, list[Event]]]:
    return asyncio.run(_snapshot(url, ids))


@dataclass
class Worker:
    instance: str
    proc: subprocess.Popen[Any]
    log: Path
    proxy: NetProxy | None


@dataclass
class Cluster:
    """Worker processes on one database URL, each through its own proxy when ``proxied``."""

    url: str
    target: str | None  # the server's socket, for the proxies
    tmp: Path
    lease_ttl: float
    max_concurrency: int = 4
    extra_connection: bool = False
    workers: dict[str, Worker] = field(default_factory=dict)
    deaths: dict[int, float] = field(default_factory=dict)  # pid -> when it was killed
    exits: list[tuple[str, int, int]] = field(default_factory=list)  # instance, pid, code

    @property
    def marks(self) -> Path:
        return self.tmp / "marks.log"

    @property
    def stop_file(self) -> Path:
        return self.tmp / "stop"

    def spawn(self, instance: str) -> Worker:
        old = self.workers.get(instance)
        proxy = old.proxy if old is not None else None
        if proxy is None and self.target is not None:
            proxy = NetProxy(self.target).start()
        url = proxy.url_for(self.url) if proxy is not None else self.url
        args = [sys.executable, str(WORKER), url, str(self.marks), instance, str(self.stop_file)]
        args += ["--lease-ttl", str(self.lease_ttl)]
        args += ["--max-concurrency", str(self.max_concurrency)]
        if self.extra_connection:
            params = connect_params(url)
            dsn = psycopg.conninfo.make_conninfo(**params)
            args += ["--extra-dsn", dsn]
        n = sum(1 for p in self.tmp.glob(f"{instance}*.log"))
        log = self.tmp / f"{instance}.{n}.log"
        env = {**os.environ, "PYTHONFAULTHANDLER": "1", "PYTHONPATH": str(ROOT)}
        with open(log, "wb") as out:
            proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        w = self.workers[instance] = Worker(instance, proc, log, proxy)
        return w

    def kill(self, instance: str) -> float:
        w = self.workers[instance]
        w.proc.send_signal(signal.SIGKILL)
        w.proc.wait(10)
        at = time.time()
        self.deaths[w.proc.pid] = at
        self.exits.append((instance, w.proc.pid, w.proc.returncode))
        return at

    def proxies(self) -> list[NetProxy]:
        return [w.proxy for w in self.workers.values() if w.proxy is not None]

    def dead(self) -> list[tuple[str, int, str]]:
        """Workers that exited without being asked (code and log tail)."""
        return [
            (w.instance, code, w.log.read_text()[-3000:])
            for w in self.workers.values()
            if (code := w.proc.poll()) is not None
        ]

    def stop(self, timeout: float = 30.0) -> None:
        """Ask every worker to stop, wait (bounded), kill the stragglers, stop the proxies."""
        self.stop_file.touch()
        deadline = time.monotonic() + timeout
        for w in self.workers.values():
            if w.proc.poll() is None:
                try:
                    w.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    w.proc.kill()
                    w.proc.wait()
            self.exits.append((w.instance, w.proc.pid, w.proc.returncode))
        for p in self.proxies():
            p.stop()

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.tmp.glob("*.*.log"))
        )


@contextlib.contextmanager
def cluster(
    url: str, target: str | None, tmp: Path, lease_ttl: float, **kw: Any
) -> Iterator[Cluster]:
    c = Cluster(url, target, tmp, lease_ttl, **kw)
    try:
        yield c
    finally:
        if not c.stop_file.exists():
            c.stop(timeout=5)


def wait_until(cond: Any, timeout: float, what: str, c: Cluster | None = None) -> None:
    """Poll ``cond()`` every 50 ms until it is true; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s\n{c.logs() if c else ''}")
        time.sleep(0.05)


def wait_settled(url: str, timeout: float, c: Cluster | None = None) -> float:
    """Wait until every run is terminal; returns when (``time.time()``)."""
    wait_until(lambda: unsettled(url) == 0, timeout, "every run settles", c)
    return time.time()


STEP_EVENTS = ("step_completed", "run_completed")


def recovery(
    history: dict[str, list[Event]], execs: list[Execution], t_fault: float, t_up: float
) -> tuple[float, dict[str, float]]:
    """For each run in flight at ``t_fault`` (a step of it had begun executing, and it was not
    terminal yet), how long after ``t_up`` it recorded progress again (0 when the first step
    recorded after the fault was stamped before ``t_up``: it was under way, and its record
    went through once the database was back). Returns the maximum and the per-run figures."""
    begun = {x.run_id for x in execs if x.begin < t_fault}
    per: dict[str, float] = {}
    for run_id, events in history.items():
        if run_id not in begun:
            continue
        if any(e.type in TERMINAL_EVENTS and e.at < t_fault for e in events):
            continue
        after = [e.at for e in events if e.at >= t_fault and e.type in STEP_EVENTS]
        if after:
            per[run_id] = max(0.0, min(after) - t_up)
    return (max(per.values()) if per else 0.0), per


TERMINAL_EVENTS = ("run_completed", "run_failed", "run_cancelled")


def violations(
    work: Workload,
    snap: dict[str, tuple[Run | None, list[Event]]],
    execs: list[Execution],
    deaths: dict[int, float],
) -> list[str]:
    """Every broken invariant (see the module docstring); empty when all hold."""
    out: list[str] = []
    labels = work.labels()
    done_at: dict[tuple[str, str], float] = {}
    for run_id, (run, events) in snap.items():
        if run is None or run.status is not RunStatus.COMPLETED:
            out.append(f"{run_id} did not complete: {run and run.status}")
        elif run.output != labels:
            out.append(f"{run_id} output {run.output!r}")
        steps = [e for e in events if e.type == "step_completed"]
        by_pos = Counter(getattr(e, "pos", None) for e in steps)
        by_label = Counter(getattr(e, "result", None) for e in steps)
        twice = [p for p, n in by_pos.items() if n > 1] + [x for x, n in by_label.items() if n > 1]
        if twice:
            out.append(f"{run_id} recorded a step twice: {twice}")
        for e in steps:
            done_at[(run_id, str(getattr(e, "result", "")))] = e.at
    by_run: dict[str, list[Execution]] = defaultdict(list)
    for x in execs:
        by_run[x.run_id].append(x)
        at = done_at.get((x.run_id, x.label))
        if at is not None and x.begin > at:
            out.append(f"{x.run_id}/{x.label} re-ran at {x.begin:.3f} by {x.instance} "
                       f"after its completion committed (at {at:.3f})")  # fmt: skip

    def end(x: Execution) -> float:
        if x.end is not None:
            return x.end
        return deaths.get(x.pid, x.begin + work.hold)

    for run_id, xs in by_run.items():
        first_begin: dict[str, float] = {}
        for x in xs:
            first_begin[x.label] = min(first_begin.get(x.label, x.begin), x.begin)
        for x in xs:
            k = labels.index(x.label)
            later = labels[k + 1] if k + 1 < len(labels) else None
            if later in first_begin and x.begin > first_begin[later]:
                out.append(f"{run_id}/{x.label} ran again at {x.begin:.3f} by {x.instance} "
                           f"after {later} had begun: its record was lost")  # fmt: skip
        for a in xs:
            for b in xs:
                if a.pid < b.pid and a.begin < end(b) and b.begin < end(a):
                    out.append(f"{run_id}: {a.instance}/{a.pid} ran {a.label} "
                               f"[{a.begin:.3f}, {end(a):.3f}] while {b.instance}/{b.pid} ran "
                               f"{b.label} [{b.begin:.3f}, {end(b):.3f}]")  # fmt: skip
    by_key: dict[str, list[Execution]] = defaultdict(list)
    for x in execs:
        key = work.key_of(x.run_id)
        if key is not None:
            by_key[key].append(x)
    for key, xs in by_key.items():
        xs.sort(key=lambda x: x.begin)
        for i, a in enumerate(xs):
            for b in xs[i + 1 :]:
                if b.begin >= end(a):
                    break
                if b.run_id != a.run_id:
                    out.append(f"key {key} had two holders: {a.run_id} ran {a.label} "
                               f"[{a.begin:.3f}, {end(a):.3f}], {b.run_id} ran {b.label} "
                               f"from {b.begin:.3f}")  # fmt: skip
    return out


def run_ids(work: Workload) -> list[str]:
    return [r for r, _, _ in work.runs()]


def histories(snap: dict[str, tuple[Run | None, list[Event]]]) -> dict[str, list[Event]]:
    return {k: v[1] for k, v in snap.items()}
