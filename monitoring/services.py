"""Writes of the monitoring app: node heartbeats, the per-second snapshot and its broadcast."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from typing import Any

from django.conf import settings

from hpwsn_site import state
from monitoring import keys, selectors

log = logging.getLogger(__name__)

# Append a snapshot only once per second, whoever runs the task and however often.
_CLAIM_SECOND = """
local last = tonumber(redis.call('get', KEYS[1]) or '0')
if last >= tonumber(ARGV[1]) then return 0 end
redis.call('set', KEYS[1], ARGV[1], 'ex', 3600)
return 1
"""


def node_heartbeat(*, node_id: str, record: dict[str, Any], now: float) -> None:
    """Write a node's latest figures; the registry keeps one record per node."""
    record = {**record, "last": round(now, 3)}
    state.get_redis().hset(keys.NODES, node_id, json.dumps(record, separators=(",", ":")))


def node_mark_stopped(*, node_id: str, now: float) -> None:
    """Record a clean shutdown so the node shows as stopped rather than dead."""
    r = state.get_redis()
    raw = r.hget(keys.NODES, node_id)
    if raw is None:
        return
    record = json.loads(raw)
    record["stopped"] = round(now, 3)
    r.hset(keys.NODES, node_id, json.dumps(record, separators=(",", ":")))


def nodes_prune(*, now: float, older_than: float) -> int:
    """Forget nodes silent for longer than `older_than` seconds; returns how many."""
    r = state.get_redis()
    stale = [node["id"] for node in selectors.nodes_list(now=now) if node["age_s"] > older_than]
    if stale:
        r.hdel(keys.NODES, *stale)
    return len(stale)


def snapshot_publish(*, now: float | None = None) -> dict[str, Any] | None:
    """Compute this second's snapshot, keep it in the bounded history, broadcast it."""
    now = time.time() if now is None else now
    snapshot = selectors.snapshot_compute(now=now)
    r = state.get_redis()
    if not r.eval(_CLAIM_SECOND, 1, keys.LAST_SECOND, snapshot["t"]):
        return None  # this second was published already (a duplicate or late task)
    pipe = r.pipeline(transaction=False)
    pipe.rpush(keys.HISTORY, json.dumps(snapshot["point"], separators=(",", ":")))
    pipe.ltrim(keys.HISTORY, -keys.HISTORY_LEN, -1)
    pipe.set(keys.LAST, json.dumps(snapshot, separators=(",", ":")), ex=60)
    pipe.execute()
    nodes_prune(now=now, older_than=settings.HPWSN_NODE_PRUNE_AFTER_S)
    _broadcast(snapshot)
    return snapshot


def _broadcast(snapshot: dict[str, Any]) -> None:
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    # Nobody watching (no socket in the group): skip the channel layer's work altogether.
    group_key = f"{getattr(layer, 'prefix', 'asgi')}:group:{keys.GROUP}"
    if not state.get_redis().zcard(group_key):
        return
    try:
        future = asyncio.run_coroutine_threadsafe(
            layer.group_send(keys.GROUP, {"type": "monitoring.stats", "stats": snapshot}),
            _layer_loop(),
        )
        future.result(timeout=5)
    except Exception as exc:  # a dashboard that misses a second is better than a failing task
        log.warning("monitoring snapshot not broadcast: %s", exc)


_loop: asyncio.AbstractEventLoop | None = None
_loop_pid = 0
_loop_lock = threading.Lock()


def _layer_loop() -> asyncio.AbstractEventLoop:
    """One event loop per process for the channel layer, so its Redis connections are reused
    (async_to_sync would make a new loop, and a new connection, every second)."""
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="hpwsn-layer", daemon=True).start()
            _loop, _loop_pid = loop, os.getpid()
        return _loop
