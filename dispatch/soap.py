"""SOAP edge for publishing: Notify (one-way) and GetCurrentMessage."""

from __future__ import annotations

from dispatch import accept as services
from federation.peers import URN_PREFIX, producer_reserved
from hpwsn import errors, ns, topicexpr, wsn
from hpwsn_site.soapcall import Call, Reply, db
from topics import acl
from topics.selectors import topic_tree, topic_tree_cached, topic_tree_is_fresh
from topics.tree import TopicNode


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
        idempotency_key=call.publish_key,
    )
    return None  # one-way: 202 Accepted once every message is stored


async def notification_message(call: Call) -> Reply | None:
    """The legacy HPwsn form: a bare NotificationMessage inside WsnProcess (thesis figure 5-4)."""
    await services.notifications_accept(
        notifications=_published([wsn.parse_notification_message(call.body)]),
        principal=call.principal,
        idempotency_key=call.publish_key,
    )
    return None


async def _node_of(topic: wsn.TopicRef) -> TopicNode | None:
    """The topic a concrete expression names; None lets the service answer the right fault."""
    try:
        expr = topicexpr.parse(topic.text, topic.dialect, topic.nsmap)
        root_ns, names, any_ns = expr.concrete()
    except (topicexpr.TopicExpressionError, topicexpr.UnknownDialectError):
        return None
    tree = topic_tree_cached()
    if tree is None or not topic_tree_is_fresh():
        tree = await db(topic_tree)
    node = tree.resolve(root_ns, names, any_ns)
    if node is None:
        node = (await db(topic_tree, max_age=0)).resolve(root_ns, names, any_ns)
    return node


async def get_current_message(call: Call) -> Reply:
    topic = wsn.parse_topic_of(call.body)
    node = await _node_of(topic)
    if node is not None:
        # Reading a topic's last message is reading the topic: the subscribe rule applies.
        acl.check_subscribe(node.policy, call.principal, node.path)
    content = await services.current_message_get(topic=topic)
    return Reply(
        ns.action("NotificationProducer", "GetCurrentMessage", response=True),
        wsn.get_current_message_response(content),
    )
