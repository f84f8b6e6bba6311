"""The client layer: ``Engine`` and what it offers (results, updates, published values,
search, schedules, retry, serve, browsing) (docs/architecture.md)."""
