"""Operator roles from the hpwsn-* LDAP groups (mirrored as Django groups at login).

admin: everything; operator: topics, policies, subscriptions, pull points, dead letters;
analyst: read-only dashboards and analytics. A local Django superuser counts as an admin.
"""

from __future__ import annotations

from typing import Any

from topics.acl import ADMIN_GROUP, ANONYMOUS, Principal, split_groups

ADMIN = "admin"
OPERATOR = "operator"
ANALYST = "analyst"

ROLE_SUPERUSER = "hpwsn-admins"
# Django group name -> role
ROLE_BY_GROUP: dict[str, str] = {
    "hpwsn-admins": ADMIN,
    "hpwsn-operators": OPERATOR,
    "hpwsn-analysts": ANALYST,
}
ROLE_GROUPS: tuple[str, ...] = tuple(ROLE_BY_GROUP)

# What a role may also do: an admin may do what an operator may, an operator what an analyst may.
_IMPLIED: dict[str, frozenset[str]] = {
    ADMIN: frozenset({ADMIN, OPERATOR, ANALYST}),
    OPERATOR: frozenset({OPERATOR, ANALYST}),
    ANALYST: frozenset({ANALYST}),
}


def user_roles(user: Any) -> set[str]:
    """The roles a user holds, including the ones implied by a higher role; empty when anonymous."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return set()
    roles: set[str] = set()
    if user.is_superuser:
        roles |= _IMPLIED[ADMIN]
    for name in user.groups.values_list("name", flat=True):
        role = ROLE_BY_GROUP.get(name)
        if role:
            roles |= _IMPLIED[role]
    return roles


def has_role(user: Any, role: str) -> bool:
    """True when the user holds the role or a higher one (admin > operator > analyst)."""
    if role not in _IMPLIED:
        raise ValueError(f"unknown role {role!r}")
    return role in user_roles(user)


def principal_of_user(user: Any) -> Principal:
    """The broker-side caller for a Django user (REST, console): its uid and groups.

    Directory logins mirror the person's uid as the user name and its groups as Django groups, so
    the principal owns what the same person makes over SOAP. A local superuser counts as an admin.
    """
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return ANONYMOUS
    names = list(user.groups.values_list("name", flat=True))
    if user.is_superuser:
        names.append(ADMIN_GROUP)
    return Principal(name=user.get_username(), groups=frozenset(split_groups(",".join(names))))
