"""The way of a notification: accept (web), fan out and push (workers), retry (beat)."""

from __future__ import annotations

import hashlib
import logging
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from lxml import etree
from redis.exceptions import RedisError

from dispatch import flow, matching
from dispatch import fragments as fragmentation
from dispatch import reliable as reliable_log
from dispatch.bodies import bodies_hold, bodies_trim
from dispatch.cloudevents import cloudevents_push
from dispatch.filters import FilterRun
from dispatch.ids import notification_id_new
from dispatch.models import DeadLetter, StoredMessage
from dispatch.ready import pumps_ready
from dispatch.selectors import Limits
from hpwsn import errors, ns, topicexpr, wsn
from hpwsn_site import state
from hpwsn_site.soapcall import db
from monitoring import counters, events
from subscriptions.filterindex import FilterIndex
from subscriptions.registrations import registration_check
from subscriptions.selectors import SubEntry, subscription_index
from topics import acl
from topics.selectors import topic_tree, topic_tree_cached, topic_tree_is_fresh
from topics.tree import TopicNode, TopicTree

log = logging.getLogger(__name__)

STATS = state.PREFIX + "stats"
FANOUT_LEASE = state.PREFIX + "fanout:lease"

# Release a lease only if we still own it (a lease that expired may belong to another pump now).
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
# Renew a lease for ARGV[2] ms only if ARGV[1] still holds it; 1 if renewed, else 0.
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""

# The attempts at an ordered queue's head batch (KEYS[1]), each recording the batch's first item
# ARGV[1]: they count for that batch only. Another queue's batch (a higher priority that arrived
# meanwhile) starts its own count, and its success leaves the waiting head's count alone.
_ATTEMPT = """
local first = redis.call('lindex', KEYS[1], 0)
if first and cjson.decode(first)['head'] ~= ARGV[1] then redis.call('del', KEYS[1]) end
return redis.call('rpush', KEYS[1], ARGV[2])
"""
_ATTEMPTS_END = """
local first = redis.call('lindex', KEYS[1], 0)
if first and cjson.decode(first)['head'] == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


# ----------------------------------------------------------------------------- accept (web)


@dataclass(frozen=True, slots=True)
class Accepted:
    node: TopicNode
    fragment: bytes
    content: bytes


async def _tree(*, force: bool) -> TopicTree:
    tree = topic_tree_cached()
    if tree is None or force or not topic_tree_is_fresh():
        tree = await db(topic_tree, max_age=0 if force else 1.0)
    return tree


def _resolve(tree: TopicTree, n: wsn.NotificationIn) -> TopicNode | None:
    if n.topic is None:
        raise errors.TopicNotSupported("a notification must name its wsnt:Topic")
    expr = errors.topic_expression_parse(n.topic.text, n.topic.dialect, n.topic.nsmap)
    if not expr.is_concrete:
        raise errors.InvalidTopicExpression(
            f"the topic of a notification must be concrete, not '{n.topic.text}'"
        )
    root_ns, names, any_ns = expr.concrete()
    return tree.resolve(root_ns, names, any_ns)


async def _auto_create(
    tree: TopicTree, n: wsn.NotificationIn, principal: acl.Principal
) -> TopicNode | None:
    """Create a missing topic when its nearest existing ancestor's policy allows it (F1)."""
    assert n.topic is not None
    names = topicexpr.parse(n.topic.text, n.topic.dialect, n.topic.nsmap).concrete()[1]
    ancestor = tree.nearest_existing(names)
    if ancestor is None or not ancestor.policy.auto_create_children:
        return None
    # A publisher who may not publish there creates nothing either.
    acl.check_publish(ancestor.policy, principal, ":".join(names))
    from topics.services import topic_create

    await db(topic_create, path=":".join(names))
    return (await _tree(force=True)).get(":".join(names))


async def notifications_accept(
    *,
    notifications: list[wsn.NotificationIn],
    idempotency_key: str | None = None,
    principal: acl.Principal = acl.ANONYMOUS,
) -> list[str]:
    """Validate every message, then store them all; returns their ids.

    Messages of `reliable` topics are committed to the database log first (dispatch/reliable.py),
    those of `fast` topics go to Redis only; one atomic Redis script does all the Redis work. A
    repeated `idempotency_key` (wsa:MessageID or Idempotency-Key) within the dedup window stores
    nothing and returns the ids of the first acceptance.
    """
    tree = await _tree(force=False)
    accepted: list[Accepted] = []
    for n in notifications:
        node = _resolve(tree, n)
        if node is None:  # maybe created a moment ago in another process
            tree = await _tree(force=True)
            node = _resolve(tree, n)
            if node is None:
                node = await _auto_create(tree, n, principal)
                tree = await _tree(force=False)  # the reload that found the new topic
        if node is None:
            assert n.topic is not None
            raise errors.TopicNotSupported(f"topic '{n.topic.text}' is not in the topic tree")
        acl.check_publish(node.policy, principal, node.path)  # before anything is stored
        if node.policy.require_registration:  # WS-BrokeredNotification RegisterPublisher
            producer = wsn.producer_address(n)
            await db(registration_check, publisher_address=producer, topic_path=node.path)
        accepted.append(Accepted(node=node, fragment=wsn.stored_fragment(n), content=n.content_xml))
    # Thesis 5.3.3.4: a fragment that may not be delivered alone is held until its message is
    # whole; the message it completes is stored in its place. Its reassembly ends only once the
    # message is stored: if storing fails, the publisher's resend completes it again.
    accepted, claims = await fragmentation.fragments_hold(
        notifications=notifications, accepted=accepted
    )
    if not claims:
        return await _accepted_store(accepted, idempotency_key, principal)
    try:
        ids = await _accepted_store(accepted, idempotency_key, principal)
    except BaseException:
        await fragmentation.fragments_unclaim(claims)
        raise
    try:
        await fragmentation.fragments_done(claims)
    except RedisError:  # stored all the same: a resend within the claim is stored again
        log.warning("could not end %d reassembly(ies) after storing their messages", len(claims))
    return ids


async def _accepted_store(
    accepted: list[Accepted], idempotency_key: str | None, principal: acl.Principal
) -> list[str]:
    """Store validated messages: reliable ones in the log first, then the Redis work at once."""
    if not accepted:
        return []
    r = state.get_async_redis()
    # One clock for every host: a message's acceptance is compared with subscriptions' creation.
    now = state.shared_now()
    retention = settings.HPWSN_MESSAGE_RETENTION_S
    ids = [notification_id_new(now) for _a in accepted]
    if idempotency_key and len(idempotency_key) > 250:  # the column holds 300 characters
        idempotency_key = hashlib.sha256(idempotency_key.encode()).hexdigest()
    keys = [f"{idempotency_key}#{i}" if idempotency_key else None for i in range(len(ids))]
    reliable = [i for i, a in enumerate(accepted) if a.node.policy.reliability == "reliable"]
    fast = [i for i, a in enumerate(accepted) if a.node.policy.reliability != "reliable"]
    repeated: set[int] = set()
    if reliable:
        rows = [
            StoredMessage(
                notification_id=ids[i],
                topic_path=accepted[i].node.path,
                priority=accepted[i].node.policy.priority,
                payload=accepted[i].fragment,
                accepted_at=now,
                expires_at=now + accepted[i].node.policy.ttl_seconds
                if accepted[i].node.policy.ttl_seconds
                else None,
                idempotency_key=keys[i],
            )
            for i in reliable
        ]
        stored = await reliable_log.log_writer().store(rows)
        for i, nid in zip(reliable, stored, strict=True):
            if nid != ids[i]:
                ids[i] = nid
                repeated.add(i)
    fresh = [i for i in range(len(ids)) if i not in repeated]
    if not fresh:
        return ids
    args: list[object] = [settings.HPWSN_DEDUP_WINDOW_S, retention]
    for i in fresh:
        a = accepted[i]
        is_fast = a.node.policy.reliability != "reliable"
        # Past its topic's time-to-live a message is gone: the pump counts it expired.
        ttl = min(a.node.policy.ttl_seconds or retention, retention)
        args += [
            f"{state.PREFIX}idem:{keys[i]}" if is_fast and keys[i] else "",
            ids[i],
            state.current_key(a.node.path),
            a.content,
            state.payload_key(ids[i]) if is_fast else "",
            a.fragment if is_fast else b"",
            ttl,
            f"{ids[i]}|{now:.6f}|{a.node.path}" if is_fast else "",
        ]
    try:
        *firsts, scheduled = await _accept_script(r)(
            keys=[state.INGEST, STATS, state.FANOUT_SCHED], args=args
        )
    except RedisError:
        if fast:
            raise
        # Every message is in the database log: it is accepted. The checkpoint notices the log
        # is ahead of the fan-out and starts it once Redis is back.
        log.warning("Redis unavailable: %d reliable message(s) wait in the log", len(fresh))
        return ids
    for i, first in zip(fresh, firsts, strict=True):
        if first:  # a fast message whose idempotency key was seen within the window
            ids[i] = first.decode()
        else:
            counters.incr("accepted", topic=accepted[i].node.path)
            events.accepted(nid=ids[i], accepted=accepted[i], principal=principal)
    if scheduled:
        from dispatch.tasks import fanout

        await sync_to_async(fanout.delay, thread_sensitive=False)()
    return ids


# Accept in one round trip: per message (8 arguments) the idempotency key of a fast message ("" for
# none), its id, the topic's current-message key and content, and for a fast message its payload
# key, payload, time to live and ingest entry. Returns per message the id of the first acceptance
# of a repeated key ("" when new), then whether this call scheduled the fan-out.
_ACCEPT = """
local window, retention = tonumber(ARGV[1]), tonumber(ARGV[2])
local out, fresh = {}, 0
for b = 3, #ARGV, 8 do
  local first = false
  if ARGV[b] ~= '' then
    first = redis.call('set', ARGV[b], ARGV[b + 1], 'NX', 'GET', 'EX', window)
  end
  if first then
    out[#out + 1] = first
  else
    out[#out + 1] = ''
    fresh = fresh + 1
    redis.call('set', ARGV[b + 2], ARGV[b + 3], 'EX', retention)
    if ARGV[b + 4] ~= '' then
      redis.call('set', ARGV[b + 4], ARGV[b + 5], 'EX', tonumber(ARGV[b + 6]))
      redis.call('rpush', KEYS[1], ARGV[b + 7])
    end
  end
end
redis.call('hincrby', KEYS[2], 'accepted', fresh)
out[#out + 1] = redis.call('set', KEYS[3], '1', 'NX', 'EX', 60) and 1 or 0
return out
"""
_accept_scripts: dict[int, Any] = {}


def _accept_script(r: Any) -> Any:
    script = _accept_scripts.get(id(r))
    if script is None:
        script = _accept_scripts[id(r)] = r.register_script(_ACCEPT)
    return script


async def current_message_get(*, topic: wsn.TopicRef) -> bytes:
    """The last message published on exactly this topic."""
    tree = await _tree(force=False)
    n = wsn.NotificationIn(topic=topic, topic_xml=b"", message_xml=b"", content_xml=b"")
    node = _resolve(tree, n) or _resolve(await _tree(force=True), n)
    if node is None:
        raise errors.TopicNotSupported(f"topic '{topic.text}' is not in the topic tree")
    content = await state.get_async_redis().get(state.current_key(node.path))
    if content is None:
        raise errors.NoCurrentMessageOnTopic(f"no message has been published on '{topic.text}'")
    return bytes(content)


# ----------------------------------------------------------------------------- fan-out (worker)


def _payload_root(fragment: bytes) -> etree._Element:
    return etree.fromstring(b'<m xmlns:wsnt="' + ns.WSNT.encode() + b'">' + fragment + b"</m>")


def _eligible(e: SubEntry, m: _Msg, now: float, replay: dict[str, int], rest: int) -> bool:
    if e.expired(now):
        return False
    # Reliable messages go to the subscriptions that existed when they were accepted, and after a
    # Redis loss each subscription skips what it already had (see _fanout_batch).
    return m.seq is None or (e.created_ts <= m.accepted_at and m.seq > replay.get(e.id, rest))


def _message_element(fragment: bytes | None) -> etree._Element | None:
    return None if fragment is None else _payload_root(fragment).find(f"{{{ns.WSNT}}}Message")


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
            items = r.lpop(state.INGEST, batch) or []
            if items or rows:
                n = _fanout_batch(r, items=items, rows=rows, position=position or 0, token=token)
                if n < 0:
                    break  # another fan-out moved the position: the work is its own now
                moved += n
                batches += 1
                if rows:
                    position = rows[-1].seq
                if not r.eval(_RENEW, 1, FANOUT_LEASE, token, lease_ms):
                    break  # stalled past the lease: another fan-out owns the work now
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
        r.eval(_RELEASE, 1, FANOUT_LEASE, token)
    # Hand the flag back only now, without the lease: a publisher that finds it unset queues a
    # fan-out that can take the lease at once. Anything that arrived meanwhile is seen below.
    r.delete(state.FANOUT_SCHED)
    if _fanout_pending(r) and r.set(state.FANOUT_SCHED, "1", nx=True, ex=60):
        # Re-queued at the tail rather than looping, so pumps waiting for a worker run first.
        from dispatch.tasks import fanout

        fanout.delay()
    return moved


def _fanout_pending(r: Any) -> bool:
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
        msgs.append(_Msg(nid, path, b"f%d" % position, priority, float(ts)))
    expired = 0
    for row in rows:
        ttl = retention if row.expires_at is None else min(retention, row.expires_at - now)
        if ttl <= 0.001:
            expired += 1
            continue
        mark = b"r%d" % row.seq
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
) -> int:
    index = subscription_index()
    tree = topic_tree()
    now = time.time()
    msgs, expired = _fanout_messages(tree, items, rows, position, now)
    replay = {k.decode(): int(v) for k, v in r.hgetall(state.REPLAY).items()} if rows else {}
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
            subs = subs + [e for e in found if _eligible(e, m, now, replay, rest)]
        for e in subs:
            if not filters.passes(e, m.nid, m.payload):
                continue
            moved += 1
            refs[m.nid] = refs.get(m.nid, 0) + 1
            busy.add(e.id)
            if e.mode == "pull" and e.pull_point_id:
                pulls.setdefault(e.pull_point_id, []).append(
                    m.nid + b"|" + e.id.encode() + b"|" + m.mark
                )
            else:
                queues.setdefault((e.id, m.priority), []).append(m.nid + b"|" + m.mark)
                entries_of[e.id] = e
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
        token=token,
    )
    if results is None:
        return -1  # another fan-out moved the log position: it owns these rows now
    pull_lengths, queue_lengths, scheduled = results
    _pulls_bound(r, dict(zip(pulls, pull_lengths, strict=True)))
    # Only queues no pump drains are bounded: trimming under a pump that is pushing the head
    # would make it trim messages it never sent. A failing active consumer is suspended in time.
    _queues_bound(
        r,
        {
            state.queue_key(sid, prio): int(n)
            for (sid, prio), n in zip(queues, queue_lengths, strict=True)
            if entries_of[sid].paused
        },
    )
    if expired:
        r.hincrby(STATS, "expired", expired)
        counters.incr("expired", expired)
        events.expired(entry=None, n=expired)
    pumps_ready(r, (s for s, newly in scheduled.items() if newly and not entries_of[s].paused))
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
    return [e for e in index.matching(root_ns, names) if _eligible(e, m, now, replay, rest)]


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
    token: str | None = None,
) -> tuple[list[int], list[int], dict[str, bool]] | None:
    """Push the batch into the queues and move the log position, in one Redis transaction.

    The bodies of the messages go with them, counted (dispatch/bodies.py): a reliable message's
    body is written only if it went somewhere, a fast one's is deleted if it went nowhere.
    Fenced: the transaction runs only while this fan-out still holds the lease (`token`).
    """
    from redis.exceptions import WatchError

    with r.pipeline(transaction=True) as pipe:
        try:
            if token is not None:
                pipe.watch(FANOUT_LEASE)
                if pipe.get(FANOUT_LEASE) != token.encode():
                    pipe.unwatch()
                    raise WatchError
            if rows:
                # The lease makes this fan-out the only one; the check covers a lease that
                # expired under a stalled process while another took over.
                pipe.watch(state.FANOUT_SEQ)
                if int(pipe.get(state.FANOUT_SEQ) or 0) != position:
                    pipe.unwatch()
                    raise WatchError
            pipe.multi()
            bodies_hold(
                pipe,
                (
                    (
                        m.nid.decode(),
                        refs.get(m.nid, 0),
                        None if m.seq is None else int(m.ttl * 1000),
                        m.payload,
                    )
                    for m in msgs
                ),
            )
            first = len(pipe)
            for pp_id, values in pulls.items():
                pipe.rpush(state.pullpoint_key(pp_id), *values)
            for (sub_id, prio), values in queues.items():
                pipe.rpush(state.queue_key(sub_id, prio), *values)
            sub_ids = list(dict.fromkeys(sid for sid, _p in queues))
            for sub_id in sub_ids:
                pipe.set(state.pump_sched_key(sub_id), "1", nx=True)
            if busy:
                pipe.sadd(state.BUSY, *busy)
            if rows:
                pipe.set(state.FANOUT_SEQ, rows[-1].seq)
            pipe.hincrby(STATS, "matched", sum(len(v) for v in (*queues.values(), *pulls.values())))
            res = pipe.execute()[first:]
        except WatchError:
            if items:  # handed back, in order, to the fan-out that owns the position now
                r.lpush(state.INGEST, *reversed(items))
            return None
    n_pull, n_queue = len(pulls), len(queues)
    return (
        [int(x) for x in res[:n_pull]],
        [int(x) for x in res[n_pull : n_pull + n_queue]],
        dict(zip(sub_ids, res[n_pull + n_queue : n_pull + n_queue + len(sub_ids)], strict=True)),
    )


def _pulls_bound(r: Any, lengths: dict[str, int]) -> None:
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


def _queues_bound(r: Any, lengths: dict[str, int]) -> None:
    """Drop the oldest messages of queues beyond HPWSN_QUEUE_MAX_DEPTH, counted as `dropped`."""
    depth = settings.HPWSN_QUEUE_MAX_DEPTH
    over = {key: n - depth for key, n in lengths.items() if n > depth}
    if not over:
        return
    for key in over:
        bodies_trim(r, key, keep=depth, end="tail")
    r.hincrby(STATS, "dropped", sum(over.values()))
    events.dropped(over=over, reason="queue_depth")
    log.warning("queue depth limit: dropped %d oldest message(s)", sum(over.values()))


# ----------------------------------------------------------------------------- push (worker)


def pump_kick(*, subscription_id: str) -> None:
    """Make this subscription's pump run whether or not one is marked as scheduled."""
    pipe = state.get_redis().pipeline(transaction=False)
    pipe.set(state.pump_sched_key(subscription_id), "1")
    pumps_ready(pipe, [subscription_id])
    pipe.execute()


def _raw_bodies(fragments: list[bytes]) -> list[bytes]:
    bodies = []
    for fragment in fragments:
        message = _payload_root(fragment).find(f"{{{ns.WSNT}}}Message")
        children = [c for c in message if isinstance(c.tag, str)] if message is not None else []
        bodies.append(etree.tostring(children[0]) if children else (message.text or "").encode())
    return bodies


def push_message_id(subscription_id: str, ids: list[str]) -> str:
    """The same batch to the same subscription always carries the same wsa:MessageID."""
    return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, subscription_id + ':' + ','.join(ids))}"


def _topic_node(entry: SubEntry) -> TopicNode | None:
    """The subscribed topic (None for wildcard expressions), its policy at most a second old."""
    if not entry.topic_path:
        return None
    # A topic this process has not seen yet was created a moment ago: reload at once.
    return topic_tree(max_age=1.0).get(entry.topic_path) or topic_tree(max_age=0).get(
        entry.topic_path
    )


def _fragment_policy(entry: SubEntry) -> tuple[int, bool]:
    """Fragment size and partial delivery: the subscribed topic's policy, else the broker's."""
    node = _topic_node(entry)
    if node is not None and node.policy.fragment_size:
        return node.policy.fragment_size, node.policy.partial_delivery
    return settings.HPWSN_FRAGMENT_SIZE, settings.HPWSN_FRAGMENT_PARTIAL


def _deliver(entry: SubEntry, fragments: list[bytes], *, ids: list[str] | None = None) -> object:
    from dispatch import push

    ids = ids or [uuid.uuid4().hex for _f in fragments]
    if entry.format == "cloudevents":
        return cloudevents_push(entry, fragments, ids=ids, message_id_of=push_message_id)
    if entry.use_raw:
        outcome = None
        for nid, body in zip(ids, _raw_bodies(fragments), strict=True):
            outcome = push.post(
                entry.consumer_address,
                body,
                soap_version=entry.soap_version,
                raw=True,
                message_id=push_message_id(entry.id, [nid]),
                secret=entry.signing_secret,
            )
            if not outcome.ok:
                # The head stays queued; bodies already sent may be resent (at-least-once).
                return outcome
        return outcome
    fragment_size, partial = _fragment_policy(entry)
    # Thesis 5.3.3.4: a message larger than the fragment size goes as fragments, in order, at
    # most HPWSN_PUSH_BATCH items per Notify (one batch, as queued, when nothing is split).
    outcome = None
    for batch_ids, batch in fragmentation.push_batches(
        stored=fragments,
        ids=ids,
        fragment_size=fragment_size,
        partial=partial,
        batch=settings.HPWSN_PUSH_BATCH,
    ):
        message_id = push_message_id(entry.id, batch_ids)
        envelope = wsn.notify_envelope(
            version=entry.soap_version,
            to=entry.consumer_address,
            message_id=message_id,
            items=[(entry.reference_address, f) for f in batch],
            ids=batch_ids,
        )
        outcome = push.post(
            entry.consumer_address,
            envelope,
            soap_version=entry.soap_version,
            message_id=message_id,
            secret=entry.signing_secret,
        )
        if not outcome.ok:
            return outcome  # the head stays queued; batches already sent may be resent
    return outcome


def retry_delay(
    *,
    attempt: int,
    schedule: Sequence[float],
    jitter: float,
    retry_after: float | None = None,
    throttled: bool = False,
    throttled_min: float = 0.0,
) -> float | None:
    """Seconds to wait after the `attempt`-th failed try at a batch; None: the schedule is spent."""
    if attempt > len(schedule):
        return None
    delay = schedule[attempt - 1] * random.uniform(1 - jitter, 1 + jitter)
    if throttled:  # a consumer that says it is overloaded is not hammered every few seconds
        delay = max(delay, throttled_min)
    return max(delay, retry_after or 0.0)


def _retry_schedule(entry: SubEntry) -> Sequence[float]:
    """The schedule of the subscription's topic policy, else the broker's."""
    node = _topic_node(entry)
    if node is not None and node.policy.retry_schedule:
        return node.policy.retry_schedule
    schedule: list[float] = settings.HPWSN_RETRY_SCHEDULE_S
    return schedule


def _topic_of(fragment: bytes) -> str:
    topic = _payload_root(fragment).find(f"{{{ns.WSNT}}}Topic")
    return (topic.text or "").strip()[:1024] if topic is not None else ""


def _dead_letter(
    *,
    entry: SubEntry,
    live: list[tuple[str, bytes]],
    reason: str,
    attempts: list[Any],
    redriven: list[int],
) -> None:
    """Store the batch as dead letters; letters redriven into it are replaced by the new ones."""
    with transaction.atomic():
        if redriven:
            DeadLetter.objects.filter(id__in=redriven).delete()
        DeadLetter.objects.bulk_create(
            DeadLetter(
                subscription_id=entry.id,
                consumer_address=entry.consumer_address,
                notification_id=nid,
                topic=_topic_of(payload),
                message=payload,
                reason=reason,
                attempts=attempts,
            )
            for nid, payload in live
        )


# Unordered subscriptions: a run of this many failed batches in a row ends the pump's run (the
# consumer looks down) until the first batch set aside is due.
UNORDERED_FAILURES_IN_A_ROW = 3


def _ordered(entry: SubEntry) -> bool:
    """The ordered delivery of the subscription's topic policy (the default for wildcards)."""
    node = _topic_node(entry)
    return node.policy.ordered if node is not None else True


def _flow_wait(r: Any, consumer: str, limits: Limits, n: int) -> tuple[str | None, float]:
    """A window grant for n messages to the consumer, or None and how long to wait for one.

    The window first: the rate's tokens are only taken once a grant is held, so a pump waiting
    for room in the window does not spend the consumer's rate.
    """
    deadline = time.monotonic() + 0.2
    while True:
        grant = flow.window_acquire(
            r, consumer=consumer, n=n, window=limits.window, hold_s=settings.HPWSN_LEASE_S
        )
        if grant is None:
            wait = 0.01
        else:
            wait = flow.rate_wait(r, consumer=consumer, n=n, rate=limits.rate)
            if wait <= 0:
                return grant, 0.0
            flow.window_release(r, consumer=consumer, grant=grant)
        if time.monotonic() + wait > deadline:
            return None, max(wait, 0.2)
        time.sleep(wait)


def _batch_size(limits: Limits) -> int:
    size = settings.HPWSN_PUSH_BATCH
    if limits.window > 0:
        size = min(size, limits.window)
    if limits.rate > 0:
        size = min(size, max(1, int(limits.rate)))
    return size


def _forget(r: Any, sid: str) -> None:
    pipe = r.pipeline(transaction=False)
    state.subscription_forget(pipe, sid)
    pipe.execute()


def subscription_gone(sid: str) -> bool:
    """True if the subscription no longer exists; a process's index may not have a new one yet."""
    from subscriptions.models import Subscription

    try:
        return not Subscription.objects.filter(id=sid).exists()
    except (ValueError, ValidationError):  # not even an id
        return True


def retry_sweep() -> int:
    """Queue a pump for every subscription whose next attempt (or batch set aside) is due."""
    r = state.get_redis()
    kicked = 0
    now = time.time()
    for key in (state.RETRY, state.ASIDE_DUE):
        for raw in r.zrangebyscore(key, 0, now):
            if r.zrem(key, raw):
                pumps_ready(r, [raw.decode()])
                kicked += 1
    return kicked


def stall_sweep() -> int:
    """Safety net: restart work whose task was lost (a killed worker), and free orphan queues."""
    r = state.get_redis()
    kicked = 0
    if _fanout_pending(r) and not r.exists(FANOUT_LEASE):
        from dispatch.tasks import fanout

        r.set(state.FANOUT_SCHED, "1", ex=60)
        fanout.delay()
        kicked += 1
    index = subscription_index()
    for raw in r.smembers(state.BUSY):
        sid = raw.decode()
        entry = index.by_id.get(sid)
        if entry is None:
            if subscription_gone(sid):
                _forget(r, sid)
            continue  # the checkpoint takes it out of the set once gone
        if entry.mode != "push" or entry.paused:
            continue
        if r.exists(state.lease_key(sid)) or r.zscore(state.RETRY, sid) is not None:
            continue
        if not r.exists(*state.queue_keys(sid)):
            continue
        pump_kick(subscription_id=sid)
        kicked += 1
    return kicked


def consumer_limit_set(*, consumer: str, window: int | None, rate: float | None) -> None:
    """Set (or with both None, remove) one consumer's flow-control limits; every worker reloads."""
    from dispatch.models import ConsumerLimit

    key = flow.consumer_of(consumer)
    if window is None and rate is None:
        ConsumerLimit.objects.filter(consumer=key).delete()
    else:
        ConsumerLimit.objects.update_or_create(
            consumer=key, defaults={"window": window, "rate": rate}
        )
    state.bump(state.VERSION_LIMITS)
