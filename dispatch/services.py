"""The way of a notification: accept (web), fan out and push (workers), retry (beat)."""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from lxml import etree

from dispatch import fragments as fragmentation
from dispatch.ids import notification_id_new, notification_id_time
from hpwsn import errors, ns, topicexpr, wsn
from hpwsn_site import state
from hpwsn_site.soapcall import db
from monitoring import counters
from subscriptions.selectors import SubEntry, subscription_index
from topics.selectors import topic_tree, topic_tree_cached, topic_tree_is_fresh
from topics.tree import TopicNode, TopicTree

log = logging.getLogger(__name__)

STATS = state.PREFIX + "stats"
LEASE_MS = 60_000
FANOUT_LEASE = state.PREFIX + "fanout:lease"

# Release a lease only if we still own it (a lease that expired may belong to another pump now).
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
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
    try:
        expr = topicexpr.parse(n.topic.text, n.topic.dialect, n.topic.nsmap)
    except topicexpr.UnknownDialectError as exc:
        raise errors.TopicExpressionDialectUnknown(str(exc)) from None
    except topicexpr.TopicExpressionError as exc:
        raise errors.InvalidTopicExpression(str(exc)) from None
    if not expr.is_concrete:
        raise errors.InvalidTopicExpression(
            f"the topic of a notification must be concrete, not '{n.topic.text}'"
        )
    root_ns, names, any_ns = expr.concrete()
    return tree.resolve(root_ns, names, any_ns)


async def _auto_create(tree: TopicTree, n: wsn.NotificationIn) -> TopicNode | None:
    """Create a missing topic when its nearest existing ancestor's policy allows it (F1)."""
    assert n.topic is not None
    names = topicexpr.parse(n.topic.text, n.topic.dialect, n.topic.nsmap).concrete()[1]
    ancestor = tree.nearest_existing(names)
    if ancestor is None or not ancestor.policy.auto_create_children:
        return None
    from topics.services import topic_create

    await db(topic_create, path=":".join(names))
    return (await _tree(force=True)).get(":".join(names))


async def notifications_accept(*, notifications: list[wsn.NotificationIn]) -> list[str]:
    """Validate every message, then store them all in one Redis transaction; returns their ids."""
    tree = await _tree(force=False)
    accepted: list[Accepted] = []
    for n in notifications:
        node = _resolve(tree, n)
        if node is None:  # maybe created a moment ago in another process
            tree = await _tree(force=True)
            node = _resolve(tree, n)
            if node is None:
                node = await _auto_create(tree, n)
                tree = await _tree(force=False)  # the reload that found the new topic
        if node is None:
            assert n.topic is not None
            raise errors.TopicNotSupported(f"topic '{n.topic.text}' is not in the topic tree")
        accepted.append(Accepted(node=node, fragment=wsn.stored_fragment(n), content=n.content_xml))
    # Thesis 5.3.3.4: a fragment that may not be delivered alone is held until its message is
    # whole; the message it completes is stored below in its place.
    accepted = await fragmentation.fragments_hold(notifications=notifications, accepted=accepted)
    if not accepted:
        return []
    r = state.get_async_redis()
    now = time.time()
    ids = []
    retention = settings.HPWSN_MESSAGE_RETENTION_S
    async with r.pipeline(transaction=True) as pipe:
        for a in accepted:
            nid = notification_id_new(now)
            ids.append(nid)
            # A message past its topic's time-to-live is gone: the pump counts it as expired.
            ttl = min(a.node.policy.ttl_seconds or retention, retention)
            pipe.set(state.payload_key(nid), a.fragment, ex=ttl)
            pipe.set(state.current_key(a.node.path), a.content, ex=retention)
            pipe.rpush(state.INGEST, f"{nid}|{now:.6f}|{a.node.path}")
        pipe.hincrby(STATS, "accepted", len(accepted))
        pipe.set(state.FANOUT_SCHED, "1", nx=True, ex=60)
        results = await pipe.execute()
    for a in accepted:
        counters.incr("accepted", topic=a.node.path)
    if results[-1]:
        from dispatch.tasks import fanout

        await sync_to_async(fanout.delay, thread_sensitive=False)()
    return ids


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


def _filter_passes(entry: SubEntry, message: etree._Element | None) -> bool:
    if entry.content_filter is None:
        return True
    if message is None:
        return False
    try:
        return bool(entry.content_filter(message))
    except etree.XPathError:
        return False


def _message_element(fragment: bytes | None) -> etree._Element | None:
    return None if fragment is None else _payload_root(fragment).find(f"{{{ns.WSNT}}}Message")


def fanout_run(*, linger: float = 0.1, max_run: float = 0.25) -> int:
    """Drain the ingest list into per-subscription queues, in order; one fan-out at a time."""
    r = state.get_redis()
    token = uuid.uuid4().hex
    if not r.set(FANOUT_LEASE, token, nx=True, px=LEASE_MS):
        return 0
    tick = settings.HPWSN_FANOUT_TICK_S
    batch = settings.HPWSN_FANOUT_BATCH
    started = idle_since = time.monotonic()
    moved = 0
    try:
        while time.monotonic() - started < max_run:
            items = r.lpop(state.INGEST, batch)
            if items:
                moved += _fanout_batch(r, items)
                r.pexpire(FANOUT_LEASE, LEASE_MS)
                idle_since = time.monotonic()
                if len(items) < batch:
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
    if r.llen(state.INGEST) and r.set(state.FANOUT_SCHED, "1", nx=True, ex=60):
        # Re-queued at the tail rather than looping, so pumps waiting for a worker run first.
        from dispatch.tasks import fanout

        fanout.delay()
    return moved


def _fanout_batch(r: Any, items: list[bytes]) -> int:
    index = subscription_index()
    tree = topic_tree()
    now = time.time()
    queues: dict[str, list[bytes]] = {}
    pulls: dict[str, list[bytes]] = {}
    entries_of: dict[str, SubEntry] = {}
    matched: list[tuple[bytes, list[SubEntry]]] = []
    need_payload: list[bytes] = []
    for item in items:
        nid, _ts, path = item.split(b"|", 2)
        node = tree.get(path.decode())
        names = tuple(path.decode().split(":"))
        subs = [e for e in index.matching(node.root_namespace if node else None, names)]
        subs = [e for e in subs if not e.expired(now)]
        if any(e.content_filter is not None for e in subs):
            need_payload.append(nid)
        matched.append((nid, subs))
    # Each message a filter reads is parsed once, however many filtered subscriptions it meets.
    messages: dict[bytes, etree._Element | None] = {}
    if need_payload:
        found = r.mget([state.payload_key(n.decode()) for n in need_payload])
        messages = {n: _message_element(f) for n, f in zip(need_payload, found, strict=True)}
    moved = 0
    for nid, subs in matched:
        for e in subs:
            if e.content_filter is not None and not _filter_passes(e, messages.get(nid)):
                continue
            moved += 1
            if e.mode == "pull" and e.pull_point_id:
                pulls.setdefault(e.pull_point_id, []).append(nid + b"|" + e.id.encode())
            else:
                queues.setdefault(e.id, []).append(nid)
                entries_of[e.id] = e
    pipe = r.pipeline(transaction=False)
    for pp_id, values in pulls.items():
        key = state.pullpoint_key(pp_id)
        pipe.rpush(key, *values)
        # A pull point holds at most its depth; the oldest messages go first.
        pipe.ltrim(key, -settings.HPWSN_PULLPOINT_MAX_DEPTH, -1)
    sub_ids = list(queues)
    for sub_id in sub_ids:
        pipe.rpush(state.queue_key(sub_id), *queues[sub_id])
    for sub_id in sub_ids:
        pipe.set(state.pump_sched_key(sub_id), "1", nx=True)
    pipe.hincrby(STATS, "matched", moved)
    results = pipe.execute()
    lengths = results[len(pulls) * 2 : len(pulls) * 2 + len(sub_ids)]
    scheduled = results[len(pulls) * 2 + len(sub_ids) : len(pulls) * 2 + 2 * len(sub_ids)]
    # Only queues no pump drains are bounded: trimming under a pump that is pushing the head
    # would make it trim messages it never sent. A failing active consumer is suspended in time.
    _queues_bound(
        r,
        {s: int(n) for s, n in zip(sub_ids, lengths, strict=True) if entries_of[s].paused},
    )
    from dispatch.tasks import pump

    for sub_id, newly in zip(sub_ids, scheduled, strict=True):
        if newly and not entries_of[sub_id].paused:
            pump.delay(sub_id)
    return moved


def _queues_bound(r: Any, lengths: dict[str, int]) -> None:
    """Drop the oldest messages of queues beyond HPWSN_QUEUE_MAX_DEPTH, counted as `dropped`."""
    depth = settings.HPWSN_QUEUE_MAX_DEPTH
    over = {sid: n - depth for sid, n in lengths.items() if n > depth}
    if not over:
        return
    pipe = r.pipeline(transaction=False)
    for sid in over:
        pipe.ltrim(state.queue_key(sid), -depth, -1)
    pipe.hincrby(STATS, "dropped", sum(over.values()))
    pipe.execute()
    log.warning("queue depth limit: dropped %d oldest message(s)", sum(over.values()))


# ----------------------------------------------------------------------------- push (worker)


def pump_kick(*, subscription_id: str) -> None:
    """Queue a pump for this subscription whether or not one is marked as scheduled."""
    from dispatch.tasks import pump

    state.get_redis().set(state.pump_sched_key(subscription_id), "1")
    pump.delay(subscription_id)


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


def _deliver(entry: SubEntry, fragments: list[bytes], *, ids: list[str] | None = None) -> object:
    from dispatch import push

    ids = ids or [uuid.uuid4().hex for _f in fragments]
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
    # Thesis 5.3.3.4: a message larger than HPWSN_FRAGMENT_SIZE goes as fragments, in order, at
    # most HPWSN_PUSH_BATCH items per Notify (one batch, as queued, when nothing is split).
    outcome = None
    for batch_ids, batch in fragmentation.push_batches(
        stored=fragments,
        ids=ids,
        fragment_size=settings.HPWSN_FRAGMENT_SIZE,
        partial=settings.HPWSN_FRAGMENT_PARTIAL,
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
    if entry.topic_path:
        node = topic_tree(max_age=1.0).get(entry.topic_path)
        if node is not None and node.policy.retry_schedule:
            return node.policy.retry_schedule
    schedule: list[float] = settings.HPWSN_RETRY_SCHEDULE_S
    return schedule


def _topic_of(fragment: bytes) -> str:
    topic = _payload_root(fragment).find(f"{{{ns.WSNT}}}Topic")
    return (topic.text or "").strip()[:1024] if topic is not None else ""


def _dead_letter(
    *, entry: SubEntry, live: list[tuple[str, bytes]], reason: str, attempts: list[Any]
) -> None:
    from dispatch.models import DeadLetter

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


def pump_run(*, subscription_id: str) -> int:
    """Drain one subscription's queue in order, one pump at a time; returns messages delivered."""
    from dispatch.push import Outcome

    r = state.get_redis()
    sid = subscription_id
    entry = subscription_index().by_id.get(sid)
    if entry is None:  # unsubscribed: whatever the fan-out left behind goes too
        r.delete(state.queue_key(sid), state.pump_sched_key(sid))
        return 0
    if entry.paused or entry.expired(time.time()) or entry.mode != "push":
        return 0
    due = r.zscore(state.RETRY, sid)
    if due is not None and due > time.time():
        return 0  # backing off: the retry sweeper queues us when due
    token = uuid.uuid4().hex
    if not r.set(state.lease_key(sid), token, nx=True, px=LEASE_MS):
        return 0  # another pump drains this queue; it re-checks the queue before leaving
    delivered = 0
    backoff = False
    try:
        queue = state.queue_key(sid)
        while True:
            ids = r.lrange(queue, 0, settings.HPWSN_PUSH_BATCH - 1)
            if not ids:
                r.delete(state.pump_sched_key(sid))
                if r.llen(queue) == 0:
                    break
                continue
            entry = subscription_index(max_age=1.0).by_id.get(sid)
            if entry is None or entry.paused or entry.expired(time.time()):
                break
            payloads = r.mget([state.payload_key(i.decode()) for i in ids])
            live = [(i.decode(), p) for i, p in zip(ids, payloads, strict=True) if p is not None]
            fragments = [p for _i, p in live]
            started = time.monotonic()
            outcome = (
                _deliver(entry, fragments, ids=[i for i, _p in live])
                if fragments
                else Outcome(ok=True)
            )
            duration_ms = round((time.monotonic() - started) * 1000)
            assert isinstance(outcome, Outcome)
            pipe = r.pipeline(transaction=False)
            if outcome.ok:
                pipe.ltrim(queue, len(ids), -1)
                pipe.pexpire(state.lease_key(sid), LEASE_MS)
                pipe.delete(state.attempts_key(sid))
                if fragments:  # only an answer from the consumer ends a run of failures
                    pipe.delete(state.failing_since_key(sid))
                pipe.hincrby(STATS, "delivered", len(fragments))
                pipe.hincrby(STATS, "expired", len(ids) - len(fragments))
                pipe.execute()
                delivered += len(fragments)
                counters.incr("delivered", len(fragments), consumer=entry.consumer_address)
                counters.incr("expired", len(ids) - len(fragments))
                now = time.time()
                counters.observe_latencies(
                    now - t for i, _p in live if (t := notification_id_time(i)) is not None
                )
                continue
            now = time.time()
            record = {
                "time": now,
                "status": outcome.status,
                "detail": outcome.detail[:200],
                "duration_ms": duration_ms,
            }
            pipe.rpush(state.attempts_key(sid), json.dumps(record))
            pipe.set(state.failing_since_key(sid), repr(now), nx=True)
            pipe.get(state.failing_since_key(sid))
            attempt, _set, failing_since = pipe.execute()
            counters.incr("failed", consumer=entry.consumer_address)
            delay = (
                None
                if outcome.permanent
                else retry_delay(
                    attempt=int(attempt),
                    schedule=_retry_schedule(entry),
                    jitter=settings.HPWSN_RETRY_JITTER,
                    retry_after=outcome.retry_after,
                    throttled=outcome.throttled,
                    throttled_min=settings.HPWSN_RETRY_THROTTLED_MIN_S,
                )
            )
            if delay is None:
                history = [json.loads(a) for a in r.lrange(state.attempts_key(sid), 0, -1)]
                reason = "permanent" if outcome.permanent else "exhausted"
                # The row is written before the head is trimmed: a crash in between leaves the
                # batch queued (delivered again later), never lost.
                _dead_letter(entry=entry, live=live, reason=reason, attempts=history)
                pipe = r.pipeline(transaction=False)
                pipe.ltrim(queue, len(ids), -1)
                pipe.pexpire(state.lease_key(sid), LEASE_MS)
                pipe.delete(state.attempts_key(sid))
                pipe.hincrby(STATS, "dead", len(live))
                pipe.hincrby(STATS, "expired", len(ids) - len(live))
                pipe.execute()
                counters.incr("dead", len(live), consumer=entry.consumer_address)
                counters.incr("expired", len(ids) - len(live))
                log.warning(
                    "%s failure for %s after %d attempt(s): %s %s",
                    reason,
                    sid,
                    attempt,
                    outcome.status,
                    outcome.detail,
                )
            else:
                pipe = r.pipeline(transaction=False)
                pipe.zadd(state.RETRY, {sid: now + delay})
                pipe.hincrby(STATS, "failed", 1)
                pipe.execute()
                counters.incr("retried", consumer=entry.consumer_address)
                log.info(
                    "delivery to %s failed (%s); retry %d in %.1fs",
                    sid,
                    outcome.detail,
                    attempt,
                    delay,
                )
            if now - float(failing_since) >= settings.HPWSN_SUSPEND_AFTER_S:
                from subscriptions.services import subscription_suspend

                subscription_suspend(subscription_id=sid)
                backoff = True
                break
            if delay is None:
                continue  # the next batch gets its own attempts
            backoff = True
            break
    finally:
        r.eval(_RELEASE, 1, state.lease_key(sid), token)
    if (
        not backoff
        and r.llen(state.queue_key(sid))
        and r.set(state.pump_sched_key(sid), "1", nx=True)
    ):
        from dispatch.tasks import pump

        pump.delay(sid)
    return delivered


def retry_sweep() -> int:
    """Queue a pump for every subscription whose next attempt is due."""
    r = state.get_redis()
    due = r.zrangebyscore(state.RETRY, 0, time.time())
    from dispatch.tasks import pump

    for raw in due:
        if r.zrem(state.RETRY, raw):
            pump.delay(raw.decode())
    return len(due)


def stall_sweep() -> int:
    """Safety net: restart work whose task was lost (a killed worker), and free orphan queues."""
    r = state.get_redis()
    kicked = 0
    if r.llen(state.INGEST) and not r.exists(FANOUT_LEASE):
        from dispatch.tasks import fanout

        r.set(state.FANOUT_SCHED, "1", ex=60)
        fanout.delay()
        kicked += 1
    index = subscription_index()
    for key in r.scan_iter(match=state.queue_key("*"), count=1000):
        sid = key.decode().rsplit(":", 1)[1]
        entry = index.by_id.get(sid)
        if entry is None:
            r.delete(key, state.pump_sched_key(sid))
            continue
        if entry.paused or r.exists(state.lease_key(sid)) or r.zscore(state.RETRY, sid) is not None:
            continue
        pump_kick(subscription_id=sid)
        kicked += 1
    return kicked
