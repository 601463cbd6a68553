"""Fan-out's side of SQL-like filters: a notification as filters read it, and who it reaches.

The fan-out (dispatch/fanout.py) finds the filter indexes of the subscriptions whose topic
expressions cover a message (SubscriptionIndex.filter_groups), then asks here which of their
subscriptions take it. The message is parsed once per fan-out batch and shared with XPath filters.
"""

from __future__ import annotations

from typing import Protocol

from lxml import etree

from hpwsn import ns
from hpwsn.sqlfilter import Message, message_of
from subscriptions.filterindex import FilterIndex
from subscriptions.selectors import SubEntry

_PRODUCER = f"{{{ns.WSNT}}}ProducerReference/{{{ns.WSA}}}Address"


class Notification(Protocol):
    """What the fan-out knows of a message before reading its body."""

    path: str
    priority: int
    accepted_at: float  # epoch seconds
    payload: bytes | None  # the stored notification (Topic, ProducerReference, Message)


def message_view(n: Notification, element: etree._Element | None) -> Message:
    """The notification with its $ properties; `element` is its wsnt:Message (or None)."""
    producer = None
    if element is not None:
        parent = element.getparent()
        found = parent.findtext(_PRODUCER) if parent is not None else None
        producer = found.strip() if found else None
    return message_of(
        element,
        properties={
            "$topic": n.path,
            "$producer": producer,
            "$priority": n.priority,
            "$publishTime": int(n.accepted_at * 1000),
            "$size": len(n.payload) if n.payload is not None else None,
        },
    )


def sql_matching(groups: list[FilterIndex[SubEntry]], message: Message) -> list[SubEntry]:
    """The subscriptions of these filter indexes whose SQL-like filters the message satisfies."""
    if len(groups) == 1:
        return groups[0].matching(message)
    return [e for g in groups for e in g.matching(message)]
