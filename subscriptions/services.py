"""Subscribe, renew, pause, resume, unsubscribe, expire; pull points (for SOAP and REST)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from directory.outbox import subscription_directory_write
from dispatch.items import pull_item_ids
from dispatch.push import check_target, own_endpoints, signing_key
from dispatch.wake import pump_kick, subscription_wake
from federation.peers import interest_path_check, site_peers_check
from hpwsn import errors, ns, topicexpr, xpathfilter
from hpwsn.sqlfilter import Value
from hpwsn.targets import TargetRefused, same_endpoint, validate_url
from hpwsn.wsn import TopicRef
from hpwsn.xsdtime import TimeValueError, format_datetime, parse_termination
from hpwsn_site import state
from monitoring import events
from subscriptions import allowance, registrations
from subscriptions.filters import SQL, subscription_filter_compile
from subscriptions.models import PullPoint, Subscription
from subscriptions.selectors import pull_point_read, subscription_carried, subscription_row
from topics import acl
from topics.changes import SUBSCRIPTION, change_batch, change_record
from topics.selectors import topic_tree

T = TypeVar("T")

_PULLPOINT_PATH = re.compile(r"/wsn/pullpoints/([0-9a-fA-F-]{32,36})/?$")


def _parse_expression(topic: TopicRef | None) -> tuple[topicexpr.TopicExpression | None, str]:
    """The parsed expression and the colon path of the topic it names when concrete."""
    if topic is None:
        return None, ""
    expr = errors.topic_expression_parse(topic.text, topic.dialect, topic.nsmap)
    if not expr.is_concrete:
        return expr, ""
    root_ns, names, any_ns = expr.concrete()
    node = topic_tree(max_age=0).resolve(root_ns, names, any_ns)
    if node is None:
        raise errors.TopicNotSupported(f"topic '{topic.text}' is not in the topic tree")
    return expr, node.path


def _compile_content_filter(content: TopicRef | None) -> None:
    if content is None or content.dialect == SQL:  # SQL: subscriptions/filters.py
        return
    if content.dialect not in (None, "", ns.FILTER_XPATH):
        raise errors.InvalidFilter(
            f"MessageContent dialect '{content.dialect}' is not supported",
            detail_xml=errors.unknown_filter_xml(ns.WSNT, "MessageContent"),
        )
    try:
        xpathfilter.compile_filter(
            content.text, content.nsmap, max_chars=settings.HPWSN_FILTER_MAX_CHARS
        )
    except xpathfilter.FilterRejected as exc:
        raise errors.InvalidMessageContentExpression(
            f"MessageContent '{content.text[:200]}' is refused: {exc}"
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


def _check_address(address: str) -> None:
    """A URL any client could be handed, or InvalidConsumerReference naming what is wrong."""
    try:
        validate_url(address)
    except TargetRefused as exc:
        raise errors.InvalidConsumerReference(f"consumer address refused: {exc}") from None


def _check_push_address(address: str, *, base_url: str) -> None:
    _check_address(address)
    try:
        target = check_target(address)
    except TargetRefused as exc:
        raise errors.SubscribeCreationFailed(f"consumer address refused: {exc}") from None
    for own in own_endpoints(base_url):
        if same_endpoint(target, own):
            # Pushing to itself, the broker would publish its own pushes again (or answer them
            # with faults, for ever): a loop that one Subscribe could start.
            raise errors.SubscribeCreationFailed(
                f"consumer address refused: {own.host}:{own.port} is this broker's own "
                "endpoint, not a consumer"
            )


def _check_signing_secret(secret: str) -> None:
    try:
        signing_key(secret)
    except ValueError as exc:
        raise errors.InvalidSubscriptionPolicy(f"hpwsn:SigningSecret refused: {exc}") from None


def _check_interest_path(sites: Sequence[str] | None) -> tuple[str, ...]:
    if sites is None:
        return ()
    try:
        return interest_path_check(sites)
    except ValueError as exc:
        raise errors.InvalidSubscriptionPolicy(f"hpwsn:InterestPath refused: {exc}") from None


def _check_site_peers(sites: Sequence[str] | None) -> tuple[str, ...]:
    try:
        return site_peers_check(sites or ())
    except ValueError as exc:
        raise errors.InvalidSubscriptionPolicy(f"hpwsn:Peers refused: {exc}") from None


def subscription_authorize(
    *, principal: acl.Principal, subscription: Subscription, operation: str
) -> None:
    """Raise NotAuthorized unless the principal may do `operation` on the subscription.

    Its owner may, and so may hpwsn-admins and hpwsn-operators (topics.acl.may_act_on). The
    SOAP and REST edges call it through the services below; `operation` names the WSN operation
    (Renew, Unsubscribe, PauseSubscription, ResumeSubscription) for the fault's detail.
    """
    acl.check_owner(
        principal,
        owner=subscription.owner,
        operation=operation,
        resource=subscription.reference_address or str(subscription.id),
    )


def pull_point_authorize(
    *, principal: acl.Principal, pull_point: PullPoint, operation: str
) -> None:
    """Raise NotAuthorized unless the principal may do `operation` (GetMessages, DestroyPullPoint,
    Subscribe into it) on the pull point: the same rule as subscription_authorize."""
    acl.check_owner(
        principal,
        owner=pull_point.owner,
        operation=operation,
        resource=pull_point.address or str(pull_point.id),
    )


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


def _pull_point_held(pp: PullPoint) -> bool:
    """Lock the pull point's row for the caller's transaction; False if it was destroyed since it
    was read (DestroyPullPoint removes the subscriptions into it under the same lock)."""
    live = PullPoint.objects.select_for_update().filter(id=pp.id, destroyed_at__isnull=True)
    return bool(list(live.values_list("id", flat=True)))


def subscription_dedup_key(
    *,
    owner: str,
    mode: str,
    target: str,
    canonical: str,
    content_dialect: str,
    content_filter: str,
    filter_parameters: Sequence[Value] = (),
    producer_filter: str = "",
    format: str = Subscription.Format.WSN,
    interest_path: Sequence[str] = (),
    signing_secret: str = "",
) -> str:
    """Same owner + consumer + expression + filter = the same subscription (thesis 5.3.1).

    A filter without a dialect is XPath 1.0, as it is stored: both spellings are one filter.
    The owner is part of the key so that a duplicate from another principal never answers with
    (and hands out the address of) someone else's subscription. An anonymous owner adds nothing,
    so keys written before owners existed stay valid; any other owner comes first and
    length-prefixed, so no consumer address or filter text can spell the same key. Parameters and
    a ProducerProperties filter count only when present, so the keys of subscriptions without
    them are what they always were; another push format is another subscription (the keys of
    `wsn` ones are as they always were). So is another interest path (a peer site's link made
    again for interest that now comes by another path, before the old one ends), and, for such a
    link, another SigningSecret (a link made before its site signed pushes is made again signed).
    """
    dialect = content_dialect or ns.FILTER_XPATH
    filter_text = f"{dialect}|{content_filter}" if content_filter else ""
    if filter_parameters:
        filter_text += "|" + json.dumps(list(filter_parameters))
    if producer_filter:
        filter_text += f"|producer|{producer_filter}"
    # Without case, as the directory compares uids (topics.acl.may_act_on).
    who = owner.casefold()
    whose = "" if who == acl.ANONYMOUS_OWNER else f"owner {len(who)} {who}\n"
    material = f"{whose}{mode}\n{target}\n{canonical}\n{filter_text}"
    if format != Subscription.Format.WSN:
        material += f"\n{format}"
    if interest_path:
        material += "\ninterest " + "/".join(interest_path)
        if signing_secret:
            material += "\nsigned " + hashlib.sha256(signing_secret.encode()).hexdigest()
    return hashlib.sha256(material.encode()).hexdigest()


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
    client: str = "",
    producer: TopicRef | None = None,
    filter_parameters: Sequence[Value] = (),
    format: str = Subscription.Format.WSN,
    interest_path: Sequence[str] | None = None,
    site_peers: Sequence[str] | None = None,
) -> tuple[Subscription, bool]:
    """Create a subscription or return the identical one (thesis 5.3.1): (sub, created).

    `client` is the caller's address (an anonymous caller's allowance is counted by it);
    `producer` is a ProducerProperties filter; `filter_parameters` the values of an SQL-like
    filter's %0, %1, ... (hpwsn:FilterParameters); `interest_path` and `site_peers` a peer
    site's hpwsn:InterestPath and hpwsn:Peers (federation.peers.Interest).
    """
    if format not in Subscription.Format.values:
        raise errors.UnsupportedPolicy(
            f"push format '{format}' is not supported (one of {', '.join(Subscription.Format)})"
        )
    path = _check_interest_path(interest_path)
    peers = _check_site_peers(site_peers)
    now = timezone.now()
    termination = _termination(initial_termination_time, now=now, initial=True)
    expr, topic_path = _parse_expression(topic)
    acl.check_subscribe_expression(topic_tree(), expr, principal)
    _compile_content_filter(content)
    subscription_filter_compile(
        content_text=content.text if content else "",
        content_dialect=(content.dialect or "") if content else "",
        producer_text=producer.text if producer else "",
        producer_dialect=(producer.dialect or "") if producer else "",
        parameters=filter_parameters,
    )
    _check_signing_secret(signing_secret)
    _check_address(consumer_address)
    pull_point = _pull_point_of(consumer_address)
    if pull_point is not None:
        # Feeding someone else's pull point is acting on it: only its owner (or staff) may.
        pull_point_authorize(principal=principal, pull_point=pull_point, operation="Subscribe")
    if subscriber_address:  # legacy HPwsn: push to SubscriberAddress through a bound push endpoint
        _check_push_address(subscriber_address, base_url=base_url)
        mode, target = Subscription.Mode.PUSH, subscriber_address
    elif pull_point is not None:
        mode, target = Subscription.Mode.PULL, consumer_address
    else:
        _check_push_address(consumer_address, base_url=base_url)
        mode, target = Subscription.Mode.PUSH, consumer_address
    canonical = expr.canonical() if expr else "*"
    dedup_key = subscription_dedup_key(
        owner=principal.owner,
        mode=mode,
        target=target,
        canonical=canonical,
        content_dialect=content.dialect or "" if content else "",
        content_filter=content.text if content else "",
        filter_parameters=filter_parameters,
        producer_filter=producer.text if producer else "",
        format=format,
        interest_path=path,
        signing_secret=signing_secret,
    )

    if _owned_at_limit(principal, client=client, now=now):
        existing = _existing(dedup_key, now=now, termination=termination)
        if existing is None:  # a duplicate allocates nothing, so it is answered all the same
            limit = settings.HPWSN_MAX_SUBSCRIPTIONS_PER_OWNER
            raise errors.SubscribeCreationFailed(
                f"{principal} holds {limit} subscriptions, the most one principal may "
                f"(HPWSN_MAX_SUBSCRIPTIONS_PER_OWNER); end one first"
            )
        _duplicate(existing, pull_point=pull_point, subscriber_address=subscriber_address)
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
        filter_parameters=list(filter_parameters),
        producer_filter=producer.text if producer else "",
        producer_dialect=(producer.dialect or "") if producer else "",
        dedup_key=dedup_key,
        owner=principal.owner,
        created_from=allowance.created_from(principal=principal, client=client),
        soap_version=soap_version,
        use_raw=use_raw,
        format=format,
        signing_secret=signing_secret,
        termination_time=termination,
        interest_path=list(path),
        site_peers=list(peers),
    )
    # The insert comes first: an identical subscription (thesis 5.3.1) is the exception, told by
    # the unique dedup key, and a new one costs no lookup before it.
    for attempt in range(2):
        try:
            with transaction.atomic():
                if pull_point is not None and not _pull_point_held(pull_point):
                    raise errors.ResourceUnknown(f"pull point {pull_point.id} does not exist")
                # By the clock every host shares: the fan-out compares it with the acceptance
                # time of reliable messages, set by whichever web process took them.
                sub.created_at = datetime.fromtimestamp(state.shared_now(), tz=UTC)
                sub.save(force_insert=True)
                change_record(
                    kind=SUBSCRIPTION, keys=[str(sub_id)], carried=subscription_carried(sub)
                )
            break
        except IntegrityError:
            existing = _existing(dedup_key, now=now, termination=termination)
            if existing is not None:
                _duplicate(existing, pull_point=pull_point, subscriber_address=subscriber_address)
                return existing, False
            if attempt:  # removed as expired, then taken again by a concurrent Subscribe
                raise
    subscription_directory_write(subscription_ids=[sub.id])
    registrations.demand_changed()  # a publisher may have to start sending
    events.subscription(sub=str(sub.id), action="created", consumer=target, topic=topic_path)
    return sub, True


# Live subscriptions per allowance (allowance.allowance_key: the owner, or an anonymous caller's
# address) as this process last counted them (when, how many), with what it made since added:
# an allowance is counted again at most every _HELD_RECOUNT_S while it subscribes,
# not at every Subscribe (counting 10^5 rows takes 40 ms on PostgreSQL). What other processes made
# within that time is not seen: the allowance may be passed by that much.
_held: dict[str, tuple[float, int]] = {}
_HELD_RECOUNT_S = 1.0


def _owned_at_limit(principal: acl.Principal, *, client: str, now: datetime) -> bool:
    """The principal holds HPWSN_MAX_SUBSCRIPTIONS_PER_OWNER live subscriptions: each is a row,
    a directory entry and an entry of every worker's index, made by whoever may subscribe.
    An anonymous caller's are those made from its address. When False, the caller makes one more."""
    limit = settings.HPWSN_MAX_SUBSCRIPTIONS_PER_OWNER
    if limit <= 0:
        return False
    key = allowance.allowance_key(principal=principal, client=client)
    t = time.monotonic()
    counted = _held.get(key)
    if counted is None or t - counted[0] >= _HELD_RECOUNT_S:
        live = allowance.held_by(
            Subscription.objects.all(), principal=principal, client=client
        ).filter(Q(termination_time__isnull=True) | Q(termination_time__gt=now))
        counted = (t, live[:limit].count())
    if counted[1] >= limit:
        _held[key] = counted
        return True
    if len(_held) > 10_000:
        _held.clear()
    _held[key] = (counted[0], counted[1] + 1)
    return False


def _duplicate(
    existing: Subscription, *, pull_point: PullPoint | None, subscriber_address: str | None
) -> None:
    """A Subscribe identical to an existing subscription is answered with it."""
    if pull_point is not None and subscriber_address and pull_point.id != existing.pull_point_id:
        # The push endpoint created for this duplicate is released (thesis figure 5-9).
        pull_point_destroy(pull_point_id=str(pull_point.id))
    subscription_directory_write(subscription_ids=[existing.id])
    if existing.mode == Subscription.Mode.PUSH and existing.state == Subscription.State.ACTIVE:
        # The subscriber says its consumer is there: what waits in retry back-off is tried now
        # rather than at the next step of its schedule.
        subscription_wake(subscription_id=str(existing.id))


def _existing(
    dedup_key: str, *, now: datetime, termination: datetime | None
) -> Subscription | None:
    sub = Subscription.objects.filter(dedup_key=dedup_key).first()
    if sub is None:
        return None
    if sub.termination_time is not None and sub.termination_time <= now:
        with contextlib.suppress(errors.ResourceUnknown):  # the expiry sweep took it meanwhile
            subscription_delete(subscription_id=str(sub.id))
        return None
    # A duplicate may extend the lifetime it asks for, never shorten it.
    if sub.termination_time is not None and (
        termination is None or termination > sub.termination_time
    ):
        with transaction.atomic():
            # Conditional, as Renew: the row may have ended since it was read (then the caller
            # makes the subscription anew).
            if not Subscription.objects.filter(_live(now), id=sub.id).update(
                termination_time=termination, updated_at=now
            ):
                return None
            change_record(kind=SUBSCRIPTION, keys=[str(sub.id)])
        sub.termination_time = termination
    return sub


def _live(now: datetime) -> Q:
    return Q(termination_time__isnull=True) | Q(termination_time__gt=now)


def _get(
    subscription_id: str, *, principal: acl.Principal | None = None, operation: str = ""
) -> Subscription:
    sub = subscription_row(subscription_id)
    if sub is None or (sub.termination_time is not None and sub.termination_time <= timezone.now()):
        raise errors.ResourceUnknown(f"subscription {subscription_id} does not exist")
    if principal is not None:
        subscription_authorize(principal=principal, subscription=sub, operation=operation)
    return sub


# The services below take the caller as `principal` and refuse what it may not do (see
# subscription_authorize). None is for callers inside the broker that decided already: the
# console (its own roles), the directory sync, the expiry sweeps.


def subscription_renew(
    *,
    subscription_id: str,
    termination_time: str | None,
    principal: acl.Principal | None = None,
) -> Subscription:
    """Set a new termination time; a suspended subscription is resumed, a paused one stays."""
    sub = _get(subscription_id, principal=principal, operation="Renew")
    now = timezone.now()
    termination = _termination(termination_time, now=now, initial=False)
    # Conditional updates, not a save of the row read above: a Pause answered in between would
    # be undone by writing the state read, and an expiry sweep that read the old time deletes
    # only a row that still has it (`_free`), so of the two exactly one wins.
    with transaction.atomic():
        rows = Subscription.objects.filter(_live(now), id=sub.id)
        if not rows.update(termination_time=termination, updated_at=now):
            raise errors.ResourceUnknown(f"subscription {subscription_id} does not exist")
        resume = bool(
            rows.filter(state=Subscription.State.SUSPENDED).update(state=Subscription.State.ACTIVE)
        )
        change_record(kind=SUBSCRIPTION, keys=[str(sub.id)])
    sub.termination_time = termination
    if resume:
        sub.state = Subscription.State.ACTIVE
        _resume(str(sub.id))
    subscription_directory_write(subscription_ids=[sub.id])
    events.subscription(sub=str(sub.id), action="renewed", consumer=sub.consumer_address)
    return sub


def subscription_set_state(
    *, subscription_id: str, paused: bool, principal: acl.Principal | None = None
) -> Subscription:
    """Pause or resume; messages matched meanwhile wait queued. A suspended subscription resumes
    with a fresh schedule; an active or paused one keeps its batches' attempts (a Resume is a
    sign of life, as a duplicate Subscribe: what waits in retry back-off is retried now), so its
    owner cannot keep a dead consumer from dead letters and suspension by resuming it."""
    operation = "PauseSubscription" if paused else "ResumeSubscription"
    sub = _get(subscription_id, principal=principal, operation=operation)
    suspended = sub.state == Subscription.State.SUSPENDED
    sub.state = Subscription.State.PAUSED if paused else Subscription.State.ACTIVE
    now = timezone.now()
    with transaction.atomic():
        # Conditional: the row may have gone (Unsubscribe, expiry) since it was read.
        if not Subscription.objects.filter(_live(now), id=sub.id).update(
            state=sub.state, updated_at=now
        ):
            raise errors.ResourceUnknown(f"subscription {subscription_id} does not exist")
        change_record(kind=SUBSCRIPTION, keys=[str(sub.id)])
    if suspended and not paused:
        _resume(str(sub.id))
    elif not paused and not subscription_wake(subscription_id=str(sub.id)):
        pump_kick(subscription_id=str(sub.id))
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
    with transaction.atomic():
        changed = Subscription.objects.filter(id=key, state=Subscription.State.ACTIVE).update(
            state=Subscription.State.SUSPENDED, updated_at=timezone.now()
        )
        if changed:
            change_record(kind=SUBSCRIPTION, keys=[subscription_id])
    state.get_redis().zrem(state.RETRY, subscription_id)  # no retries while suspended
    subscription_directory_write(subscription_ids=[key])
    if changed:
        events.subscription(sub=subscription_id, action="suspended")
    return bool(changed)


def _resume(sub_id: str) -> None:
    # A fresh start: the head batch gets a full schedule, and the time to suspension runs again
    # from the next failure.
    r = state.get_redis()
    pipe = r.pipeline(transaction=False)
    pipe.delete(state.attempts_key(sub_id), state.failing_since_key(sub_id))
    pipe.zrem(state.RETRY, sub_id)
    pipe.execute()
    pump_kick(subscription_id=sub_id)


def subscription_delete(*, subscription_id: str, principal: acl.Principal | None = None) -> None:
    """Unsubscribe: remove the row, its queue and every Redis key it held, and its push endpoint."""
    sub = subscription_row(subscription_id)
    if sub is None:
        raise errors.ResourceUnknown(f"subscription {subscription_id} does not exist")
    if principal is not None:
        subscription_authorize(principal=principal, subscription=sub, operation="Unsubscribe")
    if not _free(sub):
        raise errors.ResourceUnknown(f"subscription {subscription_id} does not exist")


def _free(sub: Subscription, *, expired_at: datetime | None = None) -> bool:
    """Delete the row and free what it held; False when the row was gone already, or (with
    `expired_at`, the time an expiry sweep read it at) renewed since."""
    sub_id = str(sub.id)
    bound_push_endpoint = sub.pull_point_id if sub.mode == Subscription.Mode.PUSH else None
    with transaction.atomic():
        # Conditional, not a delete of the row read: a Renew that wrote since the sweep read it
        # keeps the subscription (and its queue) alive.
        rows = Subscription.objects.filter(id=sub.id)
        if expired_at is not None:
            rows = rows.filter(termination_time__lte=expired_at)
        if not rows.delete()[0]:
            return False
        if bound_push_endpoint:
            PullPoint.objects.filter(id=bound_push_endpoint).update(destroyed_at=timezone.now())
        change_record(kind=SUBSCRIPTION, keys=[sub_id])

    def forget() -> None:
        pipe = state.get_redis().pipeline(transaction=False)
        state.subscription_forget(pipe, sub_id)
        pipe.execute()

    # Once the row's delete is committed: a caller's transaction (a topic deleted with its
    # subscriptions) that rolls back leaves the subscription live, and its queue with it. At
    # once when there is none.
    transaction.on_commit(forget)
    subscription_directory_write(subscription_ids=[sub_id])  # on unsubscribe and expiry
    registrations.demand_changed()  # a publisher may have lost its last subscriber
    events.subscription(sub=sub_id, action="removed", consumer=sub.consumer_address)
    return True


def subscriptions_expire() -> int:
    """Free every subscription whose termination time has passed; returns how many."""
    now = timezone.now()
    expired = list(Subscription.objects.filter(termination_time__lte=now))
    freed = sum(_free(sub, expired_at=now) for sub in expired)
    # Publisher registrations end on the same sweep; a demand one's subscriptions at its publisher
    # are ended as DestroyRegistration ends them.
    registrations.registrations_expire()
    return freed


def pull_point_create(
    *, base_url: str, principal: acl.Principal = acl.ANONYMOUS, client: str = ""
) -> PullPoint:
    """A new, empty pull point, owned by the principal that asked for it (from `client`)."""
    limit = settings.HPWSN_MAX_PULLPOINTS_PER_OWNER
    live = allowance.held_by(
        PullPoint.objects.filter(destroyed_at__isnull=True), principal=principal, client=client
    )
    if limit > 0 and live[:limit].count() >= limit:
        # An anonymous caller's allowance is its address's; a pull point nobody reads goes after
        # HPWSN_PULLPOINT_IDLE_S.
        raise errors.UnableToCreatePullPoint(
            f"{principal} holds {limit} pull points, the most one principal may "
            f"(HPWSN_MAX_PULLPOINTS_PER_OWNER); destroy one first"
        )
    pp_id = uuid.uuid4()
    return PullPoint.objects.create(
        id=pp_id,
        address=f"{base_url}/wsn/pullpoints/{pp_id}",
        owner=principal.owner,
        created_from=allowance.created_from(principal=principal, client=client),
    )


def _get_pull_point(
    pull_point_id: str, *, principal: acl.Principal | None = None, operation: str = ""
) -> PullPoint:
    try:
        pp = PullPoint.objects.filter(id=uuid.UUID(pull_point_id)).first()
    except (ValueError, TypeError):
        pp = None
    if pp is None:
        raise errors.ResourceUnknown(f"pull point {pull_point_id} does not exist")
    if principal is not None:
        pull_point_authorize(principal=principal, pull_point=pp, operation=operation)
    return pp


def pull_point_destroy(*, pull_point_id: str, principal: acl.Principal | None = None) -> None:
    """Destroy a pull point, its queue and the subscriptions that deliver into it."""
    pp = _get_pull_point(pull_point_id, principal=principal, operation="DestroyPullPoint")
    gone = errors.UnableToDestroyPullPoint(f"pull point {pull_point_id} was already destroyed")
    if pp.destroyed_at is not None:
        raise gone
    with transaction.atomic(), change_batch():
        # Conditional, and its row lock held until the subscriptions are gone: a second Destroy
        # finds it destroyed, and a Subscribe into it (which locks the row to insert) either
        # committed before, and its subscription is removed here, or finds it destroyed.
        if not PullPoint.objects.filter(id=pp.id, destroyed_at__isnull=True).update(
            destroyed_at=timezone.now()
        ):
            raise gone
        for sub in Subscription.objects.filter(pull_point=pp, mode=Subscription.Mode.PULL):
            _free(sub)
    answer_id, answer = state.pull_answer_keys(str(pp.id))
    r = state.get_redis()
    state.bodies_drop(r, lists=[state.pullpoint_key(str(pp.id)), answer])
    r.delete(answer_id)


# Take the first messages off a pull point only if they are still the ones read, and keep them
# as the answer of this request (KEYS[1]: the pull point's list, KEYS[2] and KEYS[3] its answer's
# request id and items; ARGV[1] the key prefix, ARGV[2] the request's id, '' for none, ARGV[3]
# how long an answer is kept (s), ARGV[4..] the items read): 1 if taken, 0 if another reader (or
# the depth limit) moved the head meanwhile. The answer before is acknowledged by this request:
# its bodies' references are given back, as are this one's when it has no id to be asked by.
_TAKE_HEAD = (
    state.RELEASE_LUA
    + state.HEAD_LUA
    + """
if not head_is(KEYS[1], ARGV, 4) then return 0 end
local n = #ARGV - 3
redis.call('ltrim', KEYS[1], n, -1)
release(ARGV[1], redis.call('lrange', KEYS[3], 0, -1))
redis.call('del', KEYS[2], KEYS[3])
if ARGV[2] ~= '' and n > 0 then
  redis.call('set', KEYS[2], ARGV[2], 'EX', ARGV[3])
  redis.call('rpush', KEYS[3], unpack(ARGV, 4))
  redis.call('expire', KEYS[3], ARGV[3])
else
  release(ARGV[1], ARGV, 4)
end
return 1
"""
)


def pull_point_get_messages(
    *,
    pull_point_id: str,
    maximum: int | None,
    render: Callable[[list[tuple[str, bytes]]], T],
    principal: acl.Principal | None = None,
    request_id: str | None = None,
) -> T:
    """Take up to `maximum` messages, oldest first, as `render` shapes them from (subscription
    address, stored fragment) pairs.

    The messages leave the pull point only once their reply exists: an error before that (a
    payload that cannot be rendered, a lost database connection) leaves them all queued. With a
    `request_id` (wsa:MessageID, Idempotency-Key), the answer is kept until the pull point's
    next GetMessages, for HPWSN_DEDUP_WINDOW_S at most: the same request sent again, its answer
    lost, is answered with the same messages.
    """
    # Its row and its subscriptions' addresses by queries compiled once: a consumer that polls
    # asks for them at every call.
    try:
        pp_id = uuid.UUID(pull_point_id)
    except (ValueError, TypeError):
        raise errors.ResourceUnknown(f"pull point {pull_point_id} does not exist") from None
    pp, refs = pull_point_read(pp_id)
    if pp is None:
        raise errors.ResourceUnknown(f"pull point {pull_point_id} does not exist")
    if principal is not None:
        pull_point_authorize(principal=principal, pull_point=pp, operation="GetMessages")
    if pp.destroyed_at is not None:
        raise errors.ResourceUnknown(f"pull point {pull_point_id} was destroyed")
    now = timezone.now()
    if pp.last_used_at is None or now - pp.last_used_at > timedelta(minutes=1):
        PullPoint.objects.filter(id=pp.id).update(last_used_at=now)
    count = 1000 if not maximum else min(maximum, 10_000)
    r = state.get_redis()
    key = state.pullpoint_key(str(pp.id))
    answer_id, answer = state.pull_answer_keys(str(pp.id))
    request = (request_id or "")[:1024]
    for _try in range(5):
        pipe = r.pipeline(transaction=False)
        pipe.lrange(key, 0, count - 1)
        pipe.get(answer_id)
        queued, held = pipe.execute()
        if request and held == request.encode():
            # The answer of this request, sent again (its first was lost on the way).
            return render(_pulled(r, r.lrange(answer, 0, -1), refs))
        entries = _pull_batch(r, queued)
        out = _pulled(r, entries, refs)
        reply = render(out)
        if not entries and held is None:
            return reply
        window = settings.HPWSN_DEDUP_WINDOW_S
        keys = (key, answer_id, answer)
        if r.eval(_TAKE_HEAD, 3, *keys, state.PREFIX, request, window, *entries):
            if out:
                events.pull(pullpoint=pull_point_id, messages=len(out))
            return reply
    # Readers keep racing for the same head: answer with nothing rather than with messages
    # another reader may have been given too.
    return render([])


def _pulled(r: Any, entries: list[bytes], refs: dict[str, str]) -> list[tuple[str, bytes]]:
    """(subscription address, stored message) of pull point items whose message is still kept."""
    ids = [pull_item_ids(e) for e in entries]
    payloads = r.mget([state.payload_key(nid) for nid, _sub in ids]) if ids else []
    return [
        (refs.get(sub_id, ""), payload)
        for (_nid, sub_id), payload in zip(ids, payloads, strict=True)
        if payload is not None  # None: the message outlived its retention
    ]


def _pull_batch(r: Any, entries: list[bytes]) -> list[bytes]:
    """The first entries, up to the one that brings their bodies to HPWSN_PULL_BATCH_BYTES (one
    at least): their sizes are read before the bodies, so a reply never reads more."""
    if len(entries) <= 1:
        return entries
    pipe = r.pipeline(transaction=False)
    for e in entries:
        pipe.strlen(state.payload_key(pull_item_ids(e)[0]))
    total, budget = 0, settings.HPWSN_PULL_BATCH_BYTES
    for k, size in enumerate(pipe.execute()):
        total += int(size)
        if total >= budget:
            return entries[: k + 1]
    return entries


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
