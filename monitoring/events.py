"""The event log's call sites: one function per fact, one line where the fact happens.

Analysts' Spark jobs (spark/jobs/) read these files; the format is spark/eventlog.py and
docs/analytics.md. Like the counters, every call is cheap (a buffered append), never touches the
database or Redis, and is a no-op when `HPWSN_EVENTS=0` (bench/e2e.py compares both).

    from monitoring import events
    events.accepted(nid=nid, topic="ALL:ALARM", publisher="", policy="fast", size=312)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dispatch.items import item_id
from monitoring.counters import consumer_label
from spark.eventlog import EventLog, error_class

_log: EventLog | None = None
_enabled: bool | None = None


def configure(*, enabled: bool | None = None, root: Path | None = None) -> None:
    """Override the settings (tests, scripts): a new root starts a new writer."""
    global _enabled, _log
    if enabled is not None:
        _enabled = enabled
    if root is not None:
        if _log is not None:
            _log.close()
        _log = EventLog(root)


def _writer() -> EventLog | None:
    global _enabled, _log
    if _enabled is None:
        from django.conf import settings

        _enabled = bool(settings.HPWSN_EVENTS)
    if not _enabled:
        return None
    if _log is None:
        from django.conf import settings

        _log = EventLog(Path(settings.HPWSN_EVENTS_DIR), flush_s=settings.HPWSN_EVENTS_FLUSH_S)
    return _log


def flush() -> None:
    """Write the buffered lines now (a pool process leaving, a test about to read the files)."""
    if _log is not None:
        _log.flush()


def _emit(kind: str, **fields: Any) -> None:
    w = _writer()
    if w is not None:
        w.emit(kind, **fields)


def accepted(*, nid: str, accepted: Any, principal: Any) -> None:
    """A notification stored (`accepted`: services.Accepted; `principal`: acl.Principal)."""
    w = _writer()
    if w is not None:
        node = accepted.node
        w.emit(
            "accepted",
            nid=nid,
            topic=node.path,
            publisher=principal.name or "",
            policy=node.policy.reliability,
            bytes=len(accepted.content),
        )


def fragment(*, topic: str, package: Any, status: bytes, text: str | None) -> None:
    """An incoming fragment taken into its reassembly (`package`: hpwsn.fragment.Package)."""
    if status != b"duplicate":
        size = len((text or "").encode())
        ident, offset, more = package.identification, package.offset, package.more
        _emit("fragment", topic=topic, ident=ident, offset=offset, more=more, bytes=size)


def attempt(*, entry: Any, ids: list[bytes], sent: list[bytes], outcome: Any, ms: float) -> None:
    """One push of a batch to a subscription (`entry`: subscriptions.selectors.SubEntry).

    `batch` is the id of the batch's first notification: the jobs number a batch's attempts by
    time, so retries per delivered message need no counter here.
    """
    w = _writer()
    if w is None or not sent:
        return
    w.emit(
        "attempt",
        sub=entry.id,
        consumer=consumer_label(entry.consumer_address),
        batch=item_id(ids[0]) if ids else "",
        messages=len(sent),
        bytes=sum(len(f) for f in sent),
        status=outcome.status,
        error=error_class(
            ok=outcome.ok, status=outcome.status, detail=outcome.detail, permanent=outcome.permanent
        ),
        duration_ms=ms,
    )


def delivered(*, entry: Any, live: list[tuple[str, bytes]], sent_at: list[float | None]) -> None:
    """Each notification delivered, with its publish-to-delivery latency (`sent_at`: the accept
    times read from the ids, in the same order; None for an id that carries none)."""
    w = _writer()
    if w is None:
        return
    now = time.time()
    same = {"sub": entry.id, "consumer": consumer_label(entry.consumer_address)}
    w.emit_rows(
        "delivered",
        now,
        same,
        (
            (nid, None if t is None else round((now - t) * 1e6) / 1000)  # ms, 3 decimals
            for (nid, _payload), t in zip(live, sent_at, strict=True)
        ),
    )


def dead_lettered(*, entry: Any, live: list[tuple[str, bytes]], reason: str) -> None:
    w = _writer()
    if w is None:
        return
    label = consumer_label(entry.consumer_address)
    for nid, _payload in live:
        w.emit("dead_lettered", nid=nid, sub=entry.id, consumer=label, reason=reason)


def expired(*, entry: Any | None, n: int) -> None:
    """`n` messages past their time to live, found by a subscription's pump (or the fan-out)."""
    if n > 0:
        if entry is None:
            _emit("expired", messages=n)
            return
        label = consumer_label(entry.consumer_address)
        _emit("expired", sub=entry.id, consumer=label, topic=entry.topic_path, messages=n)


def dropped(*, over: dict[str, int], reason: str) -> None:
    """Messages dropped (or refused) at a depth limit: pull point id or queue key -> count."""
    for where, n in over.items():
        if n > 0:
            _emit("dropped", pullpoint=where, messages=n, reason=reason)


def refused(*, operation: str, principal: Any, exc: Any) -> None:
    """A request answered with a WSN fault (`exc`: hpwsn.errors.WsnError)."""
    reason = getattr(exc, "fault", "") or type(exc).__name__
    action = operation.rsplit("}", 1)[-1]
    _emit("refused", action=action, publisher=principal.name or "", reason=reason)


def subscription(*, sub: str, action: str, consumer: str = "", topic: str = "") -> None:
    label = consumer_label(consumer) if consumer.startswith(("http:", "https:")) else consumer
    _emit("subscription", sub=sub, action=action, consumer=label, topic=topic)


def pull(*, pullpoint: str, messages: int) -> None:
    _emit("pull", pullpoint=pullpoint, messages=messages)
