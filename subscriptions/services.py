"""Subscribe, renew, pause, resume, unsubscribe, expire; pull points (for SOAP and REST)."""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from lxml import etree

from directory.services import subscription_directory_write
from dispatch.push import check_target
from hpwsn import errors, ns, topicexpr
from hpwsn.targets import TargetRefused
from hpwsn.wsn import TopicRef
from hpwsn.xsdtime import TimeValueError, format_datetime, parse_termination
from hpwsn_site import state
from monitoring import events
from subscriptions.models import PullPoint, Subscription
from topics import acl
from topics.selectors import topic_tree

_PULLPOINT_PATH = re.compile(r"/wsn/pullpoints/([0-9a-fA-F-]{32,36})/?$")


def _parse_expression(topic: TopicRef | None) -> tuple[topicexpr.TopicExpression | None, str]:
    """The parsed expression and the colon path of the topic it names when concrete."""
    if topic is None:
        return None, ""
    try:
        expr = topicexpr.parse(topic.text, topic.dialect, topic.nsmap)
    except topicexpr.UnknownDialectError as exc:
        raise errors.TopicExpressionDialectUnknown(str(exc)) from None
    except topicexpr.TopicExpressionError as exc:
        raise errors.InvalidTopicExpression(str(exc)) from None
    if not expr.is_concrete:
        return expr, ""
    root_ns, names, any_ns = expr.concrete()
    node = topic_tree(max_age=0).resolve(root_ns, names, any_ns)
    if node is None:
        raise errors.TopicNotSupported(f"topic '{topic.text}' is not in the topic tree")
    return expr, node.path


def _compile_content_filter(content: TopicRef | None) -> None:
    if content is None:
        return
    if content.dialect not in (None, "", ns.FILTER_XPATH):
        raise errors.InvalidFilter(
            f"MessageContent dialect '{content.dialect}' is not supported",
            detail_xml=errors.unknown_filter_xml(ns.WSNT, "MessageContent"),
        )
    try:
        etree.XPath(content.text, namespaces={k: v for k, v in content.nsmap.items() if k})
    except etree.XPathSyntaxError as exc:
        raise errors.InvalidMessageContentExpression(
            f"MessageContent '{content.text}' is not a valid XPath 1.0 expression: {exc}"
        ) from None


def _termination(text: str | None, *, now: datetime, initial: bool) -> datetime | None:
    error = (
        errors.UnacceptableInitialTerminationTime if initial else errors.UnacceptableTerminationTime
    )
    minimum = errors.minimum_time_xml(format_datetime(now))
    if text is None or text == "":
        if initial:
            return None
        raise error("Renew needs a TerminationTime", detail_xml=minimum)
    try:
        when = parse_termination(text, now=now)
    except TimeValueError as exc:
        raise error(str(exc), detail_xml=minimum) from None
    if when <= now:
        raise error(f"termination time '{text}' is not in the future", detail_xml=minimum)
    return when


def _check_push_address(address: str) -> None:
    parts = urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise errors.InvalidConsumerReference(
            f"consumer address '{address}' is not an absolute http(s) URL"
        )
    try:
        check_target(address)
    except TargetRefused as exc:
        raise errors.SubscribeCreationFailed(f"consumer address refused: {exc}") from None


def _pull_point_of(address: str) -> PullPoint | None:
    m = _PULLPOINT_PATH.search(urlsplit(address).path)
    if not m:
        return None
    try:
        pp_id = uuid.UUID(m.group(1))
    except ValueError:
        return None
    pp = PullPoint.objects.filter(id=pp_id).first()
    if pp is None or pp.destroyed_at is not None:
        raise errors.ResourceUnknown(f"pull point {pp_id} does not exist")
    return pp


def subscription_dedup_key(
    *, mode: str, target: str, canonical: str, content_dialect: str, content_filter: str
) -> str:
    """Same consumer + same expression + same filter = the same subscription (thesis 5.3.1).

    A filter without a dialect is XPath 1.0, as it is stored: both spellings are one filter.
    """
    dialect = content_dialect or ns.FILTER_XPATH
    filter_text = f"{dialect}|{content_filter}" if content_filter else ""
    return hashlib.sha256(f"{mode}\n{target}\n{canonical}\n{filter_text}".encode()).hexdigest()


def subscription_create(
    *,
    consumer_address: str,
    topic: TopicRef | None,
    content: TopicRef | None,
    initial_termination_time: str | None,
    soap_version: str,
    use_raw: bool,
    base_url: str,
    subscriber_address: str | None = None,
    signing_secret: str = "",
    principal: acl.Principal = acl.ANONYMOUS,
) -> tuple[Subscription, bool]:
    """Create a subscription or return the identical one (thesis 5.3.1): (sub, created)."""
    now = timezone.now()
    termination = _termination(initial_termination_time, now=now, initial=True)
    expr, topic_path = _parse_expression(topic)
    acl.check_subscribe_expression(topic_tree(), expr, principal)
    _compile_content_filter(content)
    pull_point = _pull_point_of(consumer_address)
    if subscriber_address:  # legacy HPwsn: push to SubscriberAddress through a bound push endpoint
        _check_push_address(subscriber_address)
        mode, target = Subscription.Mode.PUSH, subscriber_address
    elif pull_point is not None:
        mode, target = Subscription.Mode.PULL, consumer_address
    else:
        _check_push_address(consumer_address)
        mode, target = Subscription.Mode.PUSH, consumer_address
    canonical = expr.canonical() if expr else "*"
    dedup_key = subscription_dedup_key(
        mode=mode,
        target=target,
        canonical=canonical,
        content_dialect=content.dialect or "" if content else "",
        content_filter=content.text if content else "",
    )

    existing = _existing(dedup_key, now=now, termination=termination)
    if existing is not None:
        if (
            pull_point is not None
            and subscriber_address
            and pull_point.id != existing.pull_point_id
        ):
            # The push endpoint created for this duplicate is released (thesis figure 5-9).
            pull_point_destroy(pull_point_id=str(pull_point.id))
        subscription_directory_write(subscription_ids=[existing.id])
        return existing, False
    sub_id = uuid.uuid4()
    sub = Subscription(
        id=sub_id,
        consumer_address=target,
        reference_address=f"{base_url}/wsn/subscriptions/{sub_id}",
        mode=mode,
        pull_point=pull_point,
        topic_expression=topic.text if topic else "",
        topic_dialect=(expr.dialect if expr else ""),
        topic_nsmap=topic.nsmap if topic else {},
        topic_path=topic_path,
        content_filter=content.text if content else "",
        content_dialect=(content.dialect or ns.FILTER_XPATH) if content else "",
        content_nsmap=content.nsmap if content else {},
        dedup_key=dedup_key,
        soap_version=soap_version,
        use_raw=use_raw,
        signing_secret=signing_secret,
        termination_time=termination,
    )
    try:
        with transaction.atomic():
            sub.save(force_insert=True)
            transaction.on_commit(lambda: state.bump(state.VERSION_SUBS))
    except IntegrityError:
        # A concurrent identical Subscribe won the race: answer with its subscription.
        existing = _existing(dedup_key, now=now, termination=termination)
        if existing is None:
            raise
        return existing, False
    subscription_directory_write(subscription_ids=[sub.id])
    events.subscription(sub=str(sub.id), action="created", consumer=target, topic=topic_path)
    return sub, True


def _existing(
    dedup_key: str, *, now: datetime, termination: datetime | None
) -> Subscription | None:
    sub = Subscription.objects.filter(dedup_key=dedup_key).first()
    if sub is None:
        return None
    if sub.termination_time is not None and sub.termination_time <= now:
        subscription_delete(subscription_id=str(sub.id))
        return None
    # A duplicate may extend the lifetime it asks for, never shorten it.
    if sub.termination_time is not None and (
        termination is None or termination > sub.termination_time
    ):
        sub.termination_time = termination
        sub.save(update_fields=["termination_time", "updated_at"])
        state.bump(state.VERSION_SUBS)
    return sub


def _get(subscription_id: str) -> Subscription:
    try:
        sub = Subscription.objects.filter(id=uuid.UUID(subscription_id)).first()
    except (ValueError, TypeError):
        sub = None
    if sub is None or (sub.termination_time is not None and sub.termination_time <= timezone.now()):
        raise errors.ResourceUnknown(f"subscription {subscription_id} does not exist")
    return sub


def subscription_renew(*, subscription_id: str, termination_time: str | None) -> Subscription:
    """Set a new termination time; a suspended subscription is resumed, a paused one stays."""
    sub = _get(subscription_id)
    sub.termination_time = _termination(termination_time, now=timezone.now(), initial=False)
    resume = sub.state == Subscription.State.SUSPENDED
    if resume:
        sub.state = Subscription.State.ACTIVE
    sub.save(update_fields=["termination_time", "state", "updated_at"])
    state.bump(state.VERSION_SUBS)
    if resume:
        _resume(str(sub.id))
    subscription_directory_write(subscription_ids=[sub.id])
    events.subscription(sub=str(sub.id), action="renewed", consumer=sub.consumer_address)
    return sub


def subscription_set_state(*, subscription_id: str, paused: bool) -> Subscription:
    """Pause or resume (also a suspended subscription); messages matched meanwhile wait queued."""
    sub = _get(subscription_id)
    sub.state = Subscription.State.PAUSED if paused else Subscription.State.ACTIVE
    sub.save(update_fields=["state", "updated_at"])
    state.bump(state.VERSION_SUBS)
    if not paused:
        _resume(str(sub.id))
    subscription_directory_write(subscription_ids=[sub.id])
    events.subscription(sub=str(sub.id), action="paused" if paused else "resumed")
    return sub


def subscription_suspend(*, subscription_id: str) -> bool:
    """Stop pushing to a consumer that keeps failing; False when it was no longer active."""
    try:
        key = uuid.UUID(subscription_id)
    except ValueError:
        return False
    # Conditional: a Pause or Unsubscribe that came first is not overwritten.
    changed = Subscription.objects.filter(id=key, state=Subscription.State.ACTIVE).update(
        state=Subscription.State.SUSPENDED, updated_at=timezone.now()
    )
    r = state.get_redis()
    pipe = r.pipeline(transaction=False)
    pipe.zrem(state.RETRY, subscription_id)  # no retries while suspended
    pipe.incr(state.VERSION_SUBS)
    pipe.execute()
    subscription_directory_write(subscription_ids=[key])
    if changed:
        events.subscription(sub=subscription_id, action="suspended")
    return bool(changed)


def _resume(sub_id: str) -> None:
    # A fresh start: the head batch gets a full schedule, and the time to suspension runs again
    # from the next failure.
    from dispatch.services import pump_kick

    r = state.get_redis()
    pipe = r.pipeline(transaction=False)
    pipe.delete(state.attempts_key(sub_id), state.failing_since_key(sub_id))
    pipe.zrem(state.RETRY, sub_id)
    pipe.execute()
    pump_kick(subscription_id=sub_id)


def subscription_delete(*, subscription_id: str) -> None:
    """Unsubscribe: remove the row, its queue and every Redis key it held, and its push endpoint."""
    sub = _get_any(subscription_id)
    if sub is None:
        raise errors.ResourceUnknown(f"subscription {subscription_id} does not exist")
    _free(sub)


def _get_any(subscription_id: str) -> Subscription | None:
    try:
        return Subscription.objects.filter(id=uuid.UUID(subscription_id)).first()
    except (ValueError, TypeError):
        return None


def _free(sub: Subscription) -> None:
    sub_id = str(sub.id)
    bound_push_endpoint = sub.pull_point_id if sub.mode == Subscription.Mode.PUSH else None
    sub.delete()
    if bound_push_endpoint:
        PullPoint.objects.filter(id=bound_push_endpoint).update(destroyed_at=timezone.now())
    r = state.get_redis()
    pipe = r.pipeline(transaction=False)
    state.subscription_forget(pipe, sub_id)
    pipe.incr(state.VERSION_SUBS)
    pipe.execute()
    subscription_directory_write(subscription_ids=[sub_id])  # on unsubscribe and expiry
    events.subscription(sub=sub_id, action="removed", consumer=sub.consumer_address)


def subscriptions_expire() -> int:
    """Free every subscription whose termination time has passed; returns how many."""
    expired = list(Subscription.objects.filter(termination_time__lte=timezone.now()))
    for sub in expired:
        _free(sub)
    return len(expired)


def pull_point_create(*, base_url: str) -> PullPoint:
    """A new, empty pull point."""
    pp_id = uuid.uuid4()
    return PullPoint.objects.create(id=pp_id, address=f"{base_url}/wsn/pullpoints/{pp_id}")


def _get_pull_point(pull_point_id: str) -> PullPoint:
    try:
        pp = PullPoint.objects.filter(id=uuid.UUID(pull_point_id)).first()
    except (ValueError, TypeError):
        pp = None
    if pp is None:
        raise errors.ResourceUnknown(f"pull point {pull_point_id} does not exist")
    return pp


def pull_point_destroy(*, pull_point_id: str) -> None:
    """Destroy a pull point, its queue and the subscriptions that deliver into it."""
    pp = _get_pull_point(pull_point_id)
    if pp.destroyed_at is not None:
        raise errors.UnableToDestroyPullPoint(f"pull point {pull_point_id} was already destroyed")
    pp.destroyed_at = timezone.now()
    pp.save(update_fields=["destroyed_at"])
    for sub in Subscription.objects.filter(pull_point=pp, mode=Subscription.Mode.PULL):
        _free(sub)
    state.get_redis().delete(state.pullpoint_key(str(pp.id)))


def pull_point_get_messages(*, pull_point_id: str, maximum: int | None) -> list[tuple[str, bytes]]:
    """Take up to `maximum` messages, oldest first: (subscription address, stored fragment)."""
    pp = _get_pull_point(pull_point_id)
    if pp.destroyed_at is not None:
        raise errors.ResourceUnknown(f"pull point {pull_point_id} was destroyed")
    now = timezone.now()
    if pp.last_used_at is None or now - pp.last_used_at > timedelta(minutes=1):
        PullPoint.objects.filter(id=pp.id).update(last_used_at=now)
    count = 1000 if not maximum else min(maximum, 10_000)
    r = state.get_redis()
    entries = r.lpop(state.pullpoint_key(str(pp.id)), count) or []
    if not entries:
        return []
    # b"<notification id>|<subscription id>|<mark>" (dispatch/reliable.py)
    ids = [e.split(b"|")[:2] for e in entries]
    payloads = r.mget([state.payload_key(nid.decode()) for nid, _sub in ids])
    refs = dict(Subscription.objects.filter(pull_point=pp).values_list("id", "reference_address"))
    out = []
    for (_nid, sub_id), payload in zip(ids, payloads, strict=True):
        if payload is not None:  # None: the message outlived its retention
            out.append((refs.get(uuid.UUID(sub_id.decode()), ""), payload))
    events.pull(pullpoint=pull_point_id, messages=len(out))
    return out


def pull_points_expire() -> int:
    """Destroy pull points nobody has read for HPWSN_PULLPOINT_IDLE_S; returns how many."""
    idle = settings.HPWSN_PULLPOINT_IDLE_S
    if idle <= 0:
        return 0
    cutoff = timezone.now() - timedelta(seconds=idle)
    unused = PullPoint.objects.filter(destroyed_at__isnull=True).filter(
        Q(last_used_at__lt=cutoff) | Q(last_used_at__isnull=True, created_at__lt=cutoff)
    )
    ids = [str(i) for i in unused.values_list("id", flat=True)]
    for pp_id in ids:
        pull_point_destroy(pull_point_id=pp_id)
    return len(ids)
