"""Golden histories with syrupy: ``HistorySnapshotExtension`` and ``normalize_history``.

Imported on demand (``from flowkit_testing.snapshot import ...``) so that syrupy stays an
optional, test-only dependency."""

from ._snapshot import HistorySnapshotExtension, normalize_history, render_histories

__all__ = ["HistorySnapshotExtension", "normalize_history", "render_histories"]
