"""Accept (web): validate, authorise and store notifications; reliable ones in the log first."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from redis.exceptions import RedisError

from dispatch import fragments as fragmentation
from dispatch import reliable as reliable_log
from dispatch import tasks
from dispatch.ids import notification_id_new
from dispatch.services import STATS
from hpwsn import errors, topicexpr, wsn
from hpwsn_site import state
from hpwsn_site.soapcall import db
from monitoring import counters, events
from subscriptions.registrations import registration_check
from topics import acl
from topics.selectors import topic_tree, topic_tree_cached, topic_tree_is_fresh
from topics.services import topic_create, topic_names_check
from topics.tree import TopicNode, TopicTree

log = logging.getLogger(__name__)


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
    try:
        root_ns, names, any_ns = expr.concrete()
    except topicexpr.TopicExpressionError:
        raise errors.InvalidTopicExpression(
            f"the topic of a notification must be concrete, not '{n.topic.text}'"
        ) from None
    return tree.resolve(root_ns, names, any_ns)


def _creator(tree: TopicTree, n: wsn.NotificationIn) -> tuple[TopicNode, str] | None:
    """The nearest existing ancestor of a missing topic that makes children on publish (F1), and
    the missing topic's path; None when there is none."""
    assert n.topic is not None
    names = topicexpr.parse(n.topic.text, n.topic.dialect, n.topic.nsmap).concrete()[1]
    ancestor = tree.nearest_existing(names)
    if ancestor is None or not ancestor.policy.auto_create_children:
        return None
    try:
        topic_names_check(names)
    except ValueError as exc:
        raise errors.InvalidTopicExpression(str(exc)) from None
    return ancestor, ":".join(names)


def _creation_check(tree: TopicTree, paths: list[str]) -> None:
    """A publish creates at most HPWSN_AUTO_CREATE_MAX_PER_NOTIFY topics (ancestors included),
    and none that would take the tree past HPWSN_MAX_TOPICS: each is a database row, a directory
    entry and a node in every process's tree, made by whoever may publish."""
    new: dict[str, None] = {}
    for path in paths:
        names = path.split(":")
        for depth in range(1, len(names) + 1):
            prefix = ":".join(names[:depth])
            if tree.get(prefix) is None:
                new[prefix] = None
    per_notify, most = settings.HPWSN_AUTO_CREATE_MAX_PER_NOTIFY, settings.HPWSN_MAX_TOPICS
    if len(new) > per_notify:
        raise errors.TopicNotSupported(
            f"topic '{paths[0]}' is not in the topic tree, and this publish would create "
            f"{len(new)} topics, more than HPWSN_AUTO_CREATE_MAX_PER_NOTIFY ({per_notify})"
        )
    if len(tree) + len(new) > most:
        raise errors.TopicNotSupported(
            f"topic '{paths[0]}' is not in the topic tree, and the tree holds {len(tree)} topics: "
            f"{len(new)} more would pass HPWSN_MAX_TOPICS ({most})"
        )


async def _registered(n: wsn.NotificationIn, path: str) -> None:
    """WS-BrokeredNotification RegisterPublisher: the publisher is registered for `path`."""
    await db(registration_check, publisher_address=wsn.producer_address(n), topic_path=path)


async def notifications_accept(
    *,
    notifications: list[wsn.NotificationIn],
    idempotency_key: str | None = None,
    principal: acl.Principal = acl.ANONYMOUS,
    client: str = "",
) -> list[str]:
    """Validate every message, then store them all; returns their ids.

    Messages of `reliable` topics are committed to the database log first (dispatch/reliable.py),
    those of `fast` topics go to Redis only; one atomic Redis script does all the Redis work. A
    repeated `idempotency_key` (wsa:MessageID or Idempotency-Key) within the dedup window stores
    nothing and returns the ids of the first acceptance. The topics a publish creates are created
    once every message has passed: a refused Notify changes nothing. `client`: the caller's address,
    which keeps an anonymous caller's fragments apart from another's (acl.Principal.publisher).
    """
    tree = await _tree(force=False)
    nodes: list[TopicNode | None] = []
    to_create: dict[int, str] = {}  # message index -> the path of the topic it creates
    creating: dict[str, None] = {}  # the paths of to_create, once each
    forced = False
    for i, n in enumerate(notifications):
        node = _resolve(tree, n)
        if node is None and not forced:  # maybe created a moment ago in another process
            tree, forced = await _tree(force=True), True
            node = _resolve(tree, n)
        if node is None:
            found = _creator(tree, n)
            if found is None:
                assert n.topic is not None
                raise errors.TopicNotSupported(f"topic '{n.topic.text}' is not in the topic tree")
            # The new topic inherits its ancestor's policy: a publisher who may not publish there
            # (or is not registered for it) creates nothing either.
            ancestor, path = found
            acl.check_publish(ancestor.policy, principal, path)
            if ancestor.policy.require_registration:
                await _registered(n, path)
            to_create[i] = path
            creating[path] = None
            if len(creating) > settings.HPWSN_AUTO_CREATE_MAX_PER_NOTIFY:
                _creation_check(tree, list(creating))  # refused before reading the rest
        else:
            acl.check_publish(node.policy, principal, node.path)  # before anything is stored
            if node.policy.require_registration:
                await _registered(n, node.path)
        nodes.append(node)
    if to_create:
        _creation_check(tree, list(creating))
        for path in creating:
            await db(topic_create, path=path)
        tree = await _tree(force=True)
        for i, path in to_create.items():
            made = tree.get(path)
            if made is None:  # removed again at once by an operator
                raise errors.TopicNotSupported(f"topic '{path}' is not in the topic tree")
            acl.check_publish(made.policy, principal, made.path)  # its policy as stored
            nodes[i] = made
    accepted = [
        Accepted(node=node, fragment=wsn.stored_fragment(n), content=n.content_xml)
        for node, n in zip(nodes, notifications, strict=True)
        if node is not None
    ]
    # Thesis 5.3.3.4: a fragment that may not be delivered alone is held until its message is
    # whole; the message it completes is stored in its place. Its reassembly ends only once the
    # message is stored: if storing fails, the publisher's resend completes it again.
    accepted, claims = await fragmentation.fragments_hold(
        notifications=notifications, accepted=accepted, publisher=principal.publisher(client)
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
            reliable_log.LogEntry(
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
    args: list[object] = []
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
        firsts = await _accept_batcher(r).call(args)
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
    return ids


# Accept in one round trip: per message (8 arguments) the idempotency key of a fast message ("" for
# none), its id, the topic's current-message key and content, and for a fast message its payload
# key, payload, time to live and ingest entry. Returns per message the id of the first acceptance
# of a repeated key ("" when new), then whether this call scheduled the fan-out (the caller starts
# it).
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
_ACCEPT_ARGS = 8  # per message


class _AcceptBatcher:
    """The accept scripts of the requests that are ready at once go to Redis as one call.

    The reliable log commits the messages of concurrent requests together (dispatch/reliable.py),
    and every request of a commit then resumes in the same turn of the event loop: each adds its
    messages here, and the first schedules one call of `_ACCEPT` for all of them at the next
    turn. Each request gets its own messages' answers back, in its order, once the fan-out task
    is sent when the call found none pending (one task for the whole call).
    """

    def __init__(self, r: Any) -> None:
        self._script = r.register_script(_ACCEPT)
        self._waiting: list[tuple[list[object], asyncio.Future[list[bytes]]]] = []
        self._sending: set[asyncio.Task[None]] = set()  # held until done (the loop holds weakly)

    async def call(self, args: list[object]) -> list[bytes]:
        """`args`: 8 per message (see `_ACCEPT`); returns per message the first acceptance's id
        of a repeated key (b"" when new)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[list[bytes]] = loop.create_future()
        self._waiting.append((args, answer))
        if len(self._waiting) == 1:
            loop.call_soon(self._send)
        return await answer

    def _send(self) -> None:
        batch, self._waiting = self._waiting, []
        task = asyncio.ensure_future(self._call(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _call(self, batch: list[tuple[list[object], asyncio.Future[list[bytes]]]]) -> None:
        args: list[object] = [settings.HPWSN_DEDUP_WINDOW_S, settings.HPWSN_MESSAGE_RETENTION_S]
        for own, _answer in batch:
            args += own
        try:
            *firsts, scheduled = await self._script(
                keys=[state.INGEST, STATS, state.FANOUT_SCHED], args=args
            )
            if scheduled:
                await sync_to_async(tasks.fanout.delay, thread_sensitive=False)()
        except Exception as exc:
            for _own, answer in batch:
                if not answer.done():
                    answer.set_exception(exc)
            return
        at = 0
        for own, answer in batch:
            n = len(own) // _ACCEPT_ARGS
            if not answer.done():  # a request cancelled meanwhile: its messages are stored
                answer.set_result(firsts[at : at + n])
            at += n


_accept_batchers: dict[int, _AcceptBatcher] = {}


def _accept_batcher(r: Any) -> _AcceptBatcher:
    batcher = _accept_batchers.get(id(r))
    if batcher is None:
        batcher = _accept_batchers[id(r)] = _AcceptBatcher(r)
    return batcher


async def current_message_get(*, topic: wsn.TopicRef, principal: acl.Principal) -> bytes:
    """The last message published on exactly this topic. Reading it is reading the topic: the
    subscribe rule of the topic the expression resolves to applies, however it is spelled."""
    tree = await _tree(force=False)
    n = wsn.NotificationIn(topic=topic, topic_xml=b"", message_xml=b"", content_xml=b"")
    node = _resolve(tree, n) or _resolve(await _tree(force=True), n)
    if node is None:
        raise errors.TopicNotSupported(f"topic '{topic.text}' is not in the topic tree")
    acl.check_subscribe(node.policy, principal, node.path)
    content = await state.get_async_redis().get(state.current_key(node.path))
    if content is None:
        raise errors.NoCurrentMessageOnTopic(f"no message has been published on '{topic.text}'")
    return bytes(content)
