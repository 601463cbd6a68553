"""Deliver (worker): build and send a pushed batch, and the policies a pump applies to its outcome:
retries and their schedule, ordering, dead letters, flow control."""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import transaction
from lxml import etree

from dispatch import flow, push
from dispatch import fragments as fragmentation
from dispatch.cloudevents import cloudevents_push
from dispatch.fanout import payload_root
from dispatch.models import DeadLetter
from dispatch.push import Outcome
from dispatch.selectors import Limits
from hpwsn import ns, wsn
from subscriptions.selectors import SubEntry
from topics.selectors import topic_tree
from topics.tree import TopicNode

log = logging.getLogger(__name__)

# The attempts at the heads of a subscription's queues share one list (state.attempts_key), each
# record naming the first item of its batch (`head`): they count for that batch only. A batch of
# another queue (a higher priority that arrived meanwhile) adds its own records beside those of the
# head it overtook, which keeps its count while it waits: deleting them gave that head more
# attempts than its schedule and a dead letter without them. A batch that leaves its queue ends
# only its own records.
ATTEMPTS_LUA = """
local function attempts_keep(key, keep)
  local all, kept = redis.call('lrange', key, 0, -1), {}
  for _, a in ipairs(all) do
    if keep(cjson.decode(a)['head']) then kept[#kept + 1] = a end
  end
  if #kept < #all then
    redis.call('del', key)
    if #kept > 0 then redis.call('rpush', key, unpack(kept)) end
  end
end
local function attempts_end(key, head)
  attempts_keep(key, function(h) return h ~= head end)
end
"""
# KEYS[1] the attempts, KEYS[2..] the subscription's queues; ARGV[1] the head, ARGV[2] the record.
# Returns the head's count. Records of a head no queue starts with any more (it left its queue
# another way: a queue bound's trim, a policy made unordered) go, or they would stay for ever.
ATTEMPT = (
    ATTEMPTS_LUA
    + """
local heads, n = {}, 0
for i = 2, #KEYS do
  local h = redis.call('lindex', KEYS[i], 0)
  if h then heads[h] = true end
end
attempts_keep(KEYS[1], function(h)
  if h == ARGV[1] then n = n + 1 end
  return h == ARGV[1] or heads[h] ~= nil
end)
redis.call('rpush', KEYS[1], ARGV[2])
return n + 1
"""
)
# KEYS[1] the attempts; ARGV[1] the head whose records end.
ATTEMPTS_END = ATTEMPTS_LUA + "attempts_end(KEYS[1], ARGV[1])\nreturn 1"


def _raw_bodies(fragments: list[bytes]) -> list[bytes]:
    bodies = []
    for fragment in fragments:
        message = payload_root(fragment).find(f"{{{ns.WSNT}}}Message")
        children = [c for c in message if isinstance(c.tag, str)] if message is not None else []
        bodies.append(etree.tostring(children[0]) if children else (message.text or "").encode())
    return bodies


def push_message_id(subscription_id: str, ids: list[str]) -> str:
    """The same batch to the same subscription always carries the same wsa:MessageID."""
    return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, subscription_id + ':' + ','.join(ids))}"


def topic_node(entry: SubEntry) -> TopicNode | None:
    """The subscribed topic (None for wildcard expressions), its policy at most a second old."""
    if not entry.topic_path:
        return None
    # A topic this process has not seen yet was created a moment ago: reload at once.
    return topic_tree(max_age=1.0).get(entry.topic_path) or topic_tree(max_age=0).get(
        entry.topic_path
    )


def _fragment_policy(entry: SubEntry) -> tuple[int, bool]:
    """Fragment size and partial delivery: the subscribed topic's policy, else the broker's."""
    node = topic_node(entry)
    if node is not None and node.policy.fragment_size:
        return node.policy.fragment_size, node.policy.partial_delivery
    return settings.HPWSN_FRAGMENT_SIZE, settings.HPWSN_FRAGMENT_PARTIAL


def deliver(entry: SubEntry, fragments: list[bytes], *, ids: list[str] | None = None) -> object:
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


def throttles(outcome: Outcome, attempt: int) -> bool:
    """Whether a failure makes the consumer wait at least HPWSN_RETRY_THROTTLED_MIN_S.

    A 429 says so at once. A timeout says it when it comes again (each one held a push for
    HPWSN_PUSH_TIMEOUT_S). A 503 follows the schedule, which backs off by itself, and its
    Retry-After when it has one: a consumer that drops an odd request with a 503 (5 % of them, say)
    meets two in a row every few hundred pushes, and a minute's wait each time held it minutes
    behind the others.
    """
    if not outcome.throttled:
        return False
    return outcome.status == 429 or attempt > 1


def retry_schedule(entry: SubEntry) -> Sequence[float]:
    """The schedule of the subscription's topic policy, else the broker's."""
    node = topic_node(entry)
    if node is not None and node.policy.retry_schedule:
        return node.policy.retry_schedule
    schedule: list[float] = settings.HPWSN_RETRY_SCHEDULE_S
    return schedule


def _topic_of(fragment: bytes) -> str:
    topic = payload_root(fragment).find(f"{{{ns.WSNT}}}Topic")
    return (topic.text or "").strip()[:1024] if topic is not None else ""


def dead_letter_store(
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


def ordered(entry: SubEntry) -> bool:
    """The ordered delivery of the subscription's topic policy (the default for wildcards)."""
    node = topic_node(entry)
    return node.policy.ordered if node is not None else True


def flow_wait(r: Any, consumer: str, limits: Limits, n: int) -> tuple[str | None, float]:
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


def batch_size(limits: Limits) -> int:
    size = settings.HPWSN_PUSH_BATCH
    if limits.window > 0:
        size = min(size, limits.window)
    if limits.rate > 0:
        size = min(size, max(1, int(limits.rate)))
    return size
