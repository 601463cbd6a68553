"""Reads for the console pages: the tree with counts, inherited policy, subscription details."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, Q, QuerySet

from dispatch.models import DeadLetter
from hpwsn_site import state
from monitoring.counters import consumer_label
from monitoring.selectors import counter_windows
from subscriptions.models import PublisherRegistration, PullPoint, Subscription
from subscriptions.selectors import resource_tag
from topics.acl import owner_label
from topics.models import Topic
from topics.selectors import POLICY_FIELDS
from topics.tree import ROOT_POLICY

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- topic tree


@dataclass(slots=True)
class TreeNode:
    id: int
    name: str
    path: str
    depth: int
    subscriptions: int = 0  # concrete subscriptions to this topic or a topic below it
    accepted_minute: int = 0  # notifications accepted on this topic or below, last minute
    children: list[TreeNode] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TreeView:
    roots: list[TreeNode]
    topics: int
    wildcard_subscriptions: int  # Full-dialect expressions: not tied to one node
    traffic_available: bool

    @property
    def flat(self) -> list[tuple[str, TreeNode]]:
        """Depth-first ("branch", node) ... ("end", node) and ("leaf", node) steps.

        One flat loop renders the nested list: a template include per node costs about ten
        times as much, which a tree of thousands of topics would feel.
        """
        out: list[tuple[str, TreeNode]] = []
        stack: list[tuple[TreeNode, bool]] = [(n, False) for n in reversed(self.roots)]
        while stack:
            node, closing = stack.pop()
            if closing:
                out.append(("end", node))
            elif node.children:
                out.append(("branch", node))
                stack.append((node, True))
                stack.extend((c, False) for c in reversed(node.children))
            else:
                out.append(("leaf", node))
        return out


def _accepted_last_minute() -> dict[str, int] | None:
    """Accepted notifications per topic path in the last minute (the monitoring counters)."""
    if not settings.HPWSN_MONITORING:
        return None

    try:
        windows = counter_windows(now=time.time())
    except Exception as exc:  # Redis away: the tree is still worth showing
        log.warning("topic traffic unavailable: %s", exc)
        return None
    return dict(windows.minute.topics.get("accepted", {}))


def _prefixes(path: str) -> Iterable[str]:
    names = path.split(":")
    for k in range(1, len(names) + 1):
        yield ":".join(names[:k])


def topic_tree_view() -> TreeView:
    """The whole tree, nested, each node with its subtree's subscriptions and traffic."""
    rows = list(Topic.objects.order_by("path").values_list("id", "name", "path"))
    nodes = {
        path: TreeNode(id=i, name=name, path=path, depth=path.count(":")) for i, name, path in rows
    }
    roots: list[TreeNode] = []
    for node in nodes.values():
        parent = nodes.get(node.path.rpartition(":")[0]) if ":" in node.path else None
        (parent.children if parent is not None else roots).append(node)
    per_path = (
        Subscription.objects.values("topic_path")
        .annotate(n=Count("id"))
        .values_list("topic_path", "n")
    )
    wildcard = 0
    for path, n in per_path:
        if not path:
            wildcard += n
            continue
        for prefix in _prefixes(path):
            if prefix in nodes:
                nodes[prefix].subscriptions += n
    traffic = _accepted_last_minute()
    for path, n in (traffic or {}).items():
        for prefix in _prefixes(path):
            if prefix in nodes:
                nodes[prefix].accepted_minute += n
    return TreeView(
        roots=roots,
        topics=len(nodes),
        wildcard_subscriptions=wildcard,
        traffic_available=traffic is not None,
    )


def topic_paths(*, exclude_subtree_of: Topic | None = None) -> list[str]:
    """Every topic's path, without a topic's own subtree (where it may not move)."""
    qs = Topic.objects.order_by("path")
    if exclude_subtree_of is not None:
        p = exclude_subtree_of.path
        qs = qs.exclude(Q(path=p) | Q(path__startswith=p + ":"))
    return list(qs.values_list("path", flat=True))


def subtree_subscriptions(*, path: str) -> QuerySet[Subscription]:
    """Subscriptions whose concrete topic is this topic or one below it."""
    return Subscription.objects.filter(Q(topic_path=path) | Q(topic_path__startswith=path + ":"))


def subtree_topic_count(*, path: str) -> int:
    return Topic.objects.filter(Q(path=path) | Q(path__startswith=path + ":")).count()


# ----------------------------------------------------------------------------- policy


def policy_display(field_name: str, value: object) -> str:
    if value is None or value in ("", ()):
        if field_name == "retry_schedule":
            return "broker default: " + ",".join(f"{s:g}" for s in settings.HPWSN_RETRY_SCHEDULE_S)
        if field_name in ("publish_groups", "subscribe_groups"):
            return "none (admins only)"
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (tuple, list)):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    if field_name == "ttl_seconds" and value == 0:
        return "0 (no limit)"
    if field_name == "fragment_size" and value == 0:
        return "0 (never split)"
    return str(value)


def inherited_policy(*, topic: Topic) -> dict[str, str]:
    """What each policy field would be if the topic set nothing itself, for display."""
    ancestors = list(
        Topic.objects.filter(path__in=list(_prefixes(topic.path))[:-1]).order_by("-path")
    )
    ancestors.sort(key=lambda t: -t.path.count(":"))  # nearest first
    out: dict[str, str] = {}
    for name in POLICY_FIELDS:
        value: object = getattr(ROOT_POLICY, name, None)
        source = "default"
        for a in ancestors:
            own = getattr(a, name)
            if own not in (None, ""):
                value, source = own, a.path
                break
        shown = policy_display(name, value)
        out[name] = f"{shown} (from {source})" if shown else f"(from {source})"
    return out


# ----------------------------------------------------------------------------- subscriptions


@dataclass(frozen=True, slots=True)
class SubscriptionRow:
    sub: Subscription
    queued: int
    aside: int  # batches of an unordered subscription waiting aside for their retry
    failures: int  # failed attempts at the batch at the head of the queue
    failing_since: float | None
    next_retry: float | None
    last_failure: dict[str, Any] | None
    dead_letters: int
    # Push: the last answer 2xx from the consumer (kept in Redis); pull: the last GetMessages on
    # its pull point (to the minute).
    last_delivery: datetime | None
    filter_errors: int = 0  # evaluations of its content filter that failed (matched nothing)

    @property
    def owner(self) -> str:
        return owner_label(self.sub.owner)


def consumer_host_contains(value: str) -> Q:
    """The subscriptions whose consumer's host:port contains `value`, never the rest of its
    address: for read-only users, whose counts of substring matches would otherwise spell out
    a pull point's id, or a secret in a webhook's path, one character at a time."""
    if any(c in value for c in "/?#@"):
        return Q(pk__in=[])
    authority = r"^[^:/?#]+://([^/?#]*@)?[^/?#@]*" + re.escape(value) + r"[^/?#@]*([/?#]|$)"
    return Q(consumer_address__iregex=authority)


def subscriptions_filtered(
    *,
    query: str = "",
    state_name: str = "",
    mode: str = "",
    topic: str = "",
    reveal: bool = True,
) -> QuerySet[Subscription]:
    """Subscriptions narrowed by a free text (id, consumer, expression), state, mode, subtree.

    Without `reveal` (read-only users) the text matches a push consumer's host:port only
    (consumer_host_contains), never a pull point's address.
    """
    qs = Subscription.objects.select_related("pull_point").order_by("created_at")
    text = query.strip()
    if text:
        consumer = Q(consumer_address__icontains=text)
        if not reveal:
            consumer = consumer_host_contains(text) & Q(mode=Subscription.Mode.PUSH)
        cond = consumer | Q(topic_expression__icontains=text)
        with contextlib.suppress(ValueError):
            cond |= Q(id=uuid.UUID(text))
        qs = qs.filter(cond)
    if state_name:
        qs = qs.filter(state=state_name)
    if mode:
        qs = qs.filter(mode=mode)
    if topic.strip():
        p = topic.strip()
        qs = qs.filter(Q(topic_path=p) | Q(topic_path__startswith=p + ":"))
    return qs


def _queue_keys(sub: Subscription) -> list[str]:
    if sub.mode == Subscription.Mode.PULL and sub.pull_point_id:
        return [state.pullpoint_key(str(sub.pull_point_id))]
    return state.queue_keys(str(sub.id))


def subscription_rows(*, subs: Iterable[Subscription]) -> list[SubscriptionRow]:
    """Live delivery state of some subscriptions, read from Redis in one pipeline."""
    subs = list(subs)
    if not subs:
        return []
    ids = [str(s.id) for s in subs]
    dead = dict(
        DeadLetter.objects.filter(subscription_id__in=ids, redriven_at__isnull=True)
        .values("subscription_id")
        .annotate(n=Count("id"))
        .values_list("subscription_id", "n")
    )
    pipe = state.get_redis().pipeline(transaction=False)
    shapes = []
    for sub in subs:
        sid = str(sub.id)
        qkeys = _queue_keys(sub)
        shapes.append(len(qkeys))
        for k in qkeys:
            pipe.llen(k)
        pipe.llen(state.attempts_key(sid))
        pipe.lindex(state.attempts_key(sid), -1)
        pipe.get(state.failing_since_key(sid))
        pipe.zscore(state.RETRY, sid)
        pipe.zcard(state.aside_key(sid))
        pipe.hget(state.LAST_DELIVERY, sid)
        pipe.hget(state.FILTER_ERRORS, sid)
    res = pipe.execute()
    rows = []
    i = 0
    for sub, nq in zip(subs, shapes, strict=True):
        queued = sum(int(x) for x in res[i : i + nq])
        attempts, last, since, due, aside, delivered, filter_errors = res[i + nq : i + nq + 7]
        i += nq + 7
        last_delivery = (
            datetime.fromtimestamp(float(delivered), tz=UTC) if delivered is not None else None
        )
        if sub.mode == Subscription.Mode.PULL:
            last_delivery = sub.pull_point.last_used_at if sub.pull_point else None
        last_failure = None
        if last:
            try:
                last_failure = json.loads(last)
            except ValueError:
                last_failure = None
        rows.append(
            SubscriptionRow(
                sub=sub,
                queued=queued,
                aside=int(aside),
                failures=int(attempts),
                failing_since=float(since) if since else None,
                next_retry=float(due) if due is not None else None,
                last_failure=last_failure,
                dead_letters=int(dead.get(str(sub.id), 0)),
                last_delivery=last_delivery,
                filter_errors=int(filter_errors or 0),
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class PullPointRow:
    pull_point: PullPoint
    queued: int
    subscriptions: int

    @property
    def owner(self) -> str:
        return owner_label(self.pull_point.owner)


def pull_point_rows(*, query: str = "", reveal: bool = True) -> list[PullPointRow]:
    """Live pull points with their queued messages and how many subscriptions feed them.

    Without `reveal` (read-only users) the text matches whole ids only (see
    subscriptions_filtered), and tags.
    """
    qs = (
        PullPoint.objects.filter(destroyed_at__isnull=True)
        .annotate(n=Count("subscriptions"))
        .order_by("created_at")
    )
    text = query.strip().lstrip("#")
    tagged = None
    if text:
        cond = Q(address__icontains=text) if reveal else Q(pk__in=[])
        with contextlib.suppress(ValueError):
            cond |= Q(id=uuid.UUID(text))
        if len(text) == 12 and not reveal:
            tagged = text.lower()
        else:
            qs = qs.filter(cond)
    pps = list(qs[:500])
    if tagged is not None:
        pps = [pp for pp in pps if resource_tag(str(pp.id)) == tagged]
    pipe = state.get_redis().pipeline(transaction=False)
    for pp in pps:
        pipe.llen(state.pullpoint_key(str(pp.id)))
    depths = pipe.execute() if pps else []
    return [
        PullPointRow(pull_point=pp, queued=int(d), subscriptions=pp.n)
        for pp, d in zip(pps, depths, strict=True)
    ]


# ----------------------------------------------------------------------------- audit


@dataclass(frozen=True, slots=True)
class AuditRow:
    """An audit entry as a read-only user sees it: subscriptions and pull points by tag."""

    at: datetime
    actor: str
    action: str
    object_id: str
    before: Any
    after: Any
    id: int = 0
    object_type: str = ""

    @property
    def changes(self) -> list[tuple[str, object, object]]:
        before = self.before if isinstance(self.before, dict) else {}
        after = self.after if isinstance(self.after, dict) else {}
        keys = list(dict.fromkeys([*before, *after]))
        return [(k, before.get(k), after.get(k)) for k in keys if before.get(k) != after.get(k)]


_ID_FIELDS = ("id", "subscription", "subscription_id")
_ADDRESS_FIELDS = ("consumer", "consumer_address", "address", "reference_address")


def _id_lists_masked(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The lists of subscription ids of a record (a topic's entry names those below it) as tags."""
    return {
        key: ["#" + resource_tag(str(i)) for i in snapshot[key]]
        for key in ("subscriptions", "subscription_ids")
        if isinstance(snapshot.get(key), list)
    }


def snapshot_masked(snapshot: Any) -> Any:
    """A record of a subscription, pull point or dead letter as a read-only user sees it: ids
    of subscriptions and pull points as tags, addresses as consumer hosts."""
    if not isinstance(snapshot, dict):
        return snapshot
    out = dict(snapshot)
    for key in _ID_FIELDS:
        if isinstance(out.get(key), str) and out[key]:
            out[key] = "#" + resource_tag(out[key])
    for key in _ADDRESS_FIELDS:
        if isinstance(out.get(key), str) and out[key]:
            out[key] = consumer_label(out[key])
    out.update(_id_lists_masked(out))
    if isinstance(out.get("letters"), list):  # a deletion of dead letters names their subscriptions
        out["letters"] = [snapshot_masked(letter) for letter in out["letters"]]
    return out


def audit_rows_masked(*, entries: Iterable[Any]) -> list[Any]:
    """Audit entries for read-only users: ids of subscriptions, pull points and dead-letter
    subscriptions as tags, addresses as consumer hosts; other entries as they are, but for the
    subscriptions a topic's deletion names (kept live, their ids act on them)."""
    rows: list[Any] = []
    for e in entries:
        if e.object_type not in ("subscription", "pullpoint", "deadletter"):
            masked = [
                {**s, **_id_lists_masked(s)} if isinstance(s, dict) else s
                for s in (e.before, e.after)
            ]
            rows.append(e if masked == [e.before, e.after] else _row(e, e.object_id, *masked))
            continue
        object_id = e.object_id
        if e.object_type != "deadletter" or not object_id.replace(",", "").isdigit():
            object_id = "#" + resource_tag(object_id)
        rows.append(_row(e, object_id, snapshot_masked(e.before), snapshot_masked(e.after)))
    return rows


def _row(e: Any, object_id: str, before: Any, after: Any) -> AuditRow:
    return AuditRow(
        at=e.at,
        actor=e.actor,
        action=e.action,
        object_id=object_id,
        before=before,
        after=after,
        id=e.id,
        object_type=e.object_type,
    )


@dataclass(frozen=True, slots=True)
class RegistrationRow:
    reg: PublisherRegistration

    @property
    def owner(self) -> str:
        return owner_label(self.reg.owner)


def registration_rows(*, query: str = "") -> list[RegistrationRow]:
    """Publisher registrations (RegisterPublisher), oldest first; by publisher, topic, owner or
    id."""
    qs = PublisherRegistration.objects.order_by("created_at")
    if query.strip():
        text = query.strip()
        cond = (
            Q(publisher_address__icontains=text)
            | Q(topic_paths__icontains=text)
            | Q(owner__icontains=text)
        )
        with contextlib.suppress(ValueError):
            cond |= Q(id=uuid.UUID(text))
        qs = qs.filter(cond)
    return [RegistrationRow(reg=reg) for reg in qs[:500]]
