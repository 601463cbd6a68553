"""Who may use which part of /api/v1/: the console's roles, and the per-object rule.

Roles come from the directory groups, as in the console: hpwsn-admins (everything), hpwsn-operators
(change topics, subscriptions, pull points, dead letters, consumer limits), hpwsn-analysts (read
everything). Publishing and subscribing need no role: the topics' ACLs decide, inside the same
services the SOAP edge calls.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework import permissions
from rest_framework.request import Request

from hpwsn_site.api.auth import ANALYST_GROUP, OPERATOR_GROUP, principal_of
from subscriptions.models import PublisherRegistration, PullPoint, Subscription
from subscriptions.registrations import registration_authorize
from subscriptions.selectors import resource_tag
from subscriptions.services import pull_point_authorize
from subscriptions.services import subscription_authorize as subscription_authorize_soap
from topics.acl import ADMIN_GROUP, Principal


def is_operator(principal: Principal) -> bool:
    return not principal.groups.isdisjoint({ADMIN_GROUP, OPERATOR_GROUP})


def is_analyst(principal: Principal) -> bool:
    return is_operator(principal) or ANALYST_GROUP in principal.groups


class OperatorsWriteAnalystsRead(permissions.BasePermission):
    """Reads for analysts and above, writes for operators and admins."""

    message = "this part of the API is for the hpwsn-analysts (read) and hpwsn-operators groups"

    def has_permission(self, request: Request, view: Any) -> bool:
        principal = principal_of(request)
        if request.method in permissions.SAFE_METHODS:
            return is_analyst(principal)
        return is_operator(principal)


class Authenticated(permissions.BasePermission):
    """Any principal but the anonymous one: the default of every view (settings.REST_FRAMEWORK),
    so that a view added without a thought for who may call it is closed, not open."""

    message = "authenticate with an API token, HTTP Basic or the console's session"

    def has_permission(self, request: Request, view: Any) -> bool:
        return not principal_of(request).anonymous


class PolicyDecides(permissions.AllowAny):
    """Anonymous callers reach the view, and the rule of what they ask decides, as on the SOAP
    edge: a topic's policy for publishing and subscribing, the owner rule (below) for a
    subscription, pull point or registration."""


# ----------------------------------------------------------------------------- per object
# The ONE place where REST decides who may act on a given subscription or pull point: the rule
# SOAP applies (topics.acl.may_act_on, through subscriptions.services): its owner, admins and
# operators. Analysts may read any; lists show the roles everything and others what they own.


def subscription_authorize(
    *,
    principal: Principal,
    subscription: Subscription | PullPoint | PublisherRegistration,
    operation: str,
) -> None:
    """Raise NotAuthorized unless `principal` may do `operation` on this subscription, pull point
    or publisher registration.

    `operation`: read, renew, pause, resume, delete, pull, destroy.
    """
    if operation == "read" and is_analyst(principal):
        return
    if isinstance(subscription, PublisherRegistration):
        registration_authorize(principal=principal, registration=subscription, operation=operation)
    elif isinstance(subscription, PullPoint):
        pull_point_authorize(principal=principal, pull_point=subscription, operation=operation)
    else:
        subscription_authorize_soap(
            principal=principal, subscription=subscription, operation=operation
        )


def subscriptions_visible(*, principal: Principal, queryset: QuerySet[Any]) -> QuerySet[Any]:
    """The subscriptions (pull points, registrations) a principal may list: all for the roles,
    else its own."""
    if is_analyst(principal):
        return queryset
    if principal.anonymous:
        return queryset.none()
    return queryset.filter(owner__iexact=principal.owner)


# ----------------------------------------------------------------------------- what analysts see
# A subscription's, pull point's or registration's id is in the address that renews, ends or
# reads it, and what an anonymous caller made, anyone holding the id may act on. Analysts read
# everything but act on nothing of others', so they see what others made as the console shows it
# to them (docs/console.md): a tag instead of the id, a consumer's host:port instead of an address.


def shows_tags(principal: Principal) -> bool:
    """Whether the principal is an analyst only (no operator, no admin)."""
    return ANALYST_GROUP in principal.groups and not is_operator(principal)


def reveals(*, principal: Principal, owner: str) -> bool:
    """Whether the principal sees the ids and addresses of what this owner made."""
    return not shows_tags(principal) or owner.casefold() == principal.owner.casefold()


def tagged(resource_id: object) -> str:
    """What analysts see instead of an id: `#` and the resource's tag."""
    return "#" + resource_tag(str(resource_id))
