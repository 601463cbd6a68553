"""What read-only console users see instead of the addresses that act on a resource.

A subscription's or pull point's id is in its address, and its address renews, ends or reads
it: analysts see its tag (subscriptions.selectors.resource_tag, the label /metrics uses) and a
consumer's host:port (the label of the consumer figures) instead.
"""

from __future__ import annotations

from django import template

from monitoring.counters import consumer_label
from subscriptions.selectors import resource_tag

register = template.Library()


@register.filter
def tag(resource_id: object) -> str:
    return resource_tag(str(resource_id))


@register.filter
def host(address: object) -> str:
    return consumer_label(str(address or ""))
