"""Throwaway PostgreSQL servers for tests: ``with start_postgres() as url: ...``, a
``PgServer`` a test can restart and stop (the chaos tests), and ``replicated_pair()``: a
primary and a synchronous streaming-replication standby (the failover test).

Each server runs ``initdb`` and ``pg_ctl`` from ``PATH`` or ``/usr/lib/postgresql/*/bin`` in a
fresh directory under ``/dev/shm`` (in memory) or ``/tmp`` (see ``_parent_dir``), as the
``postgres`` user when the tests run as root (PostgreSQL refuses to run as root), listens only
on a unix socket in that directory, and is stopped with ``pg_ctl stop -m immediate``
afterwards. Durability is switched off unless asked for: it is a test server."""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
import time
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


MEMORY_DIR = "/dev/shm"
GIB = 1 << 30


def memory_dir(free: int) -> str | None:
    """``/dev/shm`` (a file system in memory) when it is a writable directory with at least
    ``free`` bytes free, else ``None``. (A container's is often 64 MB: too small.)"""
    try:
        if not os.access(MEMORY_DIR, os.W_OK | os.X_OK):
            return None
        st = os.statvfs(MEMORY_DIR)
    except OSError:
        return None
    return MEMORY_DIR if st.f_bavail * st.f_frsize >= free else None


def _parent_dir(durable: bool) -> str:
    """Where a server's directory goes: ``FLOWKIT_TEST_PG_DIR`` when set; else, for a server
    without durability, ``memory_dir`` when it has room for a run's server (its WAL alone
    grows to a GiB): a test server writes gigabytes over a run (every fresh database copies
    its template), which in memory takes a third of the time it takes on a disk; else (and
    for a durable server, whose fsyncs must reach a disk) ``/tmp``."""
    chosen = os.environ.get("FLOWKIT_TEST_PG_DIR")
    if chosen:
        return chosen
    return (None if durable else memory_dir(3 * GIB)) or "/tmp"


class PgServer:
    """One throwaway server in its own directory (``_parent_dir``; socket dir = that directory).

    ``init()`` runs ``initdb`` (or ``basebackup_from`` a primary, for a standby), ``start()``,
    ``stop(mode)``, ``restart(mode)`` and ``promote()`` run ``pg_ctl`` and wait for it;
    ``destroy()`` stops the server and removes the directory. ``url`` is the SQLAlchemy URL,
    ``socket_path`` the ``.s.PGSQL.<port>`` file (what a ``NetProxy`` forwards to).
    ``durable=True`` keeps PostgreSQL's default durability; ``options`` are extra ``-c``
    settings for the command line (they are not written into the data directory, so a standby
    copied from this server does not inherit them)."""

    def __init__(
        self,
        *,
        port: int = 5432,
        durable: bool = False,
        options: str = "",
        timeout: float = 60.0,
    ) -> None:
        self.initdb, self.pg_ctl = find_binaries()
        self.prefix, self._uid, self._gid = _runner()
        self.port = port
        self.durable = durable
        self.options = options
        self.timeout = timeout
        # /tmp (or /dev/shm) keeps the socket path short (unix socket paths are limited to ~107
        # bytes); the directory must be traversable by the postgres user.
        self.root = Path(tempfile.mkdtemp(prefix="flowkit-pg-", dir=_parent_dir(durable)))
        os.chmod(self.root, 0o755)
        if self._uid is not None and self._gid is not None:
            os.chown(self.root, self._uid, self._gid)
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.running = False

    # -- where it listens ---------------------------------------------------------------------
    @property
    def socket_dir(self) -> str:
        return str(self.root)

    @property
    def socket_path(self) -> str:
        return str(self.root / f".s.PGSQL.{self.port}")

    @property
    def url(self) -> str:
        """``postgresql+psycopg://postgres@/postgres?host=<socket dir>`` (``&port=`` unless
        5432)."""
        url = f"postgresql+psycopg://postgres@/postgres?host={self.root}"
        return url if self.port == 5432 else f"{url}&port={self.port}"

    @property
    def dsn(self) -> str:
        """The libpq form of ``url`` (for plain psycopg connections)."""
        return f"host={self.root} port={self.port} user=postgres dbname=postgres"

    # -- pg_ctl ---------------------------------------------------------------------------------
    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run(
                [*self.prefix, *args],
                cwd=self.root,
                capture_output=True,
                text=True,
                timeout=self.timeout,
            )
        except subprocess.TimeoutExpired as exc:
            extra = self.log.read_text()[-5000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(args[:2])} timed out:\n{extra}") from exc
        if check and proc.returncode != 0:
            extra = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(
                f"{' '.join(args[:2])} failed ({proc.returncode}):\n"
                f"{proc.stdout}\n{proc.stderr}\n{extra}"
            )
        return proc

    def _options(self) -> str:
        options = (
            f"-c listen_addresses='' -c unix_socket_directories={self.root} -c port={self.port} "
        )
        if not self.durable:
            options += "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
        options += "-c max_connections=200 "
        return options + self.options

    def init(self) -> PgServer:
        self._run(
            self.initdb,
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        return self

    def basebackup_from(self, primary: PgServer) -> PgServer:
        """Make this server a streaming standby of ``primary`` (``pg_basebackup -R``: it
        writes ``standby.signal`` and ``primary_conninfo`` over ``primary``'s socket)."""
        basebackup = str(Path(os.path.realpath(self.initdb)).with_name("pg_basebackup"))
        self._run(
            basebackup,
            "-D",
            str(self.data),
            "-h",
            primary.socket_dir,
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-R",
            "-X",
            "stream",
            "--no-sync",
        )
        return self

    def start(self) -> None:
        ctl = self.pg_ctl
        self._run(ctl, "-D", str(self.data), "-l", str(self.log), "-o", self._options(), "-w",
                  "-t", str(int(self.timeout)), "start")  # fmt: skip
        self.running = True

    def stop(self, mode: str = "immediate") -> None:
        self._run(self.pg_ctl, "-D", str(self.data), "stop", "-m", mode, "-w")
        self.running = False

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m <mode> -w``: returns once the server accepts connections."""
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-o", self._options(),
                  "restart", "-m", mode, "-w", "-t", str(int(self.timeout)))  # fmt: skip
        self.running = True

    @property
    def socket(self) -> str:
        """``socket_path`` (what ``tests/test_store_outages.py`` calls it)."""
        return self.socket_path

    def promote(self) -> None:
        """``pg_ctl promote -w``: a standby becomes a primary (read-write)."""
        self._run(self.pg_ctl, "-D", str(self.data), "promote", "-w", "-t",
                  str(int(self.timeout)))  # fmt: skip

    def destroy(self) -> None:
        if self.running or (self.data / "postmaster.pid").exists():
            self._run(self.pg_ctl, "-D", str(self.data), "stop", "-m", "immediate", "-w",
                      check=False)  # fmt: skip
            self.running = False
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


@contextlib.contextmanager
def start_postgres(timeout: float = 60.0, *, durable: bool = False) -> Iterator[str]:
    """Start a server; yield ``postgresql+psycopg://postgres@/postgres?host=<socket dir>``.

    ``durable=True`` keeps PostgreSQL's default durability (``fsync``, ``synchronous_commit``,
    ``full_page_writes`` on: every commit waits for its WAL flush), as a production server
    runs; the benchmarks use it. Tests leave it off for speed."""
    with started_server(timeout, durable=durable) as server:
        yield server.url


@contextlib.contextmanager
def started_server(timeout: float = 60.0, *, durable: bool = False) -> Iterator[PgServer]:
    """A ``PgServer``, initialized and started; destroyed afterwards."""
    server = PgServer(durable=durable, timeout=timeout)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.destroy()


running_postgres = started_server
"""(The name ``tests/test_store_outages.py`` uses.)"""


# Commits wait for the standby (synchronous_commit=on with a named synchronous standby). Only
# the primary's command line carries synchronous_standby_names: pg_basebackup copies the
# configuration files, and a promoted standby that inherited it would wait forever for a
# standby of its own.
_PRIMARY_OPTIONS = "-c synchronous_commit=on -c synchronous_standby_names='*' -c wal_level=replica "
_PRIMARY_OPTIONS += "-c max_wal_senders=5 -c wal_sender_timeout=5s"
_STANDBY_OPTIONS = "-c synchronous_commit=on -c hot_standby=on -c wal_receiver_timeout=5s"


@contextlib.contextmanager
def replicated_pair(timeout: float = 60.0) -> Iterator[tuple[PgServer, PgServer]]:
    """A primary (port 5432) and a synchronous streaming standby (port 5433) in separate
    socket directories; yield ``(primary, standby)``, both running and the standby streaming.

    ``initdb`` creates the primary (its default ``pg_hba.conf`` with ``--auth=trust`` lets
    local replication connections in), ``pg_basebackup -R`` the standby, which replicates over
    the primary's unix socket. A commit on the primary returns only once the standby has
    it. ``multi_host_url(primary, standby)`` is the URL workers use."""
    primary = PgServer(port=5432, options=_PRIMARY_OPTIONS, timeout=timeout)
    standby = PgServer(port=5433, options=_STANDBY_OPTIONS, timeout=timeout)
    try:
        primary.init()
        primary.start()
        standby.basebackup_from(primary)
        standby.start()
        wait_streaming(primary, timeout)
        yield primary, standby
    finally:
        standby.destroy()
        primary.destroy()


def wait_streaming(primary: PgServer, timeout: float = 60.0) -> None:
    """Wait until the primary sees a synchronous standby streaming from it."""
    engine = sa.create_engine(primary.url, poolclass=sa.pool.NullPool)
    deadline = time.monotonic() + timeout
    try:
        while True:
            with engine.connect() as conn:
                state = conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_replication"
                    " WHERE state = 'streaming' AND sync_state = 'sync'"
                ).scalar()
            if state:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"no synchronous standby within {timeout} s")
            time.sleep(0.05)
    finally:
        engine.dispose()


def multi_host_url(*servers: PgServer, database: str = "postgres") -> str:
    """A SQLAlchemy URL naming every server, for libpq to try in order and keep the first
    that accepts writes: ``postgresql+psycopg://postgres@/<db>?host=<dir1>:<port1>&host=
    <dir2>:<port2>&target_session_attrs=read-write``. (SQLAlchemy turns repeated ``host=``
    parameters into libpq's ``host=dir1,dir2 port=p1,p2``.)"""
    hosts = "&".join(f"host={s.socket_dir}:{s.port}" for s in servers)
    return f"postgresql+psycopg://postgres@/{database}?{hosts}&target_session_attrs=read-write"


def socket_of(server_url: str) -> str:
    """The unix socket file of the server a ``start_postgres`` URL names (what a
    ``flowkit_testing._netproxy.NetProxy`` forwards to)."""
    host = sa.engine.make_url(server_url).query["host"]
    assert isinstance(host, str)
    return str(Path(host) / ".s.PGSQL.5432")


_counter = itertools.count()
_admins: dict[str, tuple[sa.Engine, str]] = {}


def _admin(server_url: str | sa.URL) -> tuple[sa.Engine, str]:
    """An engine on the server's ``postgres`` database, kept for the process (a connection
    each time took as long as the ``CREATE DATABASE``; a restarted server gets a fresh one,
    ``pool_pre_ping``), and the ``STRATEGY`` clause of its ``CREATE DATABASE``: a file copy
    of the template where nothing is synced anyway (``fsync=off``), else the default (a file
    copy syncs twice)."""
    url = sa.engine.make_url(server_url).set(database="postgres")
    key = url.render_as_string(hide_password=False)
    if key not in _admins:
        engine = sa.create_engine(
            url, isolation_level="AUTOCOMMIT", pool_pre_ping=True, pool_size=1, max_overflow=8
        )
        with engine.connect() as conn:
            version = int(conn.exec_driver_sql("SHOW server_version_num").scalar_one())
            fsync = conn.exec_driver_sql("SHOW fsync").scalar_one()
        copy = version >= 150000 and fsync == "off"
        _admins[key] = engine, " STRATEGY FILE_COPY" if copy else ""
    return _admins[key]


def fresh_database(server_url: str, prefix: str = "flowkit_test") -> str:
    """Create an empty database on the server and return its URL."""
    name = f"{prefix}_{os.getpid()}_{next(_counter)}"
    url = sa.engine.make_url(server_url)
    engine, strategy = _admin(url)
    with engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"{strategy}')
    return url.set(database=name).render_as_string(hide_password=False)


def drop_database(database_url: str) -> bool:
    """Drop a database that ``fresh_database`` made, once its test is done with it, so that a
    run's server does not keep hundreds of them (in memory, on ``/dev/shm``). Best effort: a
    database someone is still connected to is left alone (``False``)."""
    url = sa.engine.make_url(database_url)
    try:
        with _admin(url)[0].connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{url.database}"')
    except sa.exc.DBAPIError:
        return False
    return True


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
