"""Fan-out (worker): accepted notifications into per-subscription queues, in order, one fan-out at
a time."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from lxml import etree

from dispatch import matching, tasks
from dispatch import reliable as reliable_log
from dispatch.bodies import HOLD_LUA, bodies_drop_head, bodies_hold_args, bodies_trim
from dispatch.filters import FilterRun
from dispatch.items import fast_mark, letter_rows, pull_item, queue_item, reliable_mark
from dispatch.models import DeadLetter
from dispatch.services import FANOUT_LEASE, RELEASE, STATS
from hpwsn import ns
from hpwsn_site import state
from monitoring import counters, events
from subscriptions.filterindex import FilterIndex
from subscriptions.selectors import SubEntry, subscription_index
from topics.selectors import topic_tree
from topics.tree import TopicTree

log = logging.getLogger(__name__)


def payload_root(fragment: bytes) -> etree._Element:
    return etree.fromstring(b'<m xmlns:wsnt="' + ns.WSNT.encode() + b'">' + fragment + b"</m>")


def _eligible(
    entries: Iterable[SubEntry], m: _Msg, now: float, replay: dict[str, int], rest: int
) -> list[SubEntry]:
    """The entries that may have the message, in one pass (a message may match 10^4): not
    expired and, for a reliable message, made before it was accepted and, after a Redis loss,
    not already past it (see _fanout_batch)."""
    if m.seq is None:
        return [e for e in entries if not e.expired(now)]
    seq, accepted = m.seq, m.accepted_at
    return [
        e
        for e in entries
        if not e.expired(now) and e.created_ts <= accepted and seq > replay.get(e.id, rest)
    ]


def _message_element(fragment: bytes | None) -> etree._Element | None:
    return None if fragment is None else payload_root(fragment).find(f"{{{ns.WSNT}}}Message")


def fanout_run(*, linger: float = 0.1, max_run: float = 0.25, max_batches: int = 0) -> int:
    """Move accepted notifications into per-subscription queues, in order; one fan-out at a time.

    Two sources: the Redis ingest list (fast topics) and the database log (reliable topics).
    `max_batches` (0: no limit) ends the run after that many batches.
    """
    r = state.get_redis()
    token = uuid.uuid4().hex
    lease_ms = int(settings.HPWSN_LEASE_S * 1000)
    if not r.set(FANOUT_LEASE, token, nx=True, px=lease_ms):
        return 0
    tick = settings.HPWSN_FANOUT_TICK_S
    batch = settings.HPWSN_FANOUT_BATCH
    started = idle_since = time.monotonic()
    moved = batches = 0
    # Read once: while this fan-out holds the lease, only it moves the position.
    position = reliable_log.fanout_position(r)
    try:
        while time.monotonic() - started < max_run:
            rows = [] if position is None else reliable_log.log_read(after=position, limit=batch)
            replay = None
            if rows:  # the positions kept after a Redis loss, read in the same round trip
                pipe = r.pipeline(transaction=False)
                pipe.lpop(state.INGEST, batch)
                pipe.hgetall(state.REPLAY)
                found, kept = pipe.execute()
                items = found or []
                replay = _replay_positions(kept)
            else:
                items = r.lpop(state.INGEST, batch) or []
            if items or rows:
                # The batch's script also renews the lease: it runs only while this
                # fan-out holds it (a fan-out stalled past it stops here).
                n = _fanout_batch(
                    r,
                    items=items,
                    rows=rows,
                    position=position or 0,
                    token=token,
                    lease_ms=lease_ms,
                    replay=replay,
                )
                if n < 0:
                    break  # another fan-out owns the work now, or moved the position
                moved += n
                batches += 1
                if rows:
                    position = rows[-1].seq
                if batches == max_batches:
                    break
                idle_since = time.monotonic()
                if len(items) < batch and len(rows) < batch:
                    # Let a few milliseconds of traffic gather: bigger batches mean fewer pump
                    # tasks and bigger Notify pushes, for a few ms of latency.
                    time.sleep(tick)
            elif time.monotonic() - idle_since < linger:
                time.sleep(tick)
            else:
                break
    finally:
        RELEASE(r, 1, FANOUT_LEASE, token)
    # Hand the flag back only now, without the lease: a publisher that finds it unset queues a
    # fan-out that can take the lease at once. Anything that arrived meanwhile is seen below.
    r.delete(state.FANOUT_SCHED)
    if fanout_pending(r) and r.set(state.FANOUT_SCHED, "1", nx=True, ex=60):
        # Re-queued at the tail rather than looping, so pumps waiting for a worker run first.
        tasks.fanout.delay()
    return moved


def _replay_positions(raw: dict[bytes, bytes]) -> dict[str, int]:
    """The log positions kept after a Redis loss (`state.REPLAY`), as read from Redis."""
    return {k.decode(): int(v) for k, v in raw.items()}


def fanout_pending(r: Any) -> bool:
    if r.llen(state.INGEST):
        return True
    position = r.get(state.FANOUT_SEQ)
    return position is not None and reliable_log.log_head() > int(position)


@dataclass(slots=True)
class _Msg:
    nid: bytes
    path: str
    mark: bytes  # b"r<seq>" (reliable) or b"f<fan-out position>" (fast); see dispatch/reliable.py
    priority: int
    accepted_at: float
    seq: int | None = None
    payload: bytes | None = None
    ttl: float = 0.0  # seconds the body is kept (reliable messages)
    sql: list[FilterIndex[SubEntry]] | None = None  # SQL-like filters on its topic


def _fanout_messages(
    tree: TopicTree, items: list[bytes], rows: list[reliable_log.LogRow], position: int, now: float
) -> tuple[list[_Msg], int]:
    """The batch as messages to match, and how many log rows were past their time to live."""
    retention = settings.HPWSN_MESSAGE_RETENTION_S
    msgs = []
    for item in items:
        nid, ts, raw_path = item.split(b"|", 2)
        path = raw_path.decode()
        node = tree.get(path) or topic_tree(max_age=0).get(path)
        priority = node.policy.priority if node else state.DEFAULT_PRIORITY
        msgs.append(_Msg(nid, path, fast_mark(position), priority, float(ts)))
    expired = 0
    for row in rows:
        ttl = retention if row.expires_at is None else min(retention, row.expires_at - now)
        if ttl <= 0.001:
            expired += 1
            continue
        mark = reliable_mark(row.seq)
        msgs.append(
            _Msg(
                row.notification_id.encode(),
                row.topic_path,
                mark,
                row.priority,
                row.accepted_at,
                row.seq,
                row.payload,
                ttl,
            )
        )
    return msgs, expired


def _fanout_batch(
    r: Any,
    *,
    items: list[bytes],
    rows: list[reliable_log.LogRow],
    position: int,
    token: str | None = None,
    lease_ms: int = 0,
    replay: dict[str, int] | None = None,
) -> int:
    """Match and queue one batch; how many queue entries it made, or -1 when this fan-out no
    longer holds the lease (`token`; renewed for `lease_ms` by the batch's script) or the log
    position moved. `replay`: the positions kept after a Redis loss, read here when not given."""
    index = subscription_index()
    tree = topic_tree()
    now = time.time()
    msgs, expired = _fanout_messages(tree, items, rows, position, now)
    if replay is None:
        replay = _replay_positions(r.hgetall(state.REPLAY)) if rows else {}
    rest = replay.get("_rest", -1)  # the position of every subscription without its own
    matched: list[tuple[_Msg, list[SubEntry]]] = []
    need_payload: list[_Msg] = []
    poison: list[tuple[_Msg, str]] = []
    for m in msgs:
        try:
            subs = _subscribers(index, tree, m, now, replay, rest)
        except Exception as exc:  # one message never stops the fan-out for the others
            poison.append((m, _error_text(exc)))
            continue
        if m.payload is None and (m.sql or any(e.content_filter is not None for e in subs)):
            need_payload.append(m)
        matched.append((m, subs))
    if need_payload:
        payloads = r.mget([state.payload_key(m.nid.decode()) for m in need_payload])
        for m, payload in zip(need_payload, payloads, strict=True):
            m.payload = payload
    # Each message a filter reads is parsed once, however many filtered subscriptions it meets
    # (XPath filters through FilterRun, with its size bound and error counts; SQL-like ones here).
    filters = FilterRun()
    parsed: dict[bytes, etree._Element | None] = {}
    queues: dict[tuple[str, int], list[bytes]] = {}
    pulls: dict[str, list[bytes]] = {}
    entries_of: dict[str, SubEntry] = {}
    busy: set[str] = set()
    refs: dict[bytes, int] = {}  # queues and pull points each message went to
    moved = 0
    for m, subs in matched:
        if m.sql:  # SQL-like filters answer through their index (dispatch/matching.py)
            try:
                if m.nid not in parsed:
                    parsed[m.nid] = _message_element(m.payload)
                found = matching.sql_matching(m.sql, matching.message_view(m, parsed[m.nid]))
            except Exception:  # the filtered subscriptions miss it; nobody else does
                log.warning("SQL-like filters failed on message %s", m.nid, exc_info=True)
                found = []
            subs = subs + _eligible(found, m, now, replay, rest)
        item = queue_item(m.nid, m.mark)
        went = 0
        for e in subs:
            if e.content_filter is not None and not filters.passes(e, m.nid, m.payload):
                continue
            went += 1
            if e.mode == "pull" and e.pull_point_id:
                busy.add(e.id)
                pulls.setdefault(e.pull_point_id, []).append(pull_item(m.nid, e.id, m.mark))
            else:
                queues.setdefault((e.id, m.priority), []).append(item)
                entries_of[e.id] = e
        if went:
            moved += went
            refs[m.nid] = refs.get(m.nid, 0) + went
    filters.record(r)
    if poison:
        unread = [m for m, _error in poison if m.payload is None]
        if unread:  # a fast message's body: kept with its dead letter
            for m, body in zip(
                unread, r.mget([state.payload_key(m.nid.decode()) for m in unread]), strict=True
            ):
                m.payload = body
        _poison_store(poison)
    results = _fanout_store(
        r,
        msgs=msgs,
        items=items,
        rows=rows,
        position=position,
        queues=queues,
        pulls=pulls,
        busy=busy,
        refs=refs,
        paused={sid for sid, e in entries_of.items() if e.paused},
        token=token,
        lease_ms=lease_ms,
    )
    if results is None:
        return -1  # another fan-out moved the log position: it owns these rows now
    pull_lengths, paused_lengths = results
    pulls_bound(r, dict(zip(pulls, pull_lengths, strict=True)))
    # Only queues no pump drains are bounded: trimming under a pump that is pushing the head
    # would make it trim messages it never sent. A failing active consumer is suspended in time.
    queues_bound(r, paused_lengths)
    if expired:
        r.hincrby(STATS, "expired", expired)
        counters.incr("expired", expired)
        events.expired(entry=None, n=expired)
    return moved


def _subscribers(
    index: Any, tree: TopicTree, m: _Msg, now: float, replay: dict[str, int], rest: int
) -> list[SubEntry]:
    """The live subscriptions of the message's topic, before content filters; the message's
    SQL-like filter groups go on `m.sql`."""
    node = tree.get(m.path)
    names = tuple(m.path.split(":"))
    root_ns = node.root_namespace if node else None
    m.sql = index.filter_groups(root_ns, names)
    return _eligible(index.matching(root_ns, names), m, now, replay, rest)


def _error_text(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {exc}"[:200]


def _poison_store(poison: list[tuple[_Msg, str]]) -> None:
    """Messages the fan-out could not route become dead letters of no subscription, with the
    error; the fan-out goes on past them."""
    now = time.time()
    for m, error in poison:
        log.error("fan-out cannot route message %s on %s: %s", m.nid.decode(), m.path, error)
    DeadLetter.objects.bulk_create(
        DeadLetter(
            subscription_id="",
            consumer_address="",
            notification_id=m.nid.decode(),
            topic=m.path[:1024],
            message=m.payload or b"",
            reason=DeadLetter.Reason.UNROUTABLE,
            attempts=[{"time": now, "status": None, "detail": error, "duration_ms": 0}],
        )
        for m, error in poison
    )
    counters.incr("dead", len(poison))


def _fanout_store(
    r: Any,
    *,
    msgs: list[_Msg],
    items: list[bytes],
    rows: list[reliable_log.LogRow],
    position: int,
    queues: dict[tuple[str, int], list[bytes]],
    pulls: dict[str, list[bytes]],
    busy: set[str],
    refs: dict[bytes, int],
    paused: set[str],
    token: str | None = None,
    lease_ms: int = 0,
) -> tuple[list[int], dict[str, int]] | None:
    """Push the batch into the queues and move the log position, in one Redis script (`_STORE`);
    returns the pull points' lengths and the lengths of the paused subscriptions' queues.

    The subscriptions whose queue had no pump scheduled go on the ready list in the same step
    (`_QUEUE`), paused ones excepted.
    The bodies of the messages go with them, counted (dispatch/bodies.py): a reliable message's
    body is written only if it went somewhere, a fast one's is deleted if it went nowhere.
    Fenced: the script writes only while this fan-out still holds the lease (`token`), and renews
    it for `lease_ms` when given; with rows, only while the position is the one they follow (a
    lease that expired under a stalled process while another took over). Otherwise it writes
    nothing, the items go back to the ingest list and this returns None.
    """
    args: list[object] = [
        "" if token is None else token,
        position if rows else "",
        rows[-1].seq if rows else "",
        lease_ms if token is not None else 0,
        sum(refs.values()),
    ]
    held = bodies_hold_args(
        (
            m.nid.decode(),
            refs.get(m.nid, 0),
            None if m.seq is None else int(m.ttl * 1000),
            m.payload,
        )
        for m in msgs
    )
    args += [len(held), *held, len(pulls)]
    for pp_id, values in pulls.items():
        args += [state.pullpoint_key(pp_id), len(values), *values]
    args += [len(busy), *busy]
    if queues:
        args += _queue_args(queues, paused)
    keys = (
        state.READY,
        state.BUSY,
        state.PRIOS,
        state.SCHED,
        FANOUT_LEASE,
        state.FANOUT_SEQ,
        STATS,
    )
    found = _STORE(r, len(keys), *keys, *args)
    if found is None:
        if items:  # handed back, in order, to the fan-out that owns the position now
            r.lpush(state.INGEST, *reversed(items))
        return None
    pull_lengths, lengths = found
    return (
        [int(x) for x in pull_lengths],
        {k.decode(): int(n) for k, n in zip(lengths[::2], lengths[1::2], strict=True)},
    )


# The queues of a fan-out batch in one call, however many subscriptions it reaches. KEYS: the
# ready list, the busy set, the busy subscriptions' other priorities (`state.PRIOS`) and the
# pumps' scheduled marks (`state.SCHED`). ARGV[1]: the prefix of the queue keys
# (hpwsn_site/state.py); ARGV[2] the time a mark set now holds (the stall sweep leaves a
# subscription scheduled a moment ago to its pump); ARGV[3] the default priority. Then groups of
# subscriptions that get the same items (one message to many subscriptions is one group): the
# priority, '1' if they are paused, the number of items, the items, the number of subscriptions,
# their ids. A priority other than the default is recorded in PRIOS (dispatch/reliable.py).
# Each subscription's queue gets the items and the subscription joins the busy set; one whose
# mark this sets (no pump was scheduled) goes on the ready list unless paused. A subscription is
# in a group once, and a group's marks are set before the next group reads them, so one that
# gets items in two groups goes on the ready list once. Returns the paused queues' keys and
# lengths, flat.
_QUEUE = """
local qp, now, dp = ARGV[1], ARGV[2], ARGV[3]
local paused = {}
-- A thousand subscriptions a call: they join the busy set, and those without a mark get one and
-- go on the ready list (paused ones get none).
local function settle(chunk, marking)
  redis.call('sadd', KEYS[2], unpack(chunk))
  if not marking then return end
  local held = redis.call('hmget', KEYS[4], unpack(chunk))
  local marks, ready = {}, {}
  for j = 1, #chunk do
    if not held[j] then
      marks[#marks + 1] = chunk[j]
      marks[#marks + 1] = now
      ready[#ready + 1] = chunk[j]
    end
  end
  if #ready > 0 then
    redis.call('hset', KEYS[4], unpack(marks))
    redis.call('rpush', KEYS[1], unpack(ready))
  end
end
local b = 4
while b <= #ARGV do
  local prio, is_paused, n = ARGV[b], ARGV[b + 1] == '1', tonumber(ARGV[b + 2])
  local first, last = b + 3, b + 2 + n
  local m = tonumber(ARGV[last + 1])
  local chunk = {}
  for i = last + 2, last + 1 + m do
    local sid = ARGV[i]
    local key = qp .. sid .. ':' .. prio
    local length = redis.call('rpush', key, unpack(ARGV, first, last))
    if prio ~= dp then
      local held = redis.call('hget', KEYS[3], sid) or ''
      if not string.find(held, prio, 1, true) then
        redis.call('hset', KEYS[3], sid, held .. prio)
      end
    end
    if is_paused then
      paused[#paused + 1] = key
      paused[#paused + 1] = length
    end
    chunk[#chunk + 1] = sid
    if #chunk == 1000 then
      settle(chunk, not is_paused)
      chunk = {}
    end
  end
  if #chunk > 0 then settle(chunk, not is_paused) end
  b = last + 2 + m
end
return paused
"""


def queues_push(r: Any, queues: dict[tuple[str, int], list[bytes]], paused: set[str]) -> Any:
    """`_QUEUE` on a client or pipeline: queues[(subscription id, priority)] gets those items."""
    return r.eval(
        _QUEUE, 4, state.READY, state.BUSY, state.PRIOS, state.SCHED, *_queue_args(queues, paused)
    )


# A fan-out batch in one script: `_HOLD` (the bodies and their references), the pull points'
# items, `_QUEUE`, the position moved and the lease renewed, fenced by the lease and the position
# (`_fanout_store`). KEYS: `_QUEUE`'s four, the fan-out's lease, its log position, STATS. ARGV: the
# lease's token ('' unchecked), the position the rows follow ('' unchecked), the new position (''
# none), the lease's renewal in ms (0 none), the queue entries made; then the number of `_HOLD`'s
# arguments and those; the number of pull points, and per pull point its key, the number of its
# items, the items; the number of pull subscriptions made busy, their ids; then `_QUEUE`'s
# arguments to the end (none when no queue gets anything). Returns the pull points' lengths and
# `_QUEUE`'s answer, or nil (and writes nothing) when the lease or the position is not as given.
_STORE = state.Script(
    HOLD_LUA
    + "local function queues_push(KEYS, ARGV)\n"
    + _QUEUE
    + "end\n"
    + """
if ARGV[1] ~= '' and redis.call('get', KEYS[5]) ~= ARGV[1] then return false end
if ARGV[2] ~= '' and tonumber(redis.call('get', KEYS[6]) or '0') ~= tonumber(ARGV[2]) then
  return false
end
local at = 6
local function num()
  at = at + 1
  return tonumber(ARGV[at - 1])
end
local function take(n)
  local out = {}
  for i = 1, n do out[i] = ARGV[at + i - 1] end
  at = at + n
  return out
end
local function each_thousand(command, key, values)  -- unpack takes a few thousand at most
  local answer = 0
  for i = 1, #values, 1000 do
    answer = redis.call(command, key, unpack(values, i, math.min(i + 999, #values)))
  end
  return answer
end
local held = take(num())
if #held > 1 then bodies_hold(held) end
local lengths = {}
for p = 1, num() do
  local key = ARGV[at]
  at = at + 1
  lengths[p] = each_thousand('rpush', key, take(num()))
end
each_thousand('sadd', KEYS[2], take(num()))
local paused = {}
if at <= #ARGV then paused = queues_push(KEYS, take(#ARGV - at + 1)) end
if ARGV[3] ~= '' then redis.call('set', KEYS[6], ARGV[3]) end
redis.call('hincrby', KEYS[7], 'matched', ARGV[5])
if tonumber(ARGV[4]) > 0 then redis.call('pexpire', KEYS[5], ARGV[4]) end
return {lengths, paused}
"""
)


def _queue_args(queues: dict[tuple[str, int], list[bytes]], paused: set[str]) -> list[object]:
    groups: dict[tuple[int, bool, tuple[bytes, ...]], list[str]] = {}
    for (sid, prio), values in queues.items():
        groups.setdefault((prio, sid in paused, tuple(values)), []).append(sid)
    args: list[object] = [
        state.QUEUE_PREFIX, repr(time.time()), state.DEFAULT_PRIORITY,
    ]  # fmt: skip
    for (prio, is_paused, items), sids in groups.items():
        args += [prio, "1" if is_paused else "", len(items), *items, len(sids), *sids]
    return args


def pulls_bound(r: Any, lengths: dict[str, int]) -> None:
    """Hold pull points to their depth: drop the oldest messages, or refuse the newest."""
    depth = settings.HPWSN_PULLPOINT_MAX_DEPTH
    over = {pp: n - depth for pp, n in lengths.items() if n > depth}
    if not over:
        return
    refuse = settings.HPWSN_PULLPOINT_OVERFLOW == "refuse"
    for pp in over:
        bodies_trim(r, state.pullpoint_key(pp), keep=depth, end="head" if refuse else "tail")
    r.hincrby(STATS, "refused" if refuse else "dropped", sum(over.values()))
    events.dropped(over=over, reason="refused" if refuse else "oldest")
    log.warning(
        "pull point depth limit: %s %d message(s)",
        "refused" if refuse else "dropped the oldest",
        sum(over.values()),
    )


def queues_bound(r: Any, lengths: dict[str, int]) -> None:
    """Drop the oldest messages of queues beyond HPWSN_QUEUE_MAX_DEPTH, counted as `dropped`;
    redriven letters among them go back to the dead-letter store."""
    depth = settings.HPWSN_QUEUE_MAX_DEPTH
    beyond = [key for key, n in lengths.items() if n > depth]
    if not beyond:
        return
    pipe = r.pipeline(transaction=False)
    for key in beyond:
        pipe.lrange(key, 0, lengths[key] - depth - 1)
    oldest = dict(zip(beyond, pipe.execute(), strict=True))
    # A redriven letter's row stays marked until its item is taken: dropped with the mark, it
    # would be neither pushed nor redriven again. The rows first: a crash in between (or a pump
    # that started meanwhile, when nothing is dropped) leaves a letter both queued and listed,
    # which may be pushed twice, never lost.
    letters = letter_rows(i for items in oldest.values() for i in items)
    if letters:
        DeadLetter.objects.filter(id__in=letters).update(redriven_at=None)
    over = {
        key: len(items) - len(letter_rows(items))
        for key, items in oldest.items()
        if bodies_drop_head(r, key, items)
    }
    if not any(over.values()):
        return
    r.hincrby(STATS, "dropped", sum(over.values()))
    events.dropped(over=over, reason="queue_depth")
    log.warning("queue depth limit: dropped %d oldest message(s)", sum(over.values()))
