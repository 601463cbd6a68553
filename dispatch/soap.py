"""SOAP edge for publishing: Notify (one-way) and GetCurrentMessage."""

from __future__ import annotations

from dispatch import services
from hpwsn import ns, wsn
from hpwsn_site.soapcall import Call, Reply


async def notify(call: Call) -> Reply | None:
    await services.notifications_accept(notifications=wsn.parse_notify(call.body))
    return None  # one-way: 202 Accepted once every message is stored


async def notification_message(call: Call) -> Reply | None:
    """The legacy HPwsn form: a bare NotificationMessage inside WsnProcess (thesis figure 5-4)."""
    await services.notifications_accept(notifications=[wsn.parse_notification_message(call.body)])
    return None


async def get_current_message(call: Call) -> Reply:
    content = await services.current_message_get(topic=wsn.parse_topic_of(call.body))
    return Reply(
        ns.action("NotificationProducer", "GetCurrentMessage", response=True),
        wsn.get_current_message_response(content),
    )
