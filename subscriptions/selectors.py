"""Reads of subscriptions, including the in-memory index the fan-out matches against."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from lxml import etree

from hpwsn import topicexpr, xpathfilter
from hpwsn_site import state
from subscriptions.models import PullPoint, Subscription
from topics.tree import Matcher


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

    def expired(self, now: float) -> bool:
        return self.termination_ts is not None and self.termination_ts <= now


class SubscriptionIndex:
    def __init__(
        self, entries: list[tuple[SubEntry, topicexpr.TopicExpression | None, str]]
    ) -> None:
        from dispatch.flow import consumer_of

        self.by_id: dict[str, SubEntry] = {}
        self._all: list[str] = []  # subscriptions without a topic filter: every topic
        self._matcher = Matcher()
        # Push subscriptions per consumer origin: flow control skips its shared window when one
        # consumer's pumps together could never fill it.
        self.per_consumer: dict[str, int] = {}
        for entry, expr, topic_path in entries:
            self.by_id[entry.id] = entry
            if entry.mode == "push":
                origin = consumer_of(entry.consumer_address)
                self.per_consumer[origin] = self.per_consumer.get(origin, 0) + 1
            if expr is None:
                self._all.append(entry.id)
            else:
                exact = tuple(topic_path.split(":")) if topic_path else None
                self._matcher.add(entry.id, expr, exact)

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
    entries = []
    for sub in Subscription.objects.all().iterator():
        expr = None
        if sub.topic_expression:
            try:
                expr = topicexpr.parse(sub.topic_expression, sub.topic_dialect, sub.topic_nsmap)
            except (topicexpr.TopicExpressionError, topicexpr.UnknownDialectError):
                continue  # validated at subscribe time; unreachable unless the row was edited
        content_filter = None
        if sub.content_filter:
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
        )
        entries.append((entry, expr, sub.topic_path))
    return SubscriptionIndex(entries)


_index = state.VersionedCache(state.VERSION_SUBS, _build)


def subscription_index(*, max_age: float = 0.0) -> SubscriptionIndex:
    """The process's subscription index, rebuilt when the shared version has moved."""
    return _index.get(max_age=max_age)


def resource_exists(*, kind: str, resource_id: str) -> bool:
    """Whether a live subscription ("subscriptions") or pull point ("pullpoints") has this id."""
    try:
        if kind == "subscriptions":
            return Subscription.objects.filter(pk=resource_id).exists()
        return PullPoint.objects.filter(pk=resource_id, destroyed_at__isnull=True).exists()
    except (ValueError, ValidationError):  # not even the shape of an id
        return False
