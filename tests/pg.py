"""A throwaway PostgreSQL server for tests: ``with start_postgres() as url: ...``.

It runs ``initdb`` and ``pg_ctl`` from ``PATH`` or ``/usr/lib/postgresql/*/bin`` in a fresh
directory under ``/tmp`` (as the ``postgres`` user when the tests run as root, since PostgreSQL
refuses to run as root), listens only on a unix socket in that directory, and is stopped with
``pg_ctl stop -m immediate`` afterwards. Durability is switched off unless asked for: it is a
test server."""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa


class PostgresUnavailable(RuntimeError):
    """No usable PostgreSQL installation (binaries or a non-root user to run them)."""


def find_binaries() -> tuple[str, str]:
    """Paths of ``initdb`` and ``pg_ctl``; ``PostgresUnavailable`` when missing."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return initdb, pg_ctl
    for bindir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        i, p = os.path.join(bindir, "initdb"), os.path.join(bindir, "pg_ctl")
        if os.access(i, os.X_OK) and os.access(p, os.X_OK):
            return i, p
    raise PostgresUnavailable("initdb/pg_ctl not found on PATH or in /usr/lib/postgresql/*/bin")


def _runner() -> tuple[list[str], int | None, int | None]:
    """The command prefix (``runuser -u postgres --`` as root) and the uid/gid to own files."""
    if os.geteuid() != 0:
        return [], None, None
    try:
        pw = pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable("running as root but there is no 'postgres' user") from None
    runuser = shutil.which("runuser")
    if runuser is None:
        raise PostgresUnavailable("running as root but runuser is not available")
    return [runuser, "-u", "postgres", "--"], pw.pw_uid, pw.pw_gid


class PgServer:
    """A running throwaway server (``running_postgres``): its ``url``, and ``restart()`` /
    ``stop()`` / ``start()`` through ``pg_ctl`` (as the ``postgres`` user when root)."""

    def __init__(self, url: str, root: Path, pg_ctl: str, prefix: list[str], timeout: float):
        self.url = url
        self.root = root
        self.data = root / "data"
        self.log = root / "server.log"
        self.socket = str(root / ".s.PGSQL.5432")
        self._pg_ctl = pg_ctl
        self._prefix = prefix
        self._timeout = timeout
        self.options = ""

    def ctl(self, *args: str, check: bool = True) -> None:
        """``pg_ctl -D <data> <args>``."""
        proc = subprocess.run(
            [*self._prefix, self._pg_ctl, "-D", str(self.data), *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=self._timeout,
        )
        if check and proc.returncode != 0:
            extra = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(
                f"pg_ctl {' '.join(args[:1])} failed ({proc.returncode}):\n"
                f"{proc.stdout}\n{proc.stderr}\n{extra}"
            )

    def start(self) -> None:
        self.ctl("-l", str(self.log), "-o", self.options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self.ctl("stop", "-m", mode, "-w")

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m <mode>``: every session ended, the server back when it returns."""
        self.ctl("-l", str(self.log), "-o", self.options, "-w", "-t", "60", "restart", "-m", mode)


@contextlib.contextmanager
def running_postgres(timeout: float = 60.0, *, durable: bool = False) -> Iterator[PgServer]:
    """Start a server; yield it as a ``PgServer`` (``start_postgres`` yields only its URL).

    ``durable=True`` keeps PostgreSQL's default durability (``fsync``, ``synchronous_commit``,
    ``full_page_writes`` on: every commit waits for its WAL flush), as a production server
    runs; the benchmarks use it. Tests leave it off for speed."""
    initdb, pg_ctl = find_binaries()
    prefix, uid, gid = _runner()
    # /tmp keeps the socket path short (unix socket paths are limited to ~107 bytes); the
    # directory must be traversable by the postgres user.
    root = Path(tempfile.mkdtemp(prefix="flowkit-pg-", dir="/tmp"))
    data = root / "data"
    log = root / "server.log"
    started = False
    try:
        os.chmod(root, 0o755)
        if uid is not None and gid is not None:
            os.chown(root, uid, gid)

        def run(*args: str) -> None:
            proc = subprocess.run(
                [*prefix, *args],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            if proc.returncode != 0:
                extra = log.read_text() if log.exists() else ""
                raise RuntimeError(
                    f"{' '.join(args[:2])} failed ({proc.returncode}):\n"
                    f"{proc.stdout}\n{proc.stderr}\n{extra}"
                )

        run(
            initdb,
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        options = f"-c listen_addresses='' -c unix_socket_directories={root} "
        if not durable:
            options += "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
        options += "-c max_connections=200"
        server = PgServer(
            f"postgresql+psycopg://postgres@/postgres?host={root}", root, pg_ctl, prefix, timeout
        )
        server.options = options
        server.start()
        started = True
        yield server
    finally:
        if started:
            subprocess.run(
                [*prefix, pg_ctl, "-D", str(data), "stop", "-m", "immediate", "-w"],
                cwd=root,
                capture_output=True,
                timeout=timeout,
            )
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def start_postgres(timeout: float = 60.0, *, durable: bool = False) -> Iterator[str]:
    """Start a server; yield ``postgresql+psycopg://postgres@/postgres?host=<socket dir>``
    (``running_postgres`` yields a ``PgServer`` that can also be restarted and stopped).

    ``durable=True`` keeps PostgreSQL's default durability (``fsync``, ``synchronous_commit``,
    ``full_page_writes`` on: every commit waits for its WAL flush), as a production server
    runs; the benchmarks use it. Tests leave it off for speed."""
    with running_postgres(timeout, durable=durable) as server:
        yield server.url


_counter = itertools.count()


def fresh_database(server_url: str, prefix: str = "flowkit_test") -> str:
    """Create an empty database on the server and return its URL."""
    name = f"{prefix}_{os.getpid()}_{next(_counter)}"
    url = sa.engine.make_url(server_url)
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        engine.dispose()
    return url.set(database=name).render_as_string(hide_password=False)


def collated_database(
    server_url: str, prefix: str = "flowkit_icu", *, icu_locale: str = "en-US"
) -> str:
    """Create an empty database whose default collation is the ICU locale ``icu_locale`` (the
    test server itself is ``--locale=C``, whose order is code points) and return its URL: what
    a production database created with a language locale orders by."""
    name = f"{prefix}_{os.getpid()}_{next(_counter)}"
    url = sa.engine.make_url(server_url)
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(
                f'CREATE DATABASE "{name}" TEMPLATE template0 LOCALE_PROVIDER icu'
                f" ICU_LOCALE '{icu_locale}' LOCALE 'C.UTF-8'"
            )
    finally:
        engine.dispose()
    return url.set(database=name).render_as_string(hide_password=False)
