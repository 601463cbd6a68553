"""Reads of subscriptions, including the in-memory index the fan-out matches against."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from lxml import etree

from hpwsn import topicexpr, xpathfilter
from hpwsn.errors import WsnError
from hpwsn.sqlfilter import CompiledFilter, compile_filter
from hpwsn_site import state
from subscriptions.filterindex import FilterIndex
from subscriptions.filters import SQL, subscription_filter_compile
from subscriptions.models import PublisherRegistration, PullPoint, Subscription
from topics.tree import Matcher


def resource_tag(resource_id: str) -> str:
    """A short, stable name of a subscription or pull point that grants nothing.

    Its id is in its address and works with it, so /metrics, the dashboard and read-only
    console users see this instead: the first 12 hex digits of an HMAC of the id with the secret
    key (not reversible, not guessable without the key; the same in every process).
    """
    key = settings.SECRET_KEY.encode()
    return hmac.new(key, f"hpwsn-resource\0{resource_id}".encode(), hashlib.sha256).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class SubEntry:
    id: str
    mode: str
    consumer_address: str
    reference_address: str
    pull_point_id: str | None
    soap_version: str
    use_raw: bool
    signing_secret: str
    paused: bool  # paused or suspended: messages are queued, nothing is pushed
    termination_ts: float | None  # epoch seconds
    content_filter: Callable[[etree._Element], object] | None
    topic_path: str = ""  # the concrete topic subscribed to; empty for wildcard expressions
    created_ts: float = 0.0  # epoch seconds: reliable messages accepted before it are not its
    format: str = "wsn"  # push as a wsnt:Notify, or as CloudEvents ("cloudevents")

    def expired(self, now: float) -> bool:
        return self.termination_ts is not None and self.termination_ts <= now


class SubscriptionIndex:
    def __init__(
        self,
        entries: list[tuple[SubEntry, topicexpr.TopicExpression | None, str]],
        sql_filters: dict[str, CompiledFilter] | None = None,
    ) -> None:
        from dispatch.flow import consumer_of

        self.by_id: dict[str, SubEntry] = {}
        self._all: list[str] = []  # subscriptions without a topic filter: every topic
        self._matcher = Matcher()
        # Subscriptions with an SQL-like filter are not matched one by one: those with the same
        # topic expression share a FilterIndex (subscriptions/filterindex.py), which the topic
        # matcher finds as a whole; only the filters a message may satisfy are evaluated.
        self._groups = Matcher()
        self._all_groups: list[FilterIndex[SubEntry]] = []
        grouped: dict[str, tuple[topicexpr.TopicExpression | None, str, list[SubEntry]]] = {}
        sql_filters = sql_filters or {}
        # Push subscriptions per consumer origin: flow control skips its shared window when one
        # consumer's pumps together could never fill it.
        self.per_consumer: dict[str, int] = {}
        for entry, expr, topic_path in entries:
            self.by_id[entry.id] = entry
            if entry.mode == "push":
                origin = consumer_of(entry.consumer_address)
                self.per_consumer[origin] = self.per_consumer.get(origin, 0) + 1
            if entry.id in sql_filters:
                key = f"{expr.dialect}|{expr.canonical()}" if expr else "*"
                grouped.setdefault(key, (expr, topic_path, []))[2].append(entry)
            elif expr is None:
                self._all.append(entry.id)
            else:
                exact = tuple(topic_path.split(":")) if topic_path else None
                self._matcher.add(entry.id, expr, exact)
        self.groups: list[FilterIndex[SubEntry]] = []
        for g_expr, g_path, members in grouped.values():
            group = FilterIndex((e, sql_filters[e.id]) for e in members)
            self.groups.append(group)
            if g_expr is None:
                self._all_groups.append(group)
            else:
                exact = tuple(g_path.split(":")) if g_path else None
                self._groups.add(len(self.groups) - 1, g_expr, exact)

    def filter_groups(
        self, root_ns: str | None, names: tuple[str, ...]
    ) -> list[FilterIndex[SubEntry]]:
        """The SQL-like filter indexes of the subscriptions whose topic expressions cover this."""
        found = self._groups.match(root_ns, names)
        return [*self._all_groups, *(self.groups[i] for i in found if isinstance(i, int))]

    def matching(self, root_ns: str | None, names: tuple[str, ...]) -> list[SubEntry]:
        ids = [*self._all, *self._matcher.match(root_ns, names)]
        return [self.by_id[i] for i in ids]  # type: ignore[index]


def _refused(reason: str) -> xpathfilter.Filter:
    def evaluate(_message: etree._Element) -> object:
        raise xpathfilter.FilterRejected(reason)

    return evaluate


def _content_filter(text: str, nsmap: dict[str, str]) -> xpathfilter.Filter:
    """The compiled filter; one refused today (stored before the checks) fails every evaluation,
    which counts against its subscription and matches nothing."""
    try:
        return xpathfilter.compile_filter(text, nsmap, max_chars=settings.HPWSN_FILTER_MAX_CHARS)
    except xpathfilter.FilterRejected as exc:
        return _refused(str(exc))


def _build() -> SubscriptionIndex:
    global _compiled
    entries = []
    sql_filters: dict[str, CompiledFilter] = {}
    compiled: dict[str, CompiledFilter] = {}
    for sub in Subscription.objects.all().iterator():
        expr = None
        if sub.topic_expression:
            try:
                expr = topicexpr.parse(sub.topic_expression, sub.topic_dialect, sub.topic_nsmap)
            except (topicexpr.TopicExpressionError, topicexpr.UnknownDialectError):
                continue  # validated at subscribe time; unreachable unless the row was edited
        content_filter = None
        sql_filter = _sql_filter(sub, compiled)
        if sql_filter is not None:
            sql_filters[str(sub.id)] = sql_filter
        if sub.content_filter and sub.content_dialect != SQL:
            content_filter = _content_filter(sub.content_filter, sub.content_nsmap)
        entry = SubEntry(
            id=str(sub.id),
            mode=sub.mode,
            consumer_address=sub.consumer_address,
            reference_address=sub.reference_address,
            pull_point_id=str(sub.pull_point_id) if sub.pull_point_id else None,
            soap_version=sub.soap_version,
            use_raw=sub.use_raw,
            signing_secret=sub.signing_secret,
            paused=sub.state != Subscription.State.ACTIVE,
            termination_ts=sub.termination_time.timestamp() if sub.termination_time else None,
            content_filter=content_filter,
            topic_path=sub.topic_path,
            created_ts=sub.created_at.timestamp(),
            format=sub.format,
        )
        entries.append((entry, expr, sub.topic_path))
    _compiled = compiled  # what no subscription uses any more is dropped
    return SubscriptionIndex(entries, sql_filters)


# Compiled filters by their text and parameters, kept from one index build to the next: every
# subscription change rebuilds the index, and 100,000 filters take seconds to compile again.
_compiled: dict[str, CompiledFilter] = {}


def _sql_filter(sub: Subscription, compiled: dict[str, CompiledFilter]) -> CompiledFilter | None:
    if sub.content_dialect != SQL and not sub.producer_filter:
        return None
    key = json.dumps(
        [
            sub.content_dialect,
            sub.content_filter,
            sub.producer_dialect,
            sub.producer_filter,
            sub.filter_parameters,
        ]
    )
    found = compiled.get(key) or _compiled.get(key)
    if found is None:
        found = _compile(sub)
    compiled[key] = found
    return found


def _compile(sub: Subscription) -> CompiledFilter:
    try:
        found = subscription_filter_compile(
            content_text=sub.content_filter,
            content_dialect=sub.content_dialect,
            producer_text=sub.producer_filter,
            producer_dialect=sub.producer_dialect,
            parameters=sub.filter_parameters,
        )
        return found or _NOTHING
    except WsnError:
        # Checked at Subscribe; a row edited since then matches nothing rather than everything.
        return _NOTHING


_NOTHING = compile_filter("FALSE")

_index = state.VersionedCache(state.VERSION_SUBS, _build)


def subscription_index(*, max_age: float = 0.0) -> SubscriptionIndex:
    """The process's subscription index, rebuilt when the shared version has moved."""
    return _index.get(max_age=max_age)


def resource_exists(*, kind: str, resource_id: str) -> bool:
    """Whether a live subscription ("subscriptions"), pull point ("pullpoints") or publisher
    registration ("registrations") has this id."""
    try:
        if kind == "subscriptions":
            return Subscription.objects.filter(pk=resource_id).exists()
        if kind == "registrations":
            return PublisherRegistration.objects.filter(pk=resource_id).exists()
        return PullPoint.objects.filter(pk=resource_id, destroyed_at__isnull=True).exists()
    except (ValueError, ValidationError):  # not even the shape of an id
        return False
