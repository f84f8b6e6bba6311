"""What the ``flowkit`` subcommands share: ``CliError`` (a user-facing error, printed as one
line with exit status 2) and ``import_attr`` (the object a ``MODULE:ATTR`` option names)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def import_attr(spec: str, form: str) -> Any:
    """The object ``MODULE:ATTR`` names, the working directory importable (as for ``python
    -m``); ``CliError`` when it cannot be found. ``form`` says how the value should look (the
    start of the message for one without a colon)."""
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise CliError(f"{form}, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(mod_name)
    except Exception as exc:
        raise CliError(f"cannot import {mod_name!r}: {type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise CliError(f"{mod_name!r} has no attribute {attr!r}")
    return obj


__all__ = ["CliError", "import_attr"]
