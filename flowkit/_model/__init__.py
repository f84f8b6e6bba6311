"""The workflow model: declarations, the ctx authors write against, the registry of
versions, payload types, histories and schemas (docs/architecture.md)."""
