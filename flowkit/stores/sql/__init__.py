"""``SqlStore``: the durable store on SQLAlchemy 2, on SQLite files and PostgreSQL.

``SqlStore("sqlite:///flowkit.db")`` is the embedded default; ``SqlStore(
"postgresql+psycopg://user@host/db")`` serves many workers on many hosts. docs/stores.md says
how it works; ``_store`` is where to start reading."""

from ...errors import SchemaVersionError, StoreUnavailableError, UnsupportedDatabaseError
from ._schema import SCHEMA_VERSION
from ._store import SqlStore

__all__ = [
    "SCHEMA_VERSION",
    "SchemaVersionError",
    "SqlStore",
    "StoreUnavailableError",
    "UnsupportedDatabaseError",
]
