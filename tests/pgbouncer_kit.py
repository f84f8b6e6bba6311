"""A throwaway PgBouncer in front of a test PostgreSQL server (``with pgbouncer(server_url)
as url``): transaction pooling with a pool of ``pool_size`` server connections per database,
on a unix socket in its own temp dir, run as the ``postgres`` user when the tests run as root
(PgBouncer refuses root, like PostgreSQL). The binary comes from Debian's ``pgbouncer``
package, which ``.ci/run`` installs with PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa
from pg import PostgresUnavailable, _runner

PORT = 6432


def find_pgbouncer() -> str:
    for candidate in (shutil.which("pgbouncer"), "/usr/sbin/pgbouncer"):
        if candidate and os.path.exists(candidate):
            return candidate
    raise PostgresUnavailable("pgbouncer is not installed (apt-get install pgbouncer)")


@contextlib.contextmanager
def pgbouncer(server_url: str, *, pool_size: int = 2, timeout: float = 30.0) -> Iterator[str]:
    """Start PgBouncer before the server of ``server_url`` (a ``pg.fresh_database`` URL: a
    unix socket) and yield the URL of the same database through it, ``flowkit_pooler`` not
    set; stop it after."""
    binary = find_pgbouncer()
    prefix, uid, gid = _runner()
    u = sa.engine.make_url(server_url)
    host = u.query["host"]
    assert isinstance(host, str)
    port = u.query.get("port", "5432")
    root = Path(tempfile.mkdtemp(prefix="flowkit-pgb-", dir="/tmp"))
    os.chmod(root, 0o755)
    (root / "users.txt").write_text('"postgres" ""\n')
    (root / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={host} port={port}\n"
        "[pgbouncer]\n"
        "listen_addr =\n"
        f"listen_port = {PORT}\n"
        f"unix_socket_dir = {root}\n"
        "auth_type = trust\n"
        f"auth_file = {root / 'users.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool_size}\n"
        "max_client_conn = 200\n"
        f"logfile = {root / 'pgbouncer.log'}\n"
        f"pidfile = {root / 'pgbouncer.pid'}\n"
    )
    if uid is not None and gid is not None:
        for path in (root, *root.iterdir()):
            os.chown(path, uid, gid)
    proc = subprocess.Popen(
        [*prefix, binary, str(root / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        sock = root / f".s.PGSQL.{PORT}"
        end = time.monotonic() + timeout
        while not sock.exists():
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"pgbouncer exited ({proc.returncode}): {err}")
            if time.monotonic() > end:
                raise RuntimeError("pgbouncer did not open its socket")
            time.sleep(0.02)
        query = {k: v for k, v in u.query.items() if k not in ("host", "port")}
        yield u.set(query={**query, "host": str(root), "port": str(PORT)}).render_as_string(
            hide_password=False
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        shutil.rmtree(root, ignore_errors=True)
