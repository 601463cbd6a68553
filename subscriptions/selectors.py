"""Reads of subscriptions, including the in-memory index the fan-out matches against."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lxml import etree

from hpwsn import topicexpr
from hpwsn_site import state
from subscriptions.models import Subscription
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
    format: str = "wsn"  # push as a wsnt:Notify, or as CloudEvents ("cloudevents")

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
            nsmap = {k: v for k, v in sub.content_nsmap.items() if k}
            content_filter = etree.XPath(sub.content_filter, namespaces=nsmap)
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
    return SubscriptionIndex(entries)


_index = state.VersionedCache(state.VERSION_SUBS, _build)


def subscription_index(*, max_age: float = 0.0) -> SubscriptionIndex:
    """The process's subscription index, rebuilt when the shared version has moved."""
    return _index.get(max_age=max_age)
