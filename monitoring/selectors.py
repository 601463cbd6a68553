"""Reads of the monitoring app: counters windows, queue depths, the node registry, health."""

from __future__ import annotations

import asyncio
import heapq
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from directory.selectors import directory_health
from dispatch.models import DeadLetter
from hpwsn_site import state
from hpwsn_site.soapcall import DbThread
from monitoring import keys
from monitoring.counters import FLUSH_S, TOTAL, consumer_label, second_key
from monitoring.stats import (
    ALIVE,
    NAMES,
    Window,
    last_complete_second,
    node_state,
    pivot,
    top_n,
    window,
)
from subscriptions.models import PullPoint
from subscriptions.selectors import resource_tag, subscription_index

MINUTE = 60
TABLE_ROWS = 10
_ROLE_ORDER = {"web": 0, "worker": 1, "beat": 2}


# ----------------------------------------------------------------------------- nodes


def nodes_from_records(
    raw: Mapping[bytes | str, bytes | str], *, now: float
) -> list[dict[str, Any]]:
    """Node records with their state, age and uptime, web first, then workers, then beat."""
    nodes = []
    for value in raw.values():
        try:
            rec: dict[str, Any] = json.loads(value)
        except ValueError:
            continue
        last = float(rec.get("last", 0.0))
        stopped = rec.get("stopped")
        age = now - last
        rec["state"] = node_state(
            age=age,
            interval=float(rec.get("interval") or settings.HPWSN_HEARTBEAT_S),
            dead_after=float(rec.get("dead_after") or settings.HPWSN_NODE_DEAD_AFTER_S),
            stopped=stopped is not None,
        )
        rec["age_s"] = round(max(age, 0.0), 1)
        end = now if rec["state"] == ALIVE else float(stopped or last)
        rec["uptime_s"] = round(max(end - float(rec.get("started", end)), 0.0), 1)
        nodes.append(rec)
    nodes.sort(key=lambda n: (_ROLE_ORDER.get(n.get("role", ""), 9), n.get("host", ""), n["pid"]))
    return nodes


def nodes_list(*, now: float) -> list[dict[str, Any]]:
    """Every registered node (dead ones included until pruned)."""
    return nodes_from_records(state.get_redis().hgetall(keys.NODES), now=now)


# ----------------------------------------------------------------------------- queues


# The messages queued for each subscription ARGV[3..] names: its default priority queue
# (ARGV[1] .. id .. ':' .. ARGV[2]) and those of the priorities `state.PRIOS` (KEYS[1]) records
# for it; all ten in a Redis filled before that record (no field '*').
_DEPTHS = """
local qp, dp, out = ARGV[1], ARGV[2], {}
local full = redis.call('hexists', KEYS[1], '*') == 0
for i = 3, #ARGV do
  local sid = ARGV[i]
  local n = redis.call('llen', qp .. sid .. ':' .. dp)
  local others = redis.call('hget', KEYS[1], sid) or ''
  if full then others = '0123456789' end
  for q in string.gmatch(others, '%d') do
    if q ~= dp then n = n + redis.call('llen', qp .. sid .. ':' .. q) end
  end
  out[#out + 1] = n
end
return out
"""


@dataclass(frozen=True, slots=True)
class SubscriptionDepths:
    subscriptions: int  # push subscriptions
    messages: int  # queued for them
    deepest: list[tuple[int, str, str]]  # (depth, id, consumer label), the deepest first
    top: int = 0  # the most rows `deepest` could have
    at: float = 0.0  # when measured (monotonic seconds)
    cost: float = 0.0  # how long the measure took (seconds)


_measured: SubscriptionDepths | None = None  # this process's last measure, for `share`


def subscription_depths(*, top: int, share: float = 0.0) -> SubscriptionDepths:
    """The messages queued for the push subscriptions, the deepest `top` of them.

    With `share` > 0 the last measure is given again until the time since it is `1 / share`
    times what it cost, so that at most that share of the process's time goes to measuring: ten
    thousand busy subscriptions cost tens of milliseconds of Redis and Python a measure, and
    the dashboard's snapshot asks every second.
    """
    global _measured
    last = _measured
    started = time.monotonic()
    if share > 0 and last is not None and last.top >= top and started - last.at < last.cost / share:
        return last
    index = subscription_index(max_age=5.0)
    by_id = {e.id: e for e in index.by_id.values() if e.mode == "push"}
    r = state.get_redis()
    # Only the busy subscriptions can have anything queued (the fan-out adds a subscription to
    # the set with its first message): their depths are summed in Redis, a thousand at a time.
    busy = [sid for raw in r.smembers(state.BUSY) if (sid := raw.decode()) in by_id]
    depths: list[int] = []
    for i in range(0, len(busy), 1000):
        depths += r.eval(
            _DEPTHS, 1, state.PRIOS, state.QUEUE_PREFIX, state.DEFAULT_PRIORITY, *busy[i : i + 1000]
        )
    # The deepest first; only the rows shown get their consumer's label.
    deepest = [
        (-minus, e.id, consumer_label(e.consumer_address))
        for minus, _sid, e in heapq.nsmallest(
            top,
            ((-int(d), sid, by_id[sid]) for sid, d in zip(busy, depths, strict=True) if d),
            key=lambda row: row[:2],
        )
    ]
    done = time.monotonic()
    _measured = SubscriptionDepths(
        len(by_id), sum(int(d) for d in depths), deepest, top, done, done - started
    )
    return _measured


def queue_depths(*, top: int = TABLE_ROWS, share: float = 0.0) -> dict[str, Any]:
    """Celery/ingest backlogs, subscription queues (deepest first), pull points, dead letters.
    `share`: see subscription_depths."""
    pull_ids = [
        str(pp)
        for pp in PullPoint.objects.filter(destroyed_at__isnull=True).values_list("id", flat=True)
    ]
    r = state.get_redis()
    pipe = r.pipeline(transaction=False)
    pipe.llen("celery")
    pipe.llen(state.INGEST)
    pipe.zcard(state.RETRY)
    for pp in pull_ids:
        pipe.llen(state.pullpoint_key(pp))
    res = pipe.execute()
    celery, ingest, retries = (int(x) for x in res[:3])
    pulls = res[3:]
    subs = subscription_depths(top=top, share=share)
    pullpoints = sorted(
        ((int(d), pp) for pp, d in zip(pull_ids, pulls, strict=True) if d),
        key=lambda row: (-row[0], row[1]),
    )
    return {
        "celery": celery,
        "ingest": ingest,
        "retries_waiting": retries,
        "subscriptions": subs.subscriptions,
        "subscription_messages": subs.messages,
        # Ids are in the addresses that act on them: shown as tags (resource_tag), never as is.
        "deepest": [
            {"subscription": resource_tag(sid), "consumer": label, "depth": d}
            for d, sid, label in subs.deepest[:top]
        ],
        "pullpoint_count": len(pull_ids),
        "pullpoint_messages": sum(int(d) for d in pulls),
        "pullpoints": [{"pullpoint": resource_tag(pp), "depth": d} for d, pp in pullpoints[:top]],
        "dead_letters": DeadLetter.objects.filter(redriven_at__isnull=True).count(),
    }


# ----------------------------------------------------------------------------- counters


@dataclass(frozen=True, slots=True)
class Windows:
    second: int  # the last complete second
    last_second: Window
    minute: Window
    total: Window
    nodes: list[dict[str, Any]]


def counter_windows(*, now: float) -> Windows:
    """The last complete second, the last minute and the running totals, plus the nodes."""
    last = last_complete_second(now, flush_s=FLUSH_S)
    pipe = state.get_redis().pipeline(transaction=False)
    for sec in range(last - MINUTE + 1, last + 1):
        pipe.hgetall(second_key(sec))
    pipe.hgetall(TOTAL)
    pipe.hgetall(keys.NODES)
    res = pipe.execute()
    return Windows(
        second=last,
        last_second=Window().add(res[MINUTE - 1]),
        minute=window(res[:MINUTE]),
        total=Window().add(res[MINUTE]),
        nodes=nodes_from_records(res[MINUTE + 1], now=now),
    )


def snapshot_compute(*, now: float) -> dict[str, Any]:
    """Everything the dashboard shows for one second."""
    w = counter_windows(now=now)
    queues = queue_depths(share=settings.HPWSN_PERIODIC_SHARE)
    per_second = {n: w.last_second.count(n) for n in NAMES}
    per_minute = {n: w.minute.count(n) for n in NAMES}
    latency: dict[str, Any] = {**w.minute.quantiles(), "count": w.minute.latency_count}
    topic_rows = pivot(
        ("per_minute", w.minute.topics.get("accepted", {})),
        ("total", w.total.topics.get("accepted", {})),
    )
    consumer_rows = pivot(
        ("failed_per_minute", w.minute.consumers.get("failed", {})),
        ("delivered_per_minute", w.minute.consumers.get("delivered", {})),
        *((name, w.total.consumers.get(name, {})) for name in ("failed", "retried", "dead")),
        ("delivered", w.total.consumers.get("delivered", {})),
    )
    by_state: dict[str, int] = {}
    for node in w.nodes:
        by_state[node["state"]] = by_state.get(node["state"], 0) + 1
    point = {
        "t": w.second,
        "in": per_second["accepted"],
        "out": per_second["delivered"],
        "fail": per_second["failed"],
        "retry": per_second["retried"],
        "dead": per_second["dead"],
        "exp": per_second["expired"],
        "p50": latency["p50"],
        "p95": latency["p95"],
        "p99": latency["p99"],
        "q": queues["subscription_messages"],
        "cq": queues["celery"],
        "rw": queues["retries_waiting"],
    }
    return {
        "t": w.second,
        "generated_at": round(now, 3),
        "enabled": bool(settings.HPWSN_MONITORING),
        "per_second": per_second,
        "per_minute": per_minute,
        "totals": {n: w.total.count(n) for n in NAMES},
        "latency_ms": latency,
        "queues": queues,
        "topics": [
            {"topic": label, **row}
            for label, row in top_n(topic_rows, key=("per_minute", "total"), n=TABLE_ROWS)
        ],
        "consumers": [
            {"consumer": label, **row}
            for label, row in top_n(
                consumer_rows,
                key=("failed_per_minute", "failed", "dead", "delivered_per_minute"),
                n=TABLE_ROWS,
            )
        ],
        "nodes": w.nodes,
        "nodes_by_state": by_state,
        "point": point,
    }


def metrics_data(*, now: float, top: int) -> dict[str, Any]:
    """What /metrics exposes: totals (top-N labels by total), gauges, latency quantiles."""
    w = counter_windows(now=now)
    topic_rows = pivot(("accepted", w.total.topics.get("accepted", {})))
    consumer_rows = pivot(
        *((name, w.total.consumers.get(name, {})) for name in ("failed", "delivered", "dead"))
    )
    return {
        "totals": {n: w.total.count(n) for n in NAMES},
        "topics": top_n(topic_rows, key=("accepted",), n=top),
        "consumers": top_n(consumer_rows, key=("failed", "dead", "delivered"), n=top),
        "latency": {
            "quantiles": w.minute.quantiles(),
            "count": w.total.latency_count,
            "sum_s": w.total.latency_sum_us / 1_000_000,
        },
        "queues": queue_depths(top=top),
        "nodes": w.nodes,
        "filter_errors": filter_errors(top=top),
    }


def filter_errors(*, top: int) -> list[tuple[str, int]]:
    """Subscriptions whose content filter failed at evaluation, most failures first; by tag
    (resource_tag), never by id: the id is in the address that acts on the subscription."""
    counts = state.get_redis().hgetall(state.FILTER_ERRORS)
    rows = sorted(((k.decode(), int(v)) for k, v in counts.items()), key=lambda r: (-r[1], r[0]))
    return [(resource_tag(sid), n) for sid, n in rows[:top]]


# ----------------------------------------------------------------------------- dashboard


async def history_aget() -> list[dict[str, Any]]:
    """The last 15 minutes of one-second points, oldest first."""
    raw = await state.get_async_redis().lrange(keys.HISTORY, 0, -1)
    return [json.loads(x) for x in raw]


async def last_snapshot_aget() -> dict[str, Any] | None:
    raw = await state.get_async_redis().get(keys.LAST)
    return None if raw is None else dict(json.loads(raw))


# ----------------------------------------------------------------------------- health


# The checks that read the database run on a thread of their own, which keeps its connection
# (replaced when older than CONN_MAX_AGE or broken). On the thread Django gives each request they
# opened one for every probe of a load balancer: on PostgreSQL, a server process started and
# stopped each time.
_health_thread = DbThread("hpwsn-health")


def _on_health_thread(check: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
    return lambda: _health_thread.run(check)


def _database_ping() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


async def _timed(check: Callable[[], Awaitable[Any]], limit_s: float) -> tuple[bool, Any, float]:
    t0 = time.perf_counter()
    try:
        value = await asyncio.wait_for(check(), limit_s)
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"[:300], time.perf_counter() - t0
    return True, value, time.perf_counter() - t0


async def health_check(*, limit_s: float = 2.0) -> dict[str, Any]:
    """Database, Redis, live workers and beat, directory: ok / degraded / down."""
    checks: dict[str, dict[str, Any]] = {}
    db_ok, db_err, db_t = await _timed(_on_health_thread(_database_ping), limit_s)
    checks["database"] = {"status": "ok" if db_ok else "fail", "ms": round(db_t * 1000, 1)}
    if not db_ok:
        checks["database"]["error"] = db_err
    redis = state.get_async_redis()
    r_ok, r_val, r_t = await _timed(redis.ping, limit_s)
    checks["redis"] = {"status": "ok" if r_ok else "fail", "ms": round(r_t * 1000, 1)}
    if not r_ok:
        checks["redis"]["error"] = r_val
    nodes: list[dict[str, Any]] = []
    if r_ok:
        n_ok, raw, _t = await _timed(lambda: redis.hgetall(keys.NODES), limit_s)
        nodes = nodes_from_records(raw, now=time.time()) if n_ok else []
    for role, name in (("worker", "workers"), ("beat", "beat")):
        alive = [n for n in nodes if n.get("role") == role and n["state"] == ALIVE]
        if not r_ok:
            checks[name] = {"status": "unknown"}
        else:
            checks[name] = {"status": "ok" if alive else "fail", "alive": len(alive)}
    # The LDAP directory (docs/directory.md): the broker serves from its database while the
    # directory is away, so a directory problem degrades, never downs, the broker.

    d_ok, d_val, _t = await _timed(_on_health_thread(directory_health), limit_s)
    checks["directory"] = d_val if d_ok else {"status": "degraded", "error": d_val}
    if not (db_ok and r_ok):
        status = "down"
    elif any(checks[c]["status"] != "ok" for c in ("workers", "beat")) or checks["directory"][
        "status"
    ] not in ("ok", "not_configured"):
        status = "degraded"
    else:
        status = "ok"
    return {"status": status, "checks": checks}
