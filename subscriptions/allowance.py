"""Whose allowance a new subscription, pull point or publisher registration counts against.

A principal holds at most HPWSN_MAX_SUBSCRIPTIONS_PER_OWNER subscriptions,
HPWSN_MAX_PULLPOINTS_PER_OWNER pull points and HPWSN_MAX_REGISTRATIONS_PER_OWNER registrations.
Every anonymous caller has the same owner ("anonymous"), so counted by owner alone one of them
could use up the allowance of all the others; an anonymous caller's allowance is therefore
counted per client address (hpwsn_site.clients.client_address), recorded on what it creates.
The owner stays "anonymous": who may act on a resource does not change (topics.acl.may_act_on).
"""

from __future__ import annotations

from typing import TypeVar

from django.db.models import Model, QuerySet

from subscriptions.models import CLIENT_ADDRESS_MAX
from topics import acl

M = TypeVar("M", bound=Model)


def created_from(*, principal: acl.Principal, client: str) -> str:
    """The client address recorded on what the principal creates: an anonymous caller's, else
    "" (an authenticated principal's allowance is its own, wherever it calls from)."""
    if not principal.anonymous:
        return ""
    return client.strip()[:CLIENT_ADDRESS_MAX]


def allowance_key(*, principal: acl.Principal, client: str) -> str:
    """One allowance's name: the owner, or for an anonymous caller the owner and its address.
    Never another principal's: a directory user's owner is `user:<uid>` (topics.acl)."""
    if not principal.anonymous:
        return principal.owner
    return f"{principal.owner}@{created_from(principal=principal, client=client)}"


def held_by(queryset: QuerySet[M], *, principal: acl.Principal, client: str) -> QuerySet[M]:
    """The rows of `queryset` that count against the caller's allowance. An anonymous caller
    without a known address (and what anonymous callers made before addresses were recorded)
    shares one allowance, as every anonymous caller once did."""
    held = queryset.filter(owner=principal.owner)
    if principal.anonymous:
        held = held.filter(created_from=created_from(principal=principal, client=client))
    return held
