"""Publisher registrations (WS-BrokeredNotification RegisterPublisher / DestroyRegistration).

A registration names a publisher (its PublisherReference address) and the topics it publishes
on. On a topic whose policy sets `require_registration`, a Notify is accepted only when its
ProducerReference names a publisher registered for that topic or an ancestor of it.
Demand-based publishing (Demand=true) is refused: the broker does not subscribe to publishers.
"""

from __future__ import annotations

import uuid

from django.db.models import Q
from django.utils import timezone

from hpwsn import errors, topicexpr
from hpwsn.wsn import TopicRef
from hpwsn.xsdtime import TimeValueError, format_datetime, parse_termination
from subscriptions.models import PublisherRegistration
from topics import acl
from topics.selectors import topic_tree
from topics.tree import ROOT_POLICY


def _topic_path(topic: TopicRef) -> str:
    try:
        expr = topicexpr.parse(topic.text, topic.dialect, topic.nsmap)
    except topicexpr.UnknownDialectError as exc:
        raise errors.TopicExpressionDialectUnknown(str(exc)) from None
    except topicexpr.TopicExpressionError as exc:
        raise errors.InvalidTopicExpression(str(exc)) from None
    if not expr.is_concrete:
        raise errors.InvalidTopicExpression(
            f"a publisher registers for concrete topics, not '{topic.text}'"
        )
    root_ns, names, any_ns = expr.concrete()
    node = topic_tree(max_age=0).resolve(root_ns, names, any_ns)
    if node is None:
        raise errors.TopicNotSupported(f"topic '{topic.text}' is not in the topic tree")
    return node.path


def registration_create(
    *,
    publisher_address: str | None,
    topics: list[TopicRef],
    demand: bool,
    initial_termination_time: str | None,
    base_url: str,
    principal: acl.Principal = acl.ANONYMOUS,
) -> PublisherRegistration:
    """Register a publisher for topics; the caller must be allowed to publish on each of them."""
    if demand:
        raise errors.PublisherRegistrationRejected(
            "demand-based publishing (Demand=true) is not supported by this broker"
        )
    if not publisher_address:
        # Without it a Notify could never be recognised as this publisher's.
        raise errors.PublisherRegistrationRejected("RegisterPublisher needs a PublisherReference")
    now = timezone.now()
    termination = None
    if initial_termination_time:
        minimum = errors.minimum_time_xml(format_datetime(now))
        try:
            termination = parse_termination(initial_termination_time, now=now)
        except TimeValueError as exc:
            raise errors.UnacceptableInitialTerminationTime(str(exc), detail_xml=minimum) from None
        if termination <= now:
            raise errors.UnacceptableInitialTerminationTime(
                f"termination time '{initial_termination_time}' is not in the future",
                detail_xml=minimum,
            )
    paths = list(dict.fromkeys(_topic_path(t) for t in topics))
    tree = topic_tree()
    for path in paths or [""]:
        # No topic means every topic: judged at the top of the tree, like a Subscribe without one.
        node = tree.get(path) if path else None
        acl.check_publish(node.policy if node is not None else ROOT_POLICY, principal, path or "*")
    reg_id = uuid.uuid4()
    return PublisherRegistration.objects.create(
        id=reg_id,
        reference_address=f"{base_url}/wsn/registrations/{reg_id}",
        publisher_address=publisher_address,
        topic_paths=paths,
        termination_time=termination,
    )


def registration_destroy(*, registration_id: str) -> None:
    """DestroyRegistration: the publisher is no longer registered."""
    try:
        key = uuid.UUID(registration_id)
    except (ValueError, TypeError):
        raise errors.ResourceUnknown(f"registration {registration_id} does not exist") from None
    if not PublisherRegistration.objects.filter(id=key).delete()[0]:
        raise errors.ResourceUnknown(f"registration {registration_id} does not exist")


def publisher_is_registered(*, publisher_address: str | None, topic_path: str) -> bool:
    """Whether a live registration of this publisher covers the topic (or every topic)."""
    if not publisher_address:
        return False
    names = topic_path.split(":")
    ancestors = {":".join(names[:k]) for k in range(1, len(names) + 1)}
    live = PublisherRegistration.objects.filter(publisher_address=publisher_address).filter(
        Q(termination_time__isnull=True) | Q(termination_time__gt=timezone.now())
    )
    return any(
        not paths or ancestors.intersection(paths)
        for paths in live.values_list("topic_paths", flat=True)
    )


def registration_check(*, publisher_address: str | None, topic_path: str) -> None:
    """Refuse a Notify on a `require_registration` topic from a publisher not registered for it."""
    if publisher_is_registered(publisher_address=publisher_address, topic_path=topic_path):
        return
    who = (
        f"publisher '{publisher_address}' is"
        if publisher_address
        else "a Notify without a ProducerReference is"
    )
    raise errors.PublisherRegistrationRejected(
        f"topic '{topic_path}' accepts only registered publishers (RegisterPublisher);"
        f" {who} not registered for it"
    )
