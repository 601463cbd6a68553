"""Hot-path counters: a dict update under a lock, flushed to Redis every ~200 ms in one pipeline.

Importable from async and sync code alike (no ORM, no event loop). Each process adds its counts
into per-second hashes `hpwsn:mon:sec:<epoch>` (kept 5 minutes) and into the running totals
`hpwsn:mon:total`; anyone can then read rates, the last 15 minutes and latency percentiles.
Labels are bounded: topic paths and consumer host:port, never message ids.

    from monitoring import counters
    counters.incr("accepted", topic="ALL:ALARM")
    counters.observe_latency(0.012)

`HPWSN_MONITORING=0` makes every call a no-op (the benchmark compares both).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Iterable
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import redis

from monitoring.stats import (
    CONSUMER_FIELD,
    LAT_COUNT,
    LAT_FIELD,
    LAT_MAX_BUCKET,
    LAT_MIN_MS,
    LAT_SUM_US,
    LOG_STEP,
    TOPIC_FIELD,
)

log = logging.getLogger(__name__)

PREFIX = "hpwsn:mon:"
TOTAL = PREFIX + "total"
# The snapshot reads the last minute of them (the 15-minute charts are its points, kept in
# hpwsn:mon:history); five minutes leave a late reader, or an operator, the minutes before.
SECOND_TTL_S = 300
FLUSH_S = 0.2
_KEEP_ON_ERROR_S = 60  # counts of a failed flush are retried for this long, then dropped


def second_key(sec: int) -> str:
    return f"{PREFIX}sec:{sec}"


@lru_cache(maxsize=4096)
def consumer_label(address: str) -> str:
    """A bounded label for a consumer: host:port of its address, never its path or query."""
    try:
        parts = urlsplit(address)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "invalid"
    if not host:
        return "invalid"
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{port}" if port else host


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: dict[int, dict[str, int]] = {}
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.client: Any = None


_state = _State()
_enabled: bool | None = None
_redis_url: str | None = None


def configure(*, enabled: bool | None = None, redis_url: str | None = None) -> None:
    """Override the settings (tests, scripts); None keeps the current value."""
    global _enabled, _redis_url
    if enabled is not None:
        _enabled = enabled
    if redis_url is not None:
        _redis_url = redis_url
        _state.client = None


def enabled() -> bool:
    global _enabled
    if _enabled is None:
        try:
            from django.conf import settings

            _enabled = bool(getattr(settings, "HPWSN_MONITORING", True))
        except Exception:  # settings not configured: a script outside Django
            # Late: importing the hpwsn_site package sets up its Celery app and settings module.
            from hpwsn_site.env import env_bool

            _enabled = env_bool("HPWSN_MONITORING", True)
    return _enabled


def _add(fields: dict[str, int], key: str, n: int) -> None:
    fields[key] = fields.get(key, 0) + n


def incr(name: str, n: int = 1, *, topic: str | None = None, consumer: str | None = None) -> None:
    """Count `n` events `name`, optionally per topic path and per consumer address."""
    if not (_enabled if _enabled is not None else enabled()) or n == 0:
        return
    sec = int(time.time())
    with _state.lock:
        fields = _state.pending.get(sec)
        if fields is None:
            fields = _state.pending[sec] = {}
        _add(fields, name, n)
        if topic is not None:
            _add(fields, f"{TOPIC_FIELD}{name}:{topic}", n)
        if consumer is not None:
            _add(fields, f"{CONSUMER_FIELD}{name}:{consumer_label(consumer)}", n)
    if _state.thread is None:
        _start()


def observe_latency(seconds: float) -> None:
    """Record one publish-to-delivery latency."""
    observe_latencies((seconds,))


_LAT_KEYS = [f"{LAT_FIELD}{b}" for b in range(LAT_MAX_BUCKET + 1)]
_INV_STEP = 1.0 / LOG_STEP


def observe_latencies(values: Iterable[float]) -> None:
    """Record many latencies (seconds) under one lock."""
    if not (_enabled if _enabled is not None else enabled()):
        return
    # latency_bucket() inlined: this runs for every delivered message.
    log, keys, top, scale = math.log, _LAT_KEYS, LAT_MAX_BUCKET, 1000.0 / LAT_MIN_MS
    sec = int(time.time())
    count = 0
    total = 0.0
    with _state.lock:
        fields = _state.pending.get(sec)
        if fields is None:
            fields = _state.pending[sec] = {}
        for seconds in values:
            x = seconds * scale
            key = keys[min(top, int(log(x) * _INV_STEP)) if x > 1.0 else 0]
            fields[key] = fields.get(key, 0) + 1
            count += 1
            if seconds > 0:
                total += seconds
        if count:
            _add(fields, LAT_COUNT, count)
            _add(fields, LAT_SUM_US, int(total * 1_000_000))
    if _state.thread is None:
        _start()


def _client() -> Any:
    if _state.client is None:
        if _redis_url is not None:
            client = redis.Redis.from_url(_redis_url, socket_timeout=5, health_check_interval=30)
        else:
            # Late, as above: a script that configured a Redis URL never loads the site.
            from hpwsn_site.state import redis_target

            client = redis_target().client(socket_timeout=5, health_check_interval=30)
        _state.client = client
    return _state.client


def flush() -> int:
    """Write the pending counts to Redis in one pipeline; returns the number of fields written."""
    with _state.lock:
        pending, _state.pending = _state.pending, {}
    if not pending:
        return 0
    written = 0
    try:
        pipe = _client().pipeline(transaction=False)
        for sec, fields in pending.items():
            key = second_key(sec)
            for field, n in fields.items():
                pipe.hincrby(key, field, n)
                pipe.hincrby(TOTAL, field, n)
                written += 1
            pipe.expire(key, SECOND_TTL_S)
        pipe.execute()
    except Exception as exc:
        # Redis is away: keep recent counts for the next flush rather than losing them.
        log.warning("monitoring counters not flushed: %s", exc)
        horizon = int(time.time()) - _KEEP_ON_ERROR_S
        with _state.lock:
            for sec, fields in pending.items():
                if sec < horizon:
                    continue
                mine = _state.pending.setdefault(sec, {})
                for field, n in fields.items():
                    mine[field] = mine.get(field, 0) + n
        return 0
    return written


def _run(stop: threading.Event) -> None:
    while not stop.wait(FLUSH_S):
        with contextlib.suppress(Exception):
            flush()


def _start() -> None:
    with _state.lock:
        if _state.thread is not None:
            return
        thread = threading.Thread(
            target=_run, args=(_state.stop,), name="hpwsn-counters", daemon=True
        )
        _state.thread = thread
    thread.start()


def _after_fork_in_child() -> None:
    # A forked child (Celery's prefork pool) inherits the parent's pending counts but not its
    # flusher thread: start empty, or the parent's counts would be written twice.
    global _state
    _state = _State()


def _flush_at_exit() -> None:
    """Stop the flusher, then write what is left. A daemon thread still running when the
    interpreter shuts down is frozen where it stands, maybe holding the lock of the Redis
    client's connection pool; the client's finalizer then waits for that lock, and the process
    never exits."""
    stop_thread(_state.thread, _state.stop)
    with contextlib.suppress(Exception):
        flush()


def stop_thread(thread: threading.Thread | None, stop: threading.Event) -> None:
    """Ask a background thread to end and wait for it, a little longer than the Redis client's
    socket timeout (5 s) at most."""
    stop.set()
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout=6)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_flush_at_exit)
