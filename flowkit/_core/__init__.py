"""The base layer: clock, run model, payload conversion, limits and the other pieces every
layer shares (docs/architecture.md)."""
