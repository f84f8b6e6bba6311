"""The engine's worker: the activation runner and what it needs (claim, gate, cancellation,
deadlines, children, continue-as-new, recovery), and the worker loop (docs/architecture.md)."""
