"""Writes the data files the documentation's snippets read, into the current directory:

* ``report-1.json``: the history of a ``DailyReport`` run parked in its one-hour sleep, as
  ``flowkit history report-1 --json`` exports it (docs/debugging.md);
* ``tests/histories/``: golden histories of ``myapp.quotes``, recorded by the current code
  (docs/debugging.md, "Golden histories in CI")."""

from __future__ import annotations

import asyncio
from pathlib import Path

from myapp.quotes import Catalog, Greeting, Quote
from myapp.workflows import DailyReport

from flowkit_testing import TestEnv


async def histories() -> dict[str, str]:
    """The JSON of each history, by the file it goes to."""
    files = {}
    async with TestEnv([DailyReport()]) as env:
        await env.start("daily-report", "2026-03-01", "report-1")
        files["report-1.json"] = (await env.history("report-1")).to_json()
    async with TestEnv([Quote(Catalog()), Greeting()]) as env:
        for run_id, wf, inp in (
            ("quote-pen", "quote", "pen"),
            ("quote-desk", "quote", "desk"),
            ("greeting-ann", "greeting", "Ann"),
        ):
            await env.start(wf, inp, run_id)
            await env.result(run_id)
            files[f"tests/histories/{run_id}.json"] = (await env.history(run_id)).to_json()
    return files


if __name__ == "__main__":
    for name, text in asyncio.run(histories()).items():
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_text(text)
