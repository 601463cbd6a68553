"""The pump: one subscription's queue pushed to its consumer in order, under a fenced lease.

One pump at a time drains a subscription. It holds a lease (`state.lease_key`) whose value is
its own random token, the fence: renewing the lease, taking a pushed batch off the queue and
releasing the lease are each one Redis script that first checks the token, and taking a batch
also checks that the queue's head still holds exactly the items that were pushed. A pump that
lost its lease (it stalled past the lease, the safety net started another) stops without
touching the queue: what it pushed meanwhile is pushed again by the new owner (at-least-once),
never trimmed unsent.

While a push is in flight the lease is renewed in the background (`LeaseKeeper`), so a slow
consumer, a UseRaw batch of a hundred POSTs or a fragmented push never lets a second pump in;
only a process that stops running (killed, frozen) loses its lease.

`Pump.step()` does one batch: `next_batch()`, `push()`, then `delivered()` or `failed()`. The
delivery simulation test (tests/dispatch/test_simulation.py) drives these phases one by one,
interleaved with the fan-out, the checkpoint and a Redis loss.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from dispatch import flow
from dispatch.bodies import RELEASE_LUA
from dispatch.deliver import (
    ATTEMPT,
    ATTEMPTS_END,
    ATTEMPTS_LUA,
    UNORDERED_FAILURES_IN_A_ROW,
    batch_size,
    dead_letter_store,
    deliver,
    flow_wait,
    ordered,
    retry_delay,
    retry_schedule,
    throttles,
)
from dispatch.ids import notification_id_time
from dispatch.items import item_id, letter_rows
from dispatch.models import DeadLetter
from dispatch.push import Outcome
from dispatch.ready import pumps_ready
from dispatch.selectors import Limits, consumer_limits, consumer_limits_cached
from dispatch.services import RELEASE, RENEW, STATS
from hpwsn_site import state
from hpwsn_site.dblane import on_db
from monitoring import counters, events
from subscriptions.selectors import (
    SubEntry,
    subscription_gone,
    subscription_index,
    subscription_index_cached,
)
from subscriptions.services import subscription_suspend

log = logging.getLogger(__name__)

# The next batch and its bodies, as a Lua function the scripts below share: the first batch set
# aside that is due (a zset scored by due time), else up to `size` items from the highest-priority
# queue that has any, cut after the item that brings the batch to `cap` bytes of payload (always
# one item at least). Payload keys are `prefix .. '<id>'`; a missing payload (expired) is '' (a
# stored one never is) and weighs nothing. Returns {source, items, bodies}: source 0 for a batch
# set aside (items: its member), i for the i-th queue, -1 for nothing. Nothing ends the run in
# the same step: the pump's scheduled mark goes (whatever the fan-out queues afterwards finds it
# unset and makes the subscription ready again), the lease is let go if this pump still holds it,
# and the first batch set aside is registered for its due time.
_NEXT_LUA = """
local function next_batch(k, a)
  -- k: aside, marks, lease, aside_due, queues...; a: size, now, cap, prefix, token, sid
  local due = redis.call('zrangebyscore', k[1], '-inf', a[2], 'LIMIT', 0, 1)
  if #due > 0 then
    local found = {}
    for n, item in ipairs(cjson.decode(due[1])['items']) do
      found[n] = redis.call('get', a[4] .. string.match(item, '^([^|]*)')) or ''
    end
    return {0, due, found}
  end
  local cap = tonumber(a[3])
  for i = 5, #k do
    local items = redis.call('lrange', k[i], 0, tonumber(a[1]) - 1)
    if #items > 0 then
      local out, found, size = {}, {}, 0
      for n, item in ipairs(items) do
        local body = redis.call('get', a[4] .. string.match(item, '^([^|]*)')) or ''
        out[n] = item
        found[n] = body
        size = size + #body
        if size >= cap then break end
      end
      return {i - 4, out, found}
    end
  end
  redis.call('hdel', k[2], a[6])
  if redis.call('get', k[3]) == a[5] then redis.call('del', k[3]) end
  local first = redis.call('zrange', k[1], 0, 0, 'WITHSCORES')
  if #first > 0 then redis.call('zadd', k[4], first[2], a[6]) end
  return {-1, {}, {}}
end
"""

# The next batch of a pump that holds its lease. KEYS: aside, marks, lease, aside_due, queues...;
# ARGV: size, now, cap, payload prefix, token, sid.
_NEXT = state.Script(_NEXT_LUA + "return next_batch(KEYS, ARGV)")

# The start of a run, in one call: nothing when the markers of the process's caches the pump
# decided on moved ({-4}: read them and start again), the subscription backs off (its retry is
# due later: {-2}) or another pump holds the lease ({-3}); else the lease is taken and the first
# batch read, as `_NEXT`. KEYS as `_NEXT`, then the retry zset, then the m marker keys; ARGV as
# `_NEXT`, then lease ms, m, and the m values the markers had ('' for absent).
_BEGIN = state.Script(
    _NEXT_LUA
    + """
local m = tonumber(ARGV[8])
local last = #KEYS - m
if m > 0 then
  local now = redis.call('mget', unpack(KEYS, last + 1, #KEYS))
  for i = 1, m do
    if (now[i] or '') ~= ARGV[8 + i] then return {-4} end
  end
end
local retry = redis.call('zscore', KEYS[last], ARGV[6])
if retry and tonumber(retry) > tonumber(ARGV[2]) then return {-2} end
if not redis.call('set', KEYS[3], ARGV[5], 'NX', 'PX', ARGV[7]) then return {-3} end
local queues = {}
for i = 1, last - 1 do queues[i] = KEYS[i] end
return next_batch(queues, ARGV)
"""
)


# Take a pushed (or dead-lettered, or set aside) batch off where it was read, only for the lease
# holder and only if it is still there: KEYS[1] the lease, KEYS[2] the source (a queue list, or
# the aside zset), KEYS[3] the aside zset, KEYS[4] the busy set. First, whoever holds the lease,
# the flow-control window's grant the push held (ARGV[14], '' for none) is let go from the
# consumer's window (KEYS[9]): one round trip less a delivered push. ARGV[1] token, ARGV[2] lease
# ms, ARGV[3] the aside member read ('' for a queue), ARGV[4] the member to set aside instead
# ('' for none), ARGV[5] its due time, ARGV[6] the subscription id, ARGV[7] the key prefix,
# ARGV[8] '1' when the batch was delivered, with ARGV[9] now and ARGV[10] how many messages went
# (the others had expired): then the bookkeeping of a delivery is done in the same step (KEYS[5]
# the heads' attempts, this batch's ended; KEYS[6] the failing-since mark, KEYS[7] the
# last-delivery hash, KEYS[8] the stats hash), and the next batch is read as `_NEXT` does, with
# ARGV[11..13] its size, byte cap and payload prefix and KEYS[10 + m..] `_NEXT`'s keys, unless
# one of the m markers of the subscription cache the run decides on (KEYS[10..9 + m], ARGV[15] m,
# ARGV[16..15 + m] the values the pump saw) moved: then {1, -4}, the pump reads the cache again
# before the next batch (a Pause answered during this push stops the run here). ARGV[16 + m..]
# the batch's items. Returns {1} when taken ({1, source, items, bodies} after a delivery), {0}
# when the head moved (someone else took it), {-1} when the lease is lost; in both last cases
# nothing was changed. Items taken for good (not set aside) give their bodies' references back
# (dispatch/bodies.py). One call after a push and one before the first (`_BEGIN`): a run that
# pushes one batch makes two.
_TAKE = state.Script(
    RELEASE_LUA
    + _NEXT_LUA
    + ATTEMPTS_LUA
    + """
if ARGV[14] ~= '' then redis.call('zrem', KEYS[9], ARGV[14]) end
if redis.call('get', KEYS[1]) ~= ARGV[1] then return {-1} end
local m = tonumber(ARGV[15])
local first = 16 + m
if ARGV[3] ~= '' then
  if redis.call('zrem', KEYS[2], ARGV[3]) == 0 then return {0} end
else
  local n = #ARGV - first + 1
  local head = redis.call('lrange', KEYS[2], 0, n - 1)
  if #head ~= n then return {0} end
  for i = 1, n do
    if head[i] ~= ARGV[i + first - 1] then return {0} end
  end
  redis.call('ltrim', KEYS[2], n, -1)
end
if ARGV[4] ~= '' then
  redis.call('zadd', KEYS[3], ARGV[5], ARGV[4])
  redis.call('sadd', KEYS[4], ARGV[6])
else
  release(ARGV[7], ARGV, first)
end
if ARGV[8] == '1' then
  local sent, total = tonumber(ARGV[10]), #ARGV - first + 1
  if ARGV[3] == '' then attempts_end(KEYS[5], ARGV[first]) end
  if sent > 0 then  -- only an answer from the consumer ends a run of failures
    redis.call('del', KEYS[6])
    redis.call('hset', KEYS[7], ARGV[6], ARGV[9])
  end
  redis.call('hincrby', KEYS[8], 'delivered', sent)
  redis.call('hincrby', KEYS[8], 'expired', total - sent)
  redis.call('pexpire', KEYS[1], ARGV[2])
  for i = 1, m do
    if (redis.call('get', KEYS[9 + i]) or '') ~= ARGV[15 + i] then return {1, -4} end
  end
  local queues = {}
  for i = 10 + m, #KEYS do queues[i - 9 - m] = KEYS[i] end
  local found = next_batch(queues, {ARGV[11], ARGV[9], ARGV[12], ARGV[13], ARGV[1], ARGV[6]})
  return {1, found[1], found[2], found[3]}
end
redis.call('pexpire', KEYS[1], ARGV[2])
return {1}
"""
)


class LeaseKeeper:
    """Renews, every third of their length, the leases of pushes in flight in this process."""

    def __init__(self) -> None:
        self.held: dict[str, tuple[str, int]] = {}  # lease key -> (token, ms)
        self.lost: set[str] = set()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def hold(self, key: str, token: str, ms: int) -> None:
        with self.lock:
            self.held[key] = (token, ms)
            self.lost.discard(key)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
                self.thread.start()

    def drop(self, key: str) -> bool:
        """Stop renewing; False if the lease was found lost meanwhile."""
        with self.lock:
            self.held.pop(key, None)
            lost = key in self.lost
            self.lost.discard(key)
        return not lost

    def _run(self) -> None:
        r = state.get_redis()
        while True:
            with self.lock:
                held = dict(self.held)
            if held:
                self.renew(r, held)
            pause = min((ms for _t, ms in held.values()), default=3000) / 3000
            time.sleep(max(0.05, pause))

    def renew(self, r: Any, held: dict[str, tuple[str, int]]) -> None:
        """One round: renew the leases `held` names (as read from `self.held` a moment ago)."""
        try:
            pipe = r.pipeline(transaction=False)
            for key, (token, ms) in held.items():
                RENEW(pipe, 1, key, token, ms)
            renewed = pipe.execute()
        except Exception:  # Redis away for a moment: the next round tries again
            log.warning("lease renewal failed", exc_info=True)
            renewed = [1] * len(held)
        with self.lock:
            for (key, lease), ok in zip(held.items(), renewed, strict=True):
                # Only the push renewed here: another pump of this subscription in this
                # process may hold the key by now, with a token of its own.
                if not ok and self.held.get(key) == lease:
                    self.lost.add(key)


_keeper = LeaseKeeper()
_UNREAD = object()  # no batch read ahead


@dataclass(slots=True)
class Batch:
    queue: str | None  # the queue it was read from; None for a batch set aside
    items: list[bytes]  # as queued: b"<id>|<mark>"
    member: bytes = b""  # the aside zset member it was read as
    history: list[Any] = field(default_factory=list)  # attempts of a batch set aside
    live: list[tuple[str, bytes]] = field(default_factory=list)  # (id, payload) not expired
    grant: str = ""  # flow-control window grant held while it is pushed


def _letters_delete(ids: list[int]) -> None:
    DeadLetter.objects.filter(id__in=ids).delete()


def _letters_read(ids: list[int]) -> dict[int, bytes]:
    return {
        i: bytes(m) for i, m in DeadLetter.objects.filter(id__in=ids).values_list("id", "message")
    }


def _push(entry: SubEntry, batch: Batch) -> Outcome:
    """POST the batch; any error building or sending it is a failed attempt of this batch."""
    try:
        outcome = deliver(entry, [p for _i, p in batch.live], ids=[i for i, _p in batch.live])
    except Exception as exc:
        log.exception("push to %s raised", entry.id)
        return Outcome(ok=False, detail=f"error building or sending the push: {exc!r}"[:200])
    assert isinstance(outcome, Outcome)
    return outcome


class Pump:
    """Drains one subscription's queues; `run()` is one Celery task's worth of work."""

    def __init__(
        self,
        subscription_id: str,
        *,
        push: Callable[[SubEntry, Batch], Outcome] = _push,
        keep_alive: bool = True,
    ) -> None:
        self.sid = subscription_id
        self.r = state.get_redis()
        self.push_fn = push
        self.keep_alive = keep_alive
        self.token = uuid.uuid4().hex
        self.lease = state.lease_key(subscription_id)
        self.lease_ms = int(settings.HPWSN_LEASE_S * 1000)
        self.keys = state.queue_keys(subscription_id)
        self.entry: SubEntry | None = None
        self.limits = Limits(window=0, rate=0.0)
        self.consumer = ""
        self.size = 1
        self.ordered = True
        self.delivered_count = 0
        self.failures = 0  # in a row, in this run
        self.backoff = False
        self.looks_down = False
        self.lost = False  # the lease went to another pump: stop, touch nothing
        # The batch read ahead (by the step that took the lease or the last batch; None for
        # nothing queued), and `done` once a read found nothing, which let the lease go with it.
        self.ahead: Batch | object | None = _UNREAD
        self.done = False
        self.stale = False  # the subscription's cache must be read before the next batch

    # ------------------------------------------------------------------ lease

    def acquire(self) -> bool:
        """Take the lease if this subscription has work a pump may do now, and read its first
        batch in the same step.

        The subscription (paused, ended, expired?) and its consumer's limits must be as current
        as the start of the run: a pause or a new limit applies at once. They are taken from
        the process's caches, and the script that takes the lease checks that the markers those
        caches reflect have not moved; only when they moved, or the caches cannot tell, are they
        read (two round trips) before the script runs again."""
        begun = self._begin(cached=True)
        return bool(self._begin(cached=False)) if begun is None else begun

    def _begin(self, *, cached: bool) -> bool | None:
        """`acquire` with the caches as they are (`cached`; None when that cannot decide), or
        after reading them."""
        r, sid = self.r, self.sid
        if cached:
            index = subscription_index_cached()
            if index is None:
                return None
            entry = index.value.by_id.get(sid)
        else:
            entry = subscription_index().by_id.get(sid)
        if entry is None or entry.paused or entry.expired(time.time()) or entry.mode != "push":
            if cached:
                return None  # a refusal only on what was read now
            if entry is None and on_db(subscription_gone, sid):
                # Unsubscribed: whatever the fan-out left goes too.
                pipe = r.pipeline(transaction=False)
                state.subscription_forget(pipe, sid)
                pipe.execute()
            return False  # else made a moment ago: this process's index is behind
        consumer = flow.consumer_of(entry.consumer_address)
        keys: list[str] = []
        seen: list[object] = []
        if cached:
            assert index is not None
            held = consumer_limits_cached(consumer=consumer)
            if held is None:
                return None
            limits = held.value
            keys += [*index.keys, *held.keys]
            seen += [*index.expected(), *held.expected()]
        else:
            limits = consumer_limits(consumer=consumer)
        self.size = batch_size(limits)
        # Not when backing off (the retry sweeper queues it when due) nor when another pump
        # drains this queue (it re-checks the queue before leaving).
        found = _BEGIN(r, len(self.keys) + 5 + len(keys), *self._next_keys(), state.RETRY,
                       *keys, *self._next_args(), self.lease_ms, len(keys), *seen)  # fmt: skip
        if int(found[0]) == -4:
            return None
        if int(found[0]) < -1:
            return False
        self.entry = entry
        self.ordered = ordered(entry)
        self.consumer = consumer
        self.limits = limits
        self.ahead = self._batch_of(found)
        self.done = self.ahead is None  # nothing queued: the lease went in the same step
        return True

    def renew(self) -> bool:
        if not RENEW(self.r, 1, self.lease, self.token, self.lease_ms):
            self.lost = True
        return not self.lost

    def release(self) -> None:
        RELEASE(self.r, 1, self.lease, self.token)

    def _take(
        self, batch: Batch, *, aside: str = "", due: float = 0.0, delivered: bool = False
    ) -> bool:
        """Take the batch off its queue (or its old place aside), fenced; False if it was not.
        `delivered`: with the bookkeeping of a delivery and the read of the next batch, in the
        same step. The batch's window grant, if it still holds one, is let go in any case."""
        sid = self.sid
        done = ["1", repr(time.time()), len(batch.live)] if delivered else ["", "", 0]
        # The next batch is read only while the subscription is as the run found it (checked in
        # the script): a Pause or Unsubscribe answered during this push applies before it.
        held = subscription_index_cached() if delivered else None
        markers = (held.keys, held.expected()) if held is not None else ((), ())
        self.stale = self.stale or (delivered and held is None)
        found = _TAKE(
            self.r,
            9 + len(markers[0]) + len(self.keys) + 4,
            self.lease,
            batch.queue or state.aside_key(sid),
            state.aside_key(sid),
            state.BUSY,
            state.attempts_key(sid),
            state.failing_since_key(sid),
            state.LAST_DELIVERY,
            STATS,
            flow.window_key(self.consumer),
            *markers[0],
            *self._next_keys(),
            self.token, self.lease_ms, batch.member, aside, due, sid, state.PREFIX, *done,
            self.size, settings.HPWSN_PUSH_BATCH_BYTES, state.payload_key(""), batch.grant,
            len(markers[0]), *markers[1], *batch.items,
        )  # fmt: skip
        res = int(found[0])
        if res != 1:
            self.lost = True
            log.warning(
                "pump of %s stops: %s",
                self.sid,
                "its lease went to another pump" if res < 0 else "its batch was taken meanwhile",
            )
        elif len(found) > 1 and int(found[1]) == -4:
            self.stale = True  # nothing read ahead: `next_batch` reads the caches, then the batch
        elif len(found) > 1:
            self.ahead = self._batch_of(found[1:])
            self.done = self.ahead is None  # the run ended in the same step
        return res == 1

    def _next_keys(self) -> list[str]:
        sid = self.sid
        return [state.aside_key(sid), state.SCHED, self.lease, state.ASIDE_DUE, *self.keys]

    def _next_args(self) -> list[object]:
        return [
            self.size, time.time(), settings.HPWSN_PUSH_BATCH_BYTES, state.payload_key(""),
            self.token, self.sid,
        ]  # fmt: skip

    # ------------------------------------------------------------------ one batch

    def next_batch(self) -> Batch | None:
        """The next batch to push, its payloads read; None when the run is over."""
        if self.ahead is not _UNREAD:
            batch, self.ahead = self.ahead, _UNREAD  # read with the lease or the last take
        else:
            batch = self._batch_of(
                _NEXT(self.r, len(self.keys) + 4, *self._next_keys(), *self._next_args())
            )
        if batch is None:  # nothing queued: the read ended the run in the same step
            self.done = True
            return None
        assert isinstance(batch, Batch)
        entry = subscription_index(max_age=0.0 if self.stale else 1.0).by_id.get(self.sid)
        self.stale = False
        if entry is None or entry.paused or entry.expired(time.time()):
            return None
        self.entry = entry
        return batch

    def _batch_of(self, found: list[Any]) -> Batch | None:
        index, items, bodies = int(found[0]), found[1], found[2]
        if index > 0:
            batch = Batch(queue=self.keys[index - 1], items=list(items))
        elif index == 0:
            aside = json.loads(items[0])
            batch = Batch(
                queue=None,
                items=[i.encode() for i in aside["items"]],
                member=items[0],
                history=aside["attempts"],
            )
        else:
            return None
        bodies = list(bodies)
        lost = {
            n: rows[0]
            for n, item in enumerate(batch.items)
            if not bodies[n] and (rows := letter_rows([item]))
        }
        if lost:
            # A redriven letter outlived its body in Redis (its subscription stayed paused or
            # suspended past the retention). Its row still holds the message: pushed from there,
            # not counted as expired, whose take would delete the row unsent.
            kept = on_db(_letters_read, list(lost.values()))
            for n, row in lost.items():
                bodies[n] = kept.get(row, b"")
        batch.live = [
            (item_id(i), body) for i, body in zip(batch.items, bodies, strict=True) if body
        ]
        return batch

    def push(self, batch: Batch) -> Outcome | None:
        """Push the batch under flow control; None when the consumer's window or rate is spent."""
        assert self.entry is not None
        if not batch.live:
            return Outcome(ok=True)  # every message expired: nothing to send
        r, limits = self.r, self.limits
        shared = subscription_index(max_age=1.0).per_consumer.get(self.consumer, 1)
        if limits.rate > 0 or 0 < limits.window < shared * self.size:
            grant, wait = flow_wait(r, self.consumer, limits, len(batch.live))
            if grant is None:  # come back later
                r.zadd(state.RETRY, {self.sid: time.time() + wait})
                self.backoff = True
                return None
            batch.grant = grant
        if self.keep_alive:
            _keeper.hold(self.lease, self.token, self.lease_ms)
        outcome = None
        try:
            outcome = self.push_fn(self.entry, batch)
            return outcome
        finally:
            if self.keep_alive and not _keeper.drop(self.lease):
                self.lost = True
            # A delivered batch's grant goes with its take (`_TAKE`); any other now.
            if batch.grant and (outcome is None or not outcome.ok or self.lost):
                flow.window_release(r, consumer=self.consumer, grant=batch.grant)
                batch.grant = ""

    def step(self) -> bool:
        """Push one batch and settle it; whether the run goes on."""
        batch = self.next_batch()
        if batch is None:
            return False
        started = time.monotonic()
        outcome = self.push(batch)
        if outcome is None or self.lost:
            return False
        duration_ms = round((time.monotonic() - started) * 1000)
        events.attempt(
            entry=self.entry,
            ids=batch.items,
            sent=[p for _i, p in batch.live],
            outcome=outcome,
            ms=duration_ms,
        )
        if outcome.ok:
            return self.delivered(batch)
        return self.failed(batch, outcome, duration_ms=duration_ms)

    # ------------------------------------------------------------------ outcomes

    def delivered(self, batch: Batch) -> bool:
        assert self.entry is not None
        entry = self.entry
        redriven = letter_rows(batch.items)
        if redriven:
            # Delivered (or expired): the redriven letters leave the store. Before the take: a
            # crash in between pushes them again, never loses them.
            on_db(_letters_delete, redriven)
        if not self._take(batch, delivered=True):
            return False
        self.failures = 0
        sent = len(batch.live)
        self.delivered_count += sent
        counters.incr("delivered", sent, consumer=entry.consumer_address)
        counters.incr("expired", len(batch.items) - sent)
        sent_at = [notification_id_time(i) for i, _p in batch.live]
        events.delivered(entry=entry, live=batch.live, sent_at=sent_at)
        events.expired(entry=entry, n=len(batch.items) - sent)
        now = time.time()
        counters.observe_latencies(now - t for t in sent_at if t is not None)
        return True

    def failed(self, batch: Batch, outcome: Outcome, *, duration_ms: int = 0) -> bool:
        assert self.entry is not None
        r, sid, entry = self.r, self.sid, self.entry
        if not self.renew():
            return False  # not ours any more: its new owner counts its own attempts
        now = time.time()
        record = {
            "time": now,
            "status": outcome.status,
            "detail": outcome.detail[:200],
            "duration_ms": duration_ms,
        }
        # An ordered queue's head keeps its attempts in Redis; a batch set aside, its own.
        at_head = self.ordered and batch.queue is not None
        history = batch.history
        pipe = r.pipeline(transaction=False)
        if at_head:
            head = {**record, "head": batch.items[0].decode()}
            pipe.eval(
                ATTEMPT,
                1 + len(self.keys),
                state.attempts_key(sid),
                *self.keys,
                batch.items[0],
                json.dumps(head),
            )
        else:
            history = [*history, record]
        pipe.set(state.failing_since_key(sid), repr(now), nx=True)
        pipe.get(state.failing_since_key(sid))
        res = pipe.execute()
        attempt = int(res[0]) if at_head else len(history)
        failing_since = float(res[-1])
        counters.incr("failed", consumer=entry.consumer_address)
        delay = (
            None
            if outcome.permanent
            else retry_delay(
                attempt=attempt,
                schedule=retry_schedule(entry),
                jitter=settings.HPWSN_RETRY_JITTER,
                retry_after=outcome.retry_after,
                throttled=throttles(outcome, attempt),
                throttled_min=settings.HPWSN_RETRY_THROTTLED_MIN_S,
            )
        )
        if delay is None:
            if not self._bury(batch, outcome, attempt=attempt, at_head=at_head, history=history):
                return False
        elif at_head:
            pipe = r.pipeline(transaction=True)
            pipe.zadd(state.RETRY, {sid: now + delay})
            pipe.hincrby(STATS, "failed", 1)
            pipe.execute()
        else:
            # Out of the queue (or its old place aside) and aside until it is due, in one
            # script: the batches behind it go on meanwhile.
            aside = {"items": [i.decode() for i in batch.items], "attempts": history}
            if not self._take(batch, aside=json.dumps(aside), due=now + delay):
                return False
            r.hincrby(STATS, "failed", 1)
        if delay is not None:
            counters.incr("retried", consumer=entry.consumer_address)
            log.info(
                "delivery to %s failed (%s); retry %d in %.1fs", sid, outcome.detail, attempt, delay
            )
        if now - failing_since >= settings.HPWSN_SUSPEND_AFTER_S:
            on_db(subscription_suspend, subscription_id=sid)
            self.backoff = True
            return False
        if delay is None:
            return True  # the next batch gets its own attempts
        self.failures += 1
        if not at_head and self.failures < UNORDERED_FAILURES_IN_A_ROW:
            return True  # set aside: the next batch may get through
        self.looks_down = not at_head
        self.backoff = True
        return False

    def _bury(
        self, batch: Batch, outcome: Outcome, *, attempt: int, at_head: bool, history: list[Any]
    ) -> bool:
        """Store the batch as dead letters, then take it off its queue (fenced)."""
        assert self.entry is not None
        r, sid, entry = self.r, self.sid, self.entry
        if at_head:
            # Only this batch's: the head of another queue keeps its own.
            head = batch.items[0].decode()
            history = [
                {k: v for k, v in attempt.items() if k != "head"}
                for attempt in map(json.loads, r.lrange(state.attempts_key(sid), 0, -1))
                if attempt.get("head") == head
            ]
        reason = "permanent" if outcome.permanent else "exhausted"
        # The rows are written before the batch is taken: a crash in between leaves it queued
        # (delivered again later), never lost.
        on_db(
            dead_letter_store,
            entry=entry,
            live=batch.live,
            reason=reason,
            attempts=history,
            redriven=letter_rows(batch.items),
        )
        if not self._take(batch):
            return False
        pipe = r.pipeline(transaction=False)
        if at_head:
            pipe.eval(ATTEMPTS_END, 1, state.attempts_key(sid), batch.items[0])
        pipe.hincrby(STATS, "dead", len(batch.live))
        pipe.hincrby(STATS, "expired", len(batch.items) - len(batch.live))
        pipe.execute()
        counters.incr("dead", len(batch.live), consumer=entry.consumer_address)
        counters.incr("expired", len(batch.items) - len(batch.live))
        events.dead_lettered(entry=entry, live=batch.live, reason=reason)
        events.expired(entry=entry, n=len(batch.items) - len(batch.live))
        log.warning(
            "%s failure for %s after %d attempt(s): %s %s",
            reason,
            sid,
            attempt,
            outcome.status,
            outcome.detail,
        )
        return True

    # ------------------------------------------------------------------ a run

    def finish(self) -> None:
        """After the lease is released: wake-ups for batches set aside and for late arrivals."""
        r, sid = self.r, self.sid
        # Woken when the first batch set aside is due; a consumer that looks down is left alone
        # until then.
        first = r.zrange(state.aside_key(sid), 0, 0, withscores=True)
        if first:
            pipe = r.pipeline(transaction=False)
            pipe.zadd(state.ASIDE_DUE, {sid: first[0][1]})
            if self.looks_down:
                pipe.zadd(state.RETRY, {sid: first[0][1]})
            pipe.execute()
        if self.lost:
            return  # the new owner of the queue schedules what follows
        if self.backoff or not r.exists(*self.keys):
            return
        # Work left (the slice ran out, or it arrived while the lease was let go: its wake-up
        # may have found the lease still held): back to the ready list, whatever the flag says.
        pipe = r.pipeline(transaction=False)
        pumps_ready(pipe, [sid])
        pipe.execute()

    def run(self, *, max_run: float = 0.0) -> int:
        """Drain the queues; with `max_run` (seconds, 0 for no limit) stop after that long."""
        if not self.acquire():
            return 0
        started = time.monotonic()
        try:
            while self.step():
                if max_run and time.monotonic() - started >= max_run:
                    break
        finally:
            if not self.done:  # else the read that found nothing let the lease go
                self.release()
        if not self.done:
            self.finish()
        return self.delivered_count


def pump_run(*, subscription_id: str) -> int:
    """Drain one subscription's queue, one pump at a time; returns messages delivered.

    Ordered subscriptions (their topic's policy, the default) keep a failed batch at the head of
    the queue until it is delivered or dead-lettered. Unordered ones set it aside with its own
    retry time and go on with the batches behind it.
    """
    return Pump(subscription_id).run()
