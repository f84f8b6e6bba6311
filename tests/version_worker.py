"""A worker process of the mixed-fleet test (tests/test_versions_fleet.py).

``python tests/version_worker.py URL INSTANCE_ID VERSIONS`` runs one Engine
(``poll_interval=0.1``, ``lease_ttl=3``) on ``SqlStore(URL)`` with the versions of ``greet``
listed in ``VERSIONS`` (comma-separated: ``1`` or ``1,2``), until SIGTERM, then stops it
gracefully (its leases given back) and exits 0. Steps name the worker
(``FLOWKIT_TEST_WORKER``, set to ``INSTANCE_ID``), so the test sees who ran each run."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from version_kit import versions_of

from flowkit import Engine
from flowkit.stores.sql import SqlStore


async def main(url: str, instance: str, versions: str) -> int:
    os.environ["FLOWKIT_TEST_WORKER"] = instance
    store = SqlStore(url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        engine = Engine(
            store, versions_of(versions), instance_id=instance, poll_interval=0.1, lease_ttl=3
        )
        async with engine:
            print("ready", flush=True)
            await stop.wait()
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3])))
