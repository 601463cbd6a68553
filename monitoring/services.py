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
from monitoring import counters, keys, selectors
from monitoring.stats import CONSUMER_FIELD, TOPIC_FIELD

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


# Fold fields of the running totals into their counter's OTHER label, atomically against the
# flushes that add to them (a count added after the fold starts the field again).
_FOLD = """
for i = 1, #ARGV, 2 do
  local n = redis.call('hget', KEYS[1], ARGV[i])
  if n then
    redis.call('hdel', KEYS[1], ARGV[i])
    redis.call('hincrby', KEYS[1], ARGV[i + 1], n)
  end
end
return #ARGV / 2
"""
OTHER = "(other)"  # no topic name (an NCName) and no host name holds a parenthesis


def labels_bound(*, limit: int) -> int:
    """Keep the running totals' labelled fields (a counter by topic or by consumer) under
    `limit`: past it, each counter keeps its largest labels (its share of four fifths of the
    limit) and adds the others into its OTHER label. Consumers are whatever host:port
    subscribers name, so without a bound the totals, and every snapshot and scrape that reads
    them, grew with every new one. Returns how many fields were folded."""
    r = state.get_redis()
    if limit <= 0 or r.hlen(counters.TOTAL) <= limit:
        return 0
    groups: dict[str, list[tuple[int, str]]] = {}
    for raw, value in r.hgetall(counters.TOTAL).items():
        name = raw.decode()
        if name.startswith((TOPIC_FIELD, CONSUMER_FIELD)):
            kind, counter, label = name.split(":", 2)
            if label != OTHER:
                groups.setdefault(f"{kind}:{counter}:", []).append((int(value), name))
    labelled = sum(len(fields) for fields in groups.values())
    if labelled <= limit:
        return 0
    share = max(1, int(0.8 * limit) // len(groups))
    args: list[str] = []
    for prefix, fields in groups.items():
        fields.sort(reverse=True)
        for _n, name in fields[share:]:
            args += [name, prefix + OTHER]
    for start in range(0, len(args), 2000):  # a script's arguments a thousand fields at a time
        r.eval(_FOLD, 1, counters.TOTAL, *args[start : start + 2000])
    return len(args) // 2


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
    labels_bound(limit=settings.HPWSN_MONITORING_MAX_LABELS)
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
