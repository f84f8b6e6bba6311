"""deploy_a_change: change a workflow in place while its runs are in flight, with ``ctx.patched``.

The first deploy of ``welcome`` (``WelcomeV1``) sends a plain welcome mail, then sleeps before
a follow-up. Two runs start and go to sleep on a SQLite file. Then the process "redeploys": the
engine stops, and a new engine running the patched code (``WelcomeV2``, the same workflow
version: a patch changes the body in place) opens the same file. It sends a personalised mail
instead, behind ``if ctx.patched("personal-mail")``. The runs already asleep had sent their
mail with the old code, so ``patched`` is False for them and they finish on the old branch;
runs started after the deploy take the new branch. Every history then replays against the
patched code. (For a deeper change, register a new ``version`` beside the old one instead:
docs/writing-workflows.md, "Versions".)

Run it with ``python samples/deploy_a_change.py``; it takes about two seconds.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from flowkit import Engine, RunStatus, WorkflowCtx, replay_async, workflow
from flowkit.stores import SqlStore


class Mailer:
    def plain(self, user: str) -> str:
        return f"Welcome, {user}."

    def personal(self, user: str) -> str:
        return f"Welcome, {user}! Here are three tips picked for you."


MAILER = Mailer()


@workflow(name="welcome")
class WelcomeV1:
    async def run(self, ctx: WorkflowCtx, user: str) -> list[str]:
        mail = await ctx.step(MAILER.plain, user)
        await ctx.sleep(1)  # the follow-up waits: the runs are in flight across the deploy
        return [mail, "follow-up sent"]


@workflow(name="welcome")
class WelcomeV2:
    async def run(self, ctx: WorkflowCtx, user: str) -> list[str]:
        if ctx.patched("personal-mail"):  # new runs: True (a patch_marker is recorded)
            mail = await ctx.step(MAILER.personal, user)
        else:  # runs that sent their mail with version 1: False, the old branch
            mail = await ctx.step(MAILER.plain, user)
        await ctx.sleep(1)
        return [mail, "follow-up sent"]


async def asleep(engine: Engine, run_id: str) -> None:
    """Wait until the run has sent its mail and sleeps."""
    while (await engine.get_run(run_id)).status is not RunStatus.SUSPENDED:  # noqa: ASYNC110
        await asyncio.sleep(0.01)


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'flowkit.db'}"

        # -- the first deploy: two runs start and sleep ------------------------------------
        async with Engine(SqlStore(url), [WelcomeV1()], poll_interval=0.05) as v1:
            for user in ("ada", "bob"):
                await v1.start("welcome", user, f"welcome-{user}")
            for user in ("ada", "bob"):
                await asleep(v1, f"welcome-{user}")
        print("deploy 1 stopped with 2 runs asleep")

        # -- the patched code is deployed on the same database ----------------------------
        async with Engine(SqlStore(url), [WelcomeV2()], poll_interval=0.05) as v2:
            await v2.start("welcome", "cy", "welcome-cy")
            took: dict[str, str] = {}
            for user in ("ada", "bob", "cy"):
                run_id = f"welcome-{user}"
                mail, _ = await v2.result(run_id, timeout=30)
                history = await v2.history(run_id)
                await replay_async(history, WelcomeV2)  # raises if the code and history disagree
                took[user] = "new" if "patch_marker" in history.types else "old"
                assert (mail == MAILER.personal(user)) == (took[user] == "new"), mail
                print(f"{run_id}: {took[user]} branch: {mail!r}")

    assert took == {"ada": "old", "bob": "old", "cy": "new"}, took
    print("ok: runs in flight kept the old branch, new runs took the patch")


if __name__ == "__main__":
    asyncio.run(main())
