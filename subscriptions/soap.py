"""SOAP edge for subscriptions and pull points: parse, call one service, shape the reply.

Subscribe is checked against the topics' policies (topics.acl). The other operations address a
subscription or pull point by its random id, which works as a capability: whoever was handed the
reference may renew, pause, resume or end it, as in WS-BaseNotification, whoever calls.
"""

from __future__ import annotations

from django.utils import timezone

from hpwsn import errors, ns, wsn
from hpwsn_site.soapcall import Call, Reply, db
from subscriptions import services


def _sub_id(call: Call) -> str:
    sid = call.resource_from_to("subscriptions")
    if not sid:
        raise errors.ResourceUnknown("the request does not address a subscription (wsa:To)")
    return sid


def _pp_id(call: Call) -> str:
    pid = call.resource_from_to("pullpoints")
    if not pid:
        raise errors.ResourceUnknown("the request does not address a pull point (wsa:To)")
    return pid


async def subscribe(call: Call) -> Reply:
    s = wsn.parse_subscribe(call.body)
    if s.unsupported_policies:
        raise errors.UnsupportedPolicy(
            f"subscription policies not supported: {', '.join(s.unsupported_policies)}"
        )
    sub, _created = await db(
        services.subscription_create,
        consumer_address=s.consumer_address,
        topic=s.topic,
        content=s.message_content,
        initial_termination_time=s.initial_termination_time,
        soap_version=call.req.version,
        use_raw=s.use_raw,
        signing_secret=s.signing_secret,
        base_url=call.base_url,
        subscriber_address=s.subscriber_address,
        principal=call.principal,
        format=s.push_format,
    )
    body = wsn.subscribe_response(sub.reference_address, timezone.now(), sub.termination_time)
    return Reply(ns.action("NotificationProducer", "Subscribe", response=True), body)


async def renew(call: Call) -> Reply:
    sub = await db(
        services.subscription_renew,
        subscription_id=_sub_id(call),
        termination_time=wsn.parse_termination_time(call.body),
    )
    body = wsn.renew_response(timezone.now(), sub.termination_time)
    return Reply(ns.action("SubscriptionManager", "Renew", response=True), body)


async def unsubscribe(call: Call) -> Reply:
    await db(services.subscription_delete, subscription_id=_sub_id(call))
    return Reply(
        ns.action("SubscriptionManager", "Unsubscribe", response=True),
        wsn.empty_response("UnsubscribeResponse"),
    )


async def pause(call: Call) -> Reply:
    await db(services.subscription_set_state, subscription_id=_sub_id(call), paused=True)
    return Reply(
        ns.action("PausableSubscriptionManager", "PauseSubscription", response=True),
        wsn.empty_response("PauseSubscriptionResponse"),
    )


async def resume(call: Call) -> Reply:
    await db(services.subscription_set_state, subscription_id=_sub_id(call), paused=False)
    return Reply(
        ns.action("PausableSubscriptionManager", "ResumeSubscription", response=True),
        wsn.empty_response("ResumeSubscriptionResponse"),
    )


async def create_pull_point(call: Call) -> Reply:
    pp = await db(services.pull_point_create, base_url=call.base_url)
    return Reply(
        ns.action("CreatePullPoint", "CreatePullPoint", response=True),
        wsn.create_pull_point_response(pp.address),
    )


async def get_messages(call: Call) -> Reply:
    items = await db(
        services.pull_point_get_messages,
        pull_point_id=_pp_id(call),
        maximum=wsn.parse_maximum_number(call.body),
    )
    return Reply(
        ns.action("PullPoint", "GetMessages", response=True),
        wsn.get_messages_response([(a or None, p) for a, p in items]),
    )


async def destroy_pull_point(call: Call) -> Reply:
    await db(services.pull_point_destroy, pull_point_id=_pp_id(call))
    return Reply(
        ns.action("PullPoint", "DestroyPullPoint", response=True),
        wsn.empty_response("DestroyPullPointResponse"),
    )
