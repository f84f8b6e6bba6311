"""``SqlStore``: the durable store on SQLAlchemy 2 (SQLite files and PostgreSQL).

``SqlStore("sqlite:///flowkit.db")`` is the embedded default; ``SqlStore(
"postgresql+psycopg://user@host/db")`` serves many workers on many hosts. See ``_store`` for
the locking scheme and ``_schema`` for the tables."""

from ._schema import (
    SCHEMA_VERSION,
    SchemaVersionError,
    StoreUnavailableError,
    UnsupportedDatabaseError,
)
from ._store import SqlStore

__all__ = [
    "SCHEMA_VERSION",
    "SchemaVersionError",
    "SqlStore",
    "StoreUnavailableError",
    "UnsupportedDatabaseError",
]
