"""SOAP edge for subscriptions and pull points: parse, call one service, shape the reply.

Subscribe is checked against the topics' policies (topics.acl). A subscription or pull point
belongs to the principal that created it: the other operations pass the caller to the service,
which refuses anyone but its owner, hpwsn-admins and hpwsn-operators
(subscriptions.services.subscription_authorize).
"""

from __future__ import annotations

from django.utils import timezone

from hpwsn import errors, ns, wsn
from hpwsn_site.soapcall import Call, Reply, db
from subscriptions import registrations, services
from subscriptions.filters import parameters_from_texts


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
        client=call.client,
        producer=s.producer_properties,
        filter_parameters=parameters_from_texts(s.filter_parameters),
        format=s.push_format,
        interest_path=s.interest_path,
        site_peers=s.site_peers,
    )
    body = wsn.subscribe_response(sub.reference_address, timezone.now(), sub.termination_time)
    return Reply(ns.action("NotificationProducer", "Subscribe", response=True), body)


async def renew(call: Call) -> Reply:
    resource = _sub_id(call)
    termination = wsn.parse_termination_time(call.body)
    try:
        sub = await db(
            services.subscription_renew,
            subscription_id=resource,
            termination_time=termination,
            principal=call.principal,
        )
    except errors.ResourceUnknown:
        # The same operation renews a publisher registration (its address ends in its random id).
        if call.req.to and "/registrations/" not in call.req.to:
            raise
        reg = await db(
            registrations.registration_renew,
            registration_id=resource,
            termination_time=termination,
            principal=call.principal,
        )
        body = wsn.renew_response(timezone.now(), reg.termination_time)
        return Reply(ns.action("SubscriptionManager", "Renew", response=True), body)
    body = wsn.renew_response(timezone.now(), sub.termination_time)
    return Reply(ns.action("SubscriptionManager", "Renew", response=True), body)


async def unsubscribe(call: Call) -> Reply:
    await db(services.subscription_delete, subscription_id=_sub_id(call), principal=call.principal)
    return Reply(
        ns.action("SubscriptionManager", "Unsubscribe", response=True),
        wsn.empty_response("UnsubscribeResponse"),
    )


async def pause(call: Call) -> Reply:
    await db(
        services.subscription_set_state,
        subscription_id=_sub_id(call),
        paused=True,
        principal=call.principal,
    )
    return Reply(
        ns.action("PausableSubscriptionManager", "PauseSubscription", response=True),
        wsn.empty_response("PauseSubscriptionResponse"),
    )


async def resume(call: Call) -> Reply:
    await db(
        services.subscription_set_state,
        subscription_id=_sub_id(call),
        paused=False,
        principal=call.principal,
    )
    return Reply(
        ns.action("PausableSubscriptionManager", "ResumeSubscription", response=True),
        wsn.empty_response("ResumeSubscriptionResponse"),
    )


def _reg_id(call: Call) -> str:
    rid = call.resource_from_to("registrations")
    if not rid:
        raise errors.ResourceUnknown("the request does not address a registration (wsa:To)")
    return rid


async def register_publisher(call: Call) -> Reply:
    r = wsn.parse_register_publisher(call.body)
    reg = await db(
        registrations.registration_create,
        publisher_address=r.publisher_address,
        topics=r.topics,
        demand=r.demand,
        initial_termination_time=r.initial_termination_time,
        base_url=call.base_url,
        principal=call.principal,
        client=call.client,
    )
    # ConsumerReference: where the publisher sends its Notify messages, this endpoint.
    body = wsn.register_publisher_response(reg.reference_address, f"{call.base_url}/wsn/")
    return Reply(
        ns.action("RegisterPublisher", "RegisterPublisher", response=True, base=ns.BRW), body
    )


async def destroy_registration(call: Call) -> Reply:
    await db(
        registrations.registration_destroy,
        registration_id=_reg_id(call),
        principal=call.principal,
    )
    return Reply(
        ns.action(
            "PublisherRegistrationManager", "DestroyRegistration", response=True, base=ns.BRW
        ),
        wsn.destroy_registration_response(),
    )


async def create_pull_point(call: Call) -> Reply:
    pp = await db(
        services.pull_point_create,
        base_url=call.base_url,
        principal=call.principal,
        client=call.client,
    )
    return Reply(
        ns.action("CreatePullPoint", "CreatePullPoint", response=True),
        wsn.create_pull_point_response(pp.address),
    )


async def get_messages(call: Call) -> Reply:
    body = await db(
        services.pull_point_get_messages,
        pull_point_id=_pp_id(call),
        maximum=wsn.parse_maximum_number(call.body),
        render=lambda items: wsn.get_messages_response([(a or None, p) for a, p in items]),
        principal=call.principal,
        request_id=call.req.message_id,
    )
    return Reply(ns.action("PullPoint", "GetMessages", response=True), body)


async def destroy_pull_point(call: Call) -> Reply:
    await db(services.pull_point_destroy, pull_point_id=_pp_id(call), principal=call.principal)
    return Reply(
        ns.action("PullPoint", "DestroyPullPoint", response=True),
        wsn.empty_response("DestroyPullPointResponse"),
    )
