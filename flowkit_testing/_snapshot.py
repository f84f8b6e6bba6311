"""Golden histories with syrupy: ``HistorySnapshotExtension`` and ``normalize_history``.

A history is rendered as JSON with one event per line, and with the values that change from
one run of a test to the next normalized away, so the snapshot only changes when what the
workflow *records* changes:

* times (``at``, ``timer_started.fire_at``, ``step_failed.retry_at``) become offsets from the
  run's ``run_started`` in seconds, rounded to the millisecond: ``"t+60"``, ``"t+1.25"``;
* the jittered re-check time of ``singleton_gated`` becomes ``"~at+1s"`` (any value inside
  the documented 1 s ± 250 ms window; anything else shows its exact offset, ``"at+5"``);
* UUIDs inside payloads and messages become ``"<uuid-1>"``, ``"<uuid-2>"``... numbered by first
  appearance (equal UUIDs keep equal placeholders); run ids are kept;
* step argument digests (which hash whatever the arguments hold, random values included)
  become ``"<args-1>"``, ``"<args-2>"``... numbered by first appearance, so the attempts of one
  call still show the same arguments;
* memory addresses in messages (``0x7f3a...``) become ``"0x<addr>"``;
* dict keys inside payloads are sorted (a PostgreSQL ``JSONB`` column reorders them).

Everything else (``seq``, types, step names, positions, inputs, results, signal payloads,
errors) stays as recorded."""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from syrupy.extensions.json import JSONSnapshotExtension
from syrupy.types import PropertyFilter, PropertyMatcher, SerializableData, SerializedData

from flowkit import History
from flowkit._worker.gate import GATE_JITTER, GATE_RETRY
from flowkit.events import Event, event_to_json

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")
_HEAD = ("seq", "type", "at")


def _seconds(delta: float) -> str:
    text = f"{round(delta, 3):.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _offset(t: float, origin: float, prefix: str = "t") -> str:
    delta = t - origin
    return f"{prefix}-{_seconds(-delta)}" if delta < -0.0005 else f"{prefix}+{_seconds(delta)}"


class _Normalizer:
    """Normalizes one or several histories; UUID placeholders are shared across them."""

    def __init__(self, keep: Sequence[str] = ()) -> None:
        self._uuids: dict[str, str] = {k.lower(): k for k in keep if _UUID.fullmatch(k)}
        self._count = 0
        self._digests: dict[str, str] = {}

    def _uuid(self, m: re.Match[str]) -> str:
        key = m.group(0).lower()
        if key not in self._uuids:
            self._count += 1
            self._uuids[key] = f"<uuid-{self._count}>"
        return self._uuids[key]

    def digest(self, d: str) -> str:
        if d not in self._digests:
            self._digests[d] = f"<args-{len(self._digests) + 1}>"
        return self._digests[d]

    def text(self, s: str) -> str:
        return _ADDRESS.sub("0x<addr>", _UUID.sub(self._uuid, s))

    def value(self, v: Any) -> Any:
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, Mapping):
            return {str(k): self.value(v[k]) for k in sorted(v, key=str)}
        if isinstance(v, list | tuple):
            return [self.value(x) for x in v]
        return v

    def event(self, ev: Event, origin: float) -> dict[str, Any]:
        raw = event_to_json(ev)
        out: dict[str, Any] = {"seq": raw.pop("seq"), "type": raw.pop("type")}
        out["at"] = _offset(raw.pop("at"), origin)
        for key in sorted(raw):
            value = raw[key]
            if key == "retry_at" and value is not None and out["type"] == "singleton_gated":
                delta = value - ev.at
                jittered = abs(delta - GATE_RETRY) <= GATE_JITTER + 0.0005
                out[key] = (
                    f"~at+{_seconds(GATE_RETRY)}s" if jittered else _offset(value, ev.at, "at")
                )
            elif key == "args_digest" and isinstance(value, str):
                out[key] = self.digest(value)
            elif key in ("fire_at", "retry_at") and isinstance(value, int | float):
                out[key] = _offset(value, origin)
            else:
                out[key] = self.value(value)
        return out

    def history(
        self, history: History | Sequence[Event], origin: float | None
    ) -> list[dict[str, Any]]:
        events = list(history)
        if origin is None:
            origin = _origin(events)
        return [self.event(ev, origin) for ev in events]


def _origin(events: Sequence[Event]) -> float:
    first = next((e for e in events if e.type == "run_started"), events[0] if events else None)
    return first.at if first is not None else 0.0


def normalize_history(
    history: History | Sequence[Event], *, origin: float | None = None
) -> list[dict[str, Any]]:
    """The events of ``history`` as dicts (``seq``, ``type``, ``at`` first, then the payload
    fields in sorted order), with volatile values normalized (see the module docstring).

    Times are offsets from ``origin``, by default the ``at`` of the run's ``run_started``."""
    keep = [history.run_id] if isinstance(history, History) else []
    return _Normalizer(keep).history(history, origin)


def _histories(data: Any) -> list[tuple[str | None, History]] | None:
    """``data`` as labelled histories: a ``History``, a sequence or a mapping of them."""
    if isinstance(data, History):
        return [(None, data)]
    if isinstance(data, Mapping) and data and all(isinstance(v, History) for v in data.values()):
        return [(str(k), v) for k, v in data.items()]
    if (
        isinstance(data, Sequence)
        and not isinstance(data, str | bytes)
        and data
        and all(isinstance(v, History) for v in data)
    ):
        return [(None, v) for v in data]
    return None


def _documents(data: Any) -> Any:
    """The normalized documents of one history (a dict), a sequence (a list) or a mapping
    (label -> dict); ordered dicts, so syrupy's filters keep the field order."""
    found = _histories(data)
    if found is None:
        raise TypeError(f"expected a flowkit History (or a list or dict of them), got {data!r}")
    norm = _Normalizer([h.run_id for _, h in found])
    origin = None if isinstance(data, History) else min(_origin(list(h)) for _, h in found)
    docs = [
        OrderedDict(
            run_id=h.run_id,
            events=[OrderedDict(e) for e in norm.history(h, origin)],
        )
        for _, h in found
    ]
    if isinstance(data, History):
        return docs[0]
    if isinstance(data, Mapping):
        return OrderedDict((label, doc) for (label, _), doc in zip(found, docs, strict=True))
    return docs


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _pretty(value: Any, pad: str = "", key: str | None = None) -> str:
    """JSON like ``json.dumps(indent=2)``, except that the items of an ``events`` list are
    written one per line."""
    inner = pad + "  "
    if isinstance(value, Mapping) and value:
        items = [f"{inner}{_dumps(str(k))}: {_pretty(v, inner, str(k))}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and value:
        if key == "events":
            items = [inner + _dumps(v) for v in value]
        else:
            items = [inner + _pretty(v, inner) for v in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return _dumps(value)


def render_histories(data: History | Sequence[History] | Mapping[str, History]) -> str:
    """The snapshot text of one history, a list of them, or a mapping label -> history.

    Several histories share one time origin (the earliest ``run_started``) and one UUID
    numbering, so the snapshot shows how the runs interleave."""
    return _pretty(_documents(data)) + "\n"


class HistorySnapshotExtension(JSONSnapshotExtension):
    """A syrupy extension for flowkit histories: one ``.json`` file per snapshot, one event per
    line, volatile values normalized (see ``normalize_history``).

    Use it with ``snapshot.use_extension(HistorySnapshotExtension)``, or through the
    ``history_snapshot`` fixture of flowkit's pytest plugin, and put the snapshot on the
    left: ``assert history_snapshot == history``. It takes a ``History``, a list of histories
    or a dict label -> history; syrupy's ``exclude``/``include``/``matcher`` options apply to
    the normalized events (``exclude=props("args_digest")``). Anything else is serialized as
    syrupy's JSON extension does."""

    def serialize(
        self,
        data: SerializableData,
        *,
        exclude: PropertyFilter | None = None,
        include: PropertyFilter | None = None,
        matcher: PropertyMatcher | None = None,
    ) -> SerializedData:
        if _histories(data) is None:
            return super().serialize(data, exclude=exclude, include=include, matcher=matcher)
        filtered = self._filter(
            data=_documents(data),
            depth=0,
            path=(),
            exclude=exclude,
            include=include,
            matcher=matcher,
        )
        return _pretty(filtered) + "\n"


__all__ = ["HistorySnapshotExtension", "normalize_history", "render_histories"]
