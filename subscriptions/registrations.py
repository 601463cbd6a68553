"""Publisher registrations (WS-BrokeredNotification RegisterPublisher / DestroyRegistration).

A registration names a publisher (its PublisherReference address) and the topics it publishes
on. On a topic whose policy sets `require_registration`, a Notify is accepted only when its
ProducerReference names a publisher registered for that topic or an ancestor of it.

Demand-based publishing (Demand=true): the publisher does not send until asked. The broker
subscribes to the publisher's own NotificationProducer (its PublisherReference) for each registered
topic while that topic has at least one subscriber here, pauses that subscription when the last
one leaves and resumes it when a new one arrives (registration_demand_sync, queued after every
Subscribe, Unsubscribe and expiry while demand registrations exist).

The broker calls a publisher only from Celery tasks, never inside a request: a publisher that is
slow or gone would hold the request (and a web thread) for the HTTP client's whole timeout.

Every service that makes, renews or removes a registration records it in the directory outbox in
the same transaction (directory/outbox.py); the entry under ou=registrations is written later by a
Celery task, so RegisterPublisher never waits for LDAP.
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from directory.outbox import registration_directory_write
from dispatch.push import check_target
from hpwsn import errors
from hpwsn.client import WsnClient, WsnClientError
from hpwsn.targets import CheckedTransport, TargetRefused
from hpwsn.wsn import TopicRef
from hpwsn.xsdtime import TimeValueError, format_datetime, parse_termination
from hpwsn_site import state
from subscriptions import allowance, tasks
from subscriptions.models import PublisherRegistration, Subscription
from subscriptions.selectors import subscription_index
from topics import acl
from topics.selectors import topic_tree
from topics.tree import ROOT_POLICY

log = logging.getLogger(__name__)


# An absolute URI (RFC 3986: a scheme, a colon, then no space, control or delimiter character that
# a URI must percent-encode). A wsa:Address is an xsd:anyURI; a Notify's ProducerReference is
# compared with it as written.
_ABSOLUTE_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[^\s\x00-\x1f\x7f<>\"{}|\\^`]+")
# Schemes that run or embed content where an address is followed: never a publisher's name.
_REFUSED_SCHEMES = frozenset({"javascript", "vbscript", "data"})
MAX_PUBLISHER_ADDRESS = 2048


def publisher_address_check(address: str) -> None:
    """Raise PublisherRegistrationRejected unless `address` is an absolute URI a publisher can be
    named by (with or without Demand: its ProducerReference must carry the same one)."""
    if len(address) > MAX_PUBLISHER_ADDRESS:
        raise errors.PublisherRegistrationRejected(
            f"the publisher address is longer than {MAX_PUBLISHER_ADDRESS} characters"
        )
    if not _ABSOLUTE_URI.fullmatch(address):
        raise errors.PublisherRegistrationRejected(
            f"the publisher address {address[:200]!r} is not an absolute URI"
        )
    scheme = address.split(":", 1)[0].lower()
    if scheme in _REFUSED_SCHEMES:
        raise errors.PublisherRegistrationRejected(
            f"the publisher address may not be a '{scheme}:' URI"
        )


def _topic_path(topic: TopicRef) -> str:
    expr = errors.topic_expression_parse(topic.text, topic.dialect, topic.nsmap)
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
    client: str = "",
) -> PublisherRegistration:
    """Register a publisher for topics; the caller (from address `client`) must be allowed to
    publish on each of them."""
    if not publisher_address:
        # Without it a Notify could never be recognised as this publisher's.
        raise errors.PublisherRegistrationRejected("RegisterPublisher needs a PublisherReference")
    publisher_address_check(publisher_address)
    if demand and not topics:
        raise errors.PublisherRegistrationRejected("Demand=true needs the registered Topic(s)")
    if demand:
        # The broker will call this address: the same allow-list as pushes (no SSRF).
        try:
            check_target(publisher_address)
        except TargetRefused as exc:
            raise errors.PublisherRegistrationRejected(
                f"publisher address refused for demand-based publishing: {exc}"
            ) from None
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
    limit = settings.HPWSN_MAX_REGISTRATIONS_PER_OWNER
    live = allowance.held_by(
        PublisherRegistration.objects.all(), principal=principal, client=client
    ).filter(Q(termination_time__isnull=True) | Q(termination_time__gt=now))
    if limit > 0 and live[:limit].count() >= limit:
        # Each is a row and a directory entry; an anonymous caller's allowance is its address's.
        raise errors.PublisherRegistrationRejected(
            f"{principal} holds {limit} publisher registrations, the most one principal "
            f"may (HPWSN_MAX_REGISTRATIONS_PER_OWNER); destroy one first"
        )
    tree = topic_tree()
    for path in paths or [""]:
        # No topic means every topic: judged at the top of the tree, like a Subscribe without one.
        node = tree.get(path) if path else None
        acl.check_publish(node.policy if node is not None else ROOT_POLICY, principal, path or "*")
    reg_id = uuid.uuid4()
    with transaction.atomic():
        reg = PublisherRegistration.objects.create(
            id=reg_id,
            reference_address=f"{base_url}/wsn/registrations/{reg_id}",
            publisher_address=publisher_address,
            topic_paths=paths,
            termination_time=termination,
            demand=demand,
            broker_address=f"{base_url}/wsn/",
            owner=principal.owner,
            created_from=allowance.created_from(principal=principal, client=client),
        )
        registration_directory_write(registration_ids=[reg_id])
        if demand:
            demand_changed(registered=True)
    return reg


def registration_authorize(
    *, principal: acl.Principal, registration: PublisherRegistration, operation: str
) -> None:
    """Raise NotAuthorized unless the principal may do `operation` (Renew, DestroyRegistration)
    on the registration: its owner, admins and operators, as for subscriptions."""
    acl.check_owner(
        principal,
        owner=registration.owner,
        operation=operation,
        resource=registration.reference_address or str(registration.id),
    )


def registration_renew(
    *,
    registration_id: str,
    termination_time: str | None,
    principal: acl.Principal,
) -> PublisherRegistration:
    """Renew: a new termination time for a live registration (a duration or a dateTime)."""
    reg = registration_live(registration_id=registration_id)
    registration_authorize(principal=principal, registration=reg, operation="Renew")
    now = timezone.now()
    minimum = errors.minimum_time_xml(format_datetime(now))
    if not termination_time:
        raise errors.UnacceptableTerminationTime(
            "Renew needs a TerminationTime", detail_xml=minimum
        )
    try:
        when = parse_termination(termination_time, now=now)
    except TimeValueError as exc:
        raise errors.UnacceptableTerminationTime(str(exc), detail_xml=minimum) from None
    if when <= now:
        raise errors.UnacceptableTerminationTime(
            f"termination time '{termination_time}' is not in the future", detail_xml=minimum
        )
    with transaction.atomic():
        reg.termination_time = when
        reg.save(update_fields=["termination_time"])
        registration_directory_write(registration_ids=[reg.id])
    return reg


def _key(registration_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(registration_id))
    except (ValueError, TypeError):
        raise errors.ResourceUnknown(f"registration {registration_id} does not exist") from None


def registration_live(*, registration_id: str) -> PublisherRegistration:
    """The registration of this id, unless there is none or it has expired (ResourceUnknown)."""
    reg = PublisherRegistration.objects.filter(id=_key(registration_id)).first()
    if reg is None or (reg.termination_time is not None and reg.termination_time <= timezone.now()):
        raise errors.ResourceUnknown(f"registration {registration_id} does not exist")
    return reg


def registration_destroy(*, registration_id: str, principal: acl.Principal | None) -> None:
    """DestroyRegistration: the publisher is no longer registered (nor asked for anything).

    `principal` None: the broker itself (expiry), with no owner check.

    The subscriptions a demand registration holds at the publisher are ended by the task
    `registration_release`, queued once the row is gone.
    """
    key = _key(registration_id)
    with transaction.atomic():
        # Locked: a demand sync holding the row may be subscribing right now; its addresses are
        # read only after it committed, so none is left behind at the publisher.
        reg = PublisherRegistration.objects.select_for_update().filter(id=key).first()
        if reg is None:
            raise errors.ResourceUnknown(f"registration {registration_id} does not exist")
        if principal is not None:
            registration_authorize(
                principal=principal, registration=reg, operation="DestroyRegistration"
            )
        addresses = [entry["address"] for entry in reg.demand_state.values()]
        reg.delete()
        registration_directory_write(registration_ids=[key])  # on destroy and expiry
        if reg.demand:
            transaction.on_commit(_demand_unknown)
        if addresses:
            # The row is gone, so the task gets what it needs, not an id.
            publisher = reg.publisher_address
            transaction.on_commit(lambda: tasks.registration_release.delay(publisher, addresses))


def registrations_expire() -> int:
    """Destroy every registration past its termination time; returns how many."""
    due = PublisherRegistration.objects.filter(termination_time__lte=timezone.now())
    ids = [str(i) for i in due.values_list("id", flat=True)]
    for reg_id in ids:
        with contextlib.suppress(errors.ResourceUnknown):  # destroyed meanwhile
            registration_destroy(registration_id=reg_id, principal=None)
    return len(ids)


def registration_release(*, publisher_address: str, subscription_addresses: list[str]) -> None:
    """Unsubscribe from a destroyed registration's publisher (safe twice: a subscription already
    gone is only logged)."""
    if not _may_call(publisher_address, publisher_address):
        return
    with _client(publisher_address) as client:
        for address in subscription_addresses:
            if not _may_call(address, publisher_address):
                continue
            try:
                client.unsubscribe(address)
            except WsnClientError as exc:  # it ends at its termination time, if any
                log.warning("unsubscribing from publisher %s: %s", publisher_address, exc)


def _client(publisher_address: str) -> WsnClient:
    """A client whose connections go to the addresses the allow-list checked when each was made,
    so a publisher's name that resolves elsewhere between the check and the call is not followed
    (its connection is refused, and logged as the call's failure)."""
    return WsnClient(publisher_address, transport=CheckedTransport(check_target))


def _may_call(address: str, publisher_address: str) -> bool:
    """Whether the broker may call this address of a demand publisher: the allow-list of pushes,
    checked before every call, for the publisher's own address (its name may resolve elsewhere
    since it registered) and for each SubscriptionReference it answered with (any address it
    likes)."""
    try:
        check_target(address)
    except TargetRefused as exc:
        log.warning("not calling publisher %s at %s: %s", publisher_address, address, exc)
        return False
    return True


def demand_changed(*, registered: bool = False) -> None:
    """Queue a demand sync after this transaction, when any registration asked for demand.

    `registered`: this transaction writes a registration with Demand=true. Every Subscribe,
    Unsubscribe and expiry asks, so whether any registration wants demand is read from a marker
    in Redis (kept state.DEMAND_TTL_S seconds), not from the database each time.
    """
    if registered:
        transaction.on_commit(_demand_marked)
    elif not _demand_wanted():
        return
    transaction.on_commit(tasks.registrations_demand_sync.delay)


def _demand_wanted() -> bool:
    r = state.get_redis()
    try:
        known = r.get(state.DEMAND)
    except redis.RedisError:
        known = None
    if known is not None:
        return bool(known == b"1")
    wanted = PublisherRegistration.objects.filter(demand=True).exists()
    # NX: a demand registration committed since the query above has marked "1"; this "0" must not
    # hide it.
    with contextlib.suppress(redis.RedisError):
        r.set(state.DEMAND, b"1" if wanted else b"0", nx=True, ex=state.DEMAND_TTL_S)
    return wanted


def _demand_marked() -> None:
    """After the commit of a demand registration: every Subscribe from now on asks for a sync."""
    try:
        state.get_redis().set(state.DEMAND, b"1", ex=state.DEMAND_TTL_S)
    except redis.RedisError as exc:  # the marker's "0", if any, expires within its TTL
        log.warning("demand marker not set: %s", exc)


def _demand_unknown() -> None:
    """After a demand registration is gone: the next Subscribe reads the database again."""
    with contextlib.suppress(redis.RedisError):  # a "1" left only queues syncs that find nothing
        state.get_redis().delete(state.DEMAND)


def _has_subscribers(path: str) -> bool:
    # Subscriptions covering the topic (on it, an ancestor, or a wildcard), SQL-filtered ones
    # included, or subscribed to a topic below it.
    node = topic_tree().get(path)
    names = tuple(path.split(":"))
    index = subscription_index()
    root_ns = node.root_namespace if node else None
    now = timezone.now().timestamp()
    if any(not e.expired(now) for e in index.matching(root_ns, names)):
        return True
    if any(g.size for g in index.filter_groups(root_ns, names)):
        return True
    return Subscription.objects.filter(topic_path__startswith=path + ":").exists()


def registration_demand_sync(*, registration_id: str) -> None:
    """Subscribe to, pause or resume the publisher's topics as subscribers here come and go."""
    with transaction.atomic():
        # Locked: two syncs at once would subscribe twice. Rare, so holding it over HTTP is fine.
        reg = (
            PublisherRegistration.objects.select_for_update()
            .filter(id=registration_id, demand=True)
            .first()
        )
        if reg is None:
            return
        state = {k: dict(v) for k, v in reg.demand_state.items()}
        if not _may_call(reg.publisher_address, reg.publisher_address):
            return
        with _client(reg.publisher_address) as client:
            for path in reg.topic_paths:
                wanted, held = _has_subscribers(path), state.get(path)
                if held is not None and not _may_call(held["address"], reg.publisher_address):
                    continue
                try:
                    if wanted and held is None:
                        # Kept whatever it is (not subscribed again at every sync); it is called
                        # only if the allow-list lets it.
                        sub = client.subscribe(reg.broker_address, path)
                        state[path] = {"address": sub.address, "paused": False}
                    elif wanted and held and held["paused"]:
                        client.resume(held["address"])
                        held["paused"] = False
                    elif not wanted and held and not held["paused"]:
                        client.pause(held["address"])
                        held["paused"] = True
                except WsnClientError as exc:
                    # The next Subscribe or Unsubscribe here tries again.
                    log.warning("demand sync with publisher %s: %s", reg.publisher_address, exc)
        if state != reg.demand_state:
            reg.demand_state = state
            reg.save(update_fields=["demand_state"])


def registrations_demand_sync() -> int:
    """Sync every live demand registration; returns how many there were."""
    ids = [
        str(i)
        for i in PublisherRegistration.objects.filter(demand=True).values_list("id", flat=True)
    ]
    for reg_id in ids:
        registration_demand_sync(registration_id=reg_id)
    return len(ids)


def publisher_is_registered(*, publisher_address: str | None, topic_path: str) -> bool:
    """Whether a live registration of this publisher covers the topic (or every topic)."""
    if not publisher_address:
        return False
    live = PublisherRegistration.objects.filter(publisher_address=publisher_address).filter(
        Q(termination_time__isnull=True) | Q(termination_time__gt=timezone.now())
    )
    return any(
        registration_covers(topic_paths=paths, topic_path=topic_path)
        for paths in live.values_list("topic_paths", flat=True)
    )


def registration_covers(*, topic_paths: list[str], topic_path: str) -> bool:
    """Whether a registration for these topics (each covers its subtree; none: every topic)
    covers the topic."""
    names = topic_path.split(":")
    ancestors = {":".join(names[:k]) for k in range(1, len(names) + 1)}
    return not topic_paths or not ancestors.isdisjoint(topic_paths)


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
