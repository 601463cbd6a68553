"""SOAP edge for publishing: Notify (one-way) and GetCurrentMessage."""

from __future__ import annotations

from dispatch import accept as services
from federation.peers import URN_PREFIX, producer_reserved
from hpwsn import errors, ns, wsn
from hpwsn_site.soapcall import Call, Reply


def _published(notifications: list[wsn.NotificationIn]) -> list[wsn.NotificationIn]:
    for n in notifications:
        address = producer_reserved(n)
        if address is not None:
            raise errors.WsnError(
                f"ProducerReference '{address[:200]}' refused: addresses under "
                f"{URN_PREFIX} are written by the sites of a federation only"
            )
    return notifications


async def notify(call: Call) -> Reply | None:
    await services.notifications_accept(
        notifications=_published(wsn.parse_notify(call.body)),
        principal=call.principal,
        client=call.client,
        idempotency_key=call.publish_key,
    )
    return None  # one-way: 202 Accepted once every message is stored


async def notification_message(call: Call) -> Reply | None:
    """The legacy HPwsn form: a bare NotificationMessage inside WsnProcess (thesis figure 5-4)."""
    await services.notifications_accept(
        notifications=_published([wsn.parse_notification_message(call.body)]),
        principal=call.principal,
        client=call.client,
        idempotency_key=call.publish_key,
    )
    return None


async def get_current_message(call: Call) -> Reply:
    content = await services.current_message_get(
        topic=wsn.parse_topic_of(call.body), principal=call.principal
    )
    return Reply(
        ns.action("NotificationProducer", "GetCurrentMessage", response=True),
        wsn.get_current_message_response(content),
    )
