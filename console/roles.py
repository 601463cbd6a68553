"""Who may use the console: the roles of the hpwsn-* directory groups (directory/roles.py).

Admins and operators change topics, policies, subscriptions and pull points; analysts read.
"""

from __future__ import annotations

from typing import Any

from directory.roles import ADMIN, ANALYST, OPERATOR, has_role, user_roles


def can_view(user: Any) -> bool:
    return has_role(user, ANALYST)


def can_change(user: Any) -> bool:
    return has_role(user, OPERATOR)


def role_label(user: Any) -> str:
    """The user's highest role, as the console's header shows it."""
    roles = user_roles(user)
    return next((role for role in (ADMIN, OPERATOR, ANALYST) if role in roles), "")
