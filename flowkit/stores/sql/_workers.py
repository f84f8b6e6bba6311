"""``SqlStore``'s ``record_worker`` and ``workers`` (``Workers``, mixed into it): what each
worker instance made known of itself, in ``flowkit_workers`` (``base.RecordsWorkers``); and
``put_workflow_schemas`` / ``workflow_schema``: the schemas workers record per workflow
version, in ``flowkit_workflow_schemas`` (``base.RecordsSchemas``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from .. import limits
from ..base import WorkerSeen, WorkflowVersions
from ._database import Database
from ._group_commit import GroupCommit
from ._schema import workers as workers_table
from ._schema import workflow_schemas as schemas_table

FORGET_AFTER = 7 * 86400.0
"""Seconds after which an entry not seen again is deleted (by the next ``record_worker`` of
its namespace): a fleet that restarts under fresh instance ids does not grow the table."""


class Workers:
    """Mixed into ``SqlStore`` (which sets ``namespace``, ``_db`` and ``_gc``)."""

    namespace: str | None
    _db: Database
    _gc: GroupCommit

    async def record_worker(self, instance_id: str, versions: WorkflowVersions, now: float) -> None:
        ns = self.namespace or ""
        pairs = sorted({(str(w), str(v)) for w, v in versions})
        w = workers_table
        row = {
            "namespace": ns,
            "instance_id": instance_id,
            "versions": [list(p) for p in pairs],
            "last_seen": now,
        }
        db = self._db
        insert: Any = pg_insert if db.dialect == "postgresql" else sqlite_insert
        stmt = insert(w).values(**row)
        stmt = stmt.on_conflict_do_update(
            index_elements=[w.c.namespace, w.c.instance_id],
            set_={"versions": stmt.excluded.versions, "last_seen": stmt.excluded.last_seen},
        )
        forget = sa.delete(w).where(
            w.c.namespace == ns, w.c.last_seen < now - FORGET_AFTER, w.c.instance_id != instance_id
        )

        def write() -> None:
            with db.tx() as conn:
                conn.execute(stmt)
                conn.execute(forget)

        await self._gc.call(write, read=False)

    async def workers(self) -> list[WorkerSeen]:
        w = workers_table
        q = sa.select(w).order_by(w.c.instance_id)
        if self.namespace is not None:  # (unscoped: every namespace's workers)
            q = q.where(w.c.namespace == self.namespace)
        db = self._db

        def read() -> list[WorkerSeen]:
            with db.tx(write=False) as conn:
                return [
                    WorkerSeen(
                        row.instance_id,
                        tuple((str(a), str(b)) for a, b in row.versions),
                        float(row.last_seen),
                        row.namespace or None,
                    )
                    for row in conn.execute(q)
                ]

        return await self._gc.call(read)

    async def put_workflow_schemas(self, schemas: Mapping[tuple[str, str], Any]) -> None:
        ns = self.namespace or ""
        cap = limits.payload_limit(self)
        rows: list[dict[str, Any]] = []
        for (workflow, version), doc in sorted(schemas.items(), key=lambda kv: kv[0]):
            limits.check_json("a workflow schema", doc, cap)
            rows.append(
                {"namespace": ns, "workflow": workflow, "version": version, "document": doc}
            )
        if not rows:
            return
        t = schemas_table
        db = self._db
        insert: Any = pg_insert if db.dialect == "postgresql" else sqlite_insert
        stmt = insert(t)
        stmt = stmt.on_conflict_do_update(
            index_elements=[t.c.namespace, t.c.workflow, t.c.version],
            set_={"document": stmt.excluded.document},
        )

        def write() -> None:
            with db.tx() as conn:
                conn.execute(stmt, rows)

        await self._gc.call(write, read=False)

    async def workflow_schema(
        self, workflow: str, version: str, namespace: str | None = None
    ) -> Any | None:
        t = schemas_table
        own = namespace if self.namespace is None else self.namespace  # (the run's)
        spaces = list(dict.fromkeys((own or "", "")))
        q = sa.select(t.c.namespace, t.c.document).where(
            t.c.workflow == workflow, t.c.version == version, t.c.namespace.in_(spaces)
        )
        db = self._db

        def read() -> Any | None:
            with db.tx(write=False) as conn:
                found = {row.namespace: row.document for row in conn.execute(q)}
            return next((found[ns] for ns in spaces if ns in found), None)

        return await self._gc.call(read)


__all__ = ["FORGET_AFTER", "Workers"]
