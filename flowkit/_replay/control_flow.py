"""The activation's internal control flow: exceptions that unwind the body when the activation
stops early, never seen by workflow code as an outcome of its own."""

from __future__ import annotations


class _ControlFlow(BaseException):
    """Base of internal control-flow signals; a user's ``except Exception`` cannot swallow them."""


class _Evicted(_ControlFlow):
    """The activation is being torn down (suspension, lease lost, replay end)."""


class _Diverged(_ControlFlow):
    """The body diverged from its history; carries the ``NonDeterminismError``."""


class _ContinueAsNew(_ControlFlow):
    """``ctx.continue_as_new``: ends the body; the activation reports ``Continued``. A body
    that catches it (``except BaseException``) and goes on fails its run instead."""


class _StepCancelled(BaseException):
    """A step let out the ``CancelledError`` that ``request_cancel`` sent it (not one of its
    own, nor a cancellation from elsewhere): how ``steps._execute`` tells ``steps.run_step``."""
