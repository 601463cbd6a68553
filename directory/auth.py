"""Login with an LDAP account (django-auth-ldap), configured from the HPWSN_LDAP_* settings.

The hpwsn-* groups map to roles (directory/roles.py): they set is_superuser / is_staff and are
mirrored as Django groups of the same names at every login, and again, with whether the directory
still knows the person, at a session's requests (DirectoryBackend.get_user). Without a directory
this backend declines and Django's ModelBackend (local users) is the only one left.
"""

from __future__ import annotations

import time
from typing import Any

import ldap
from django.conf import settings
from django.contrib.auth.models import Group
from django_auth_ldap.backend import LDAPBackend, LDAPSettings
from django_auth_ldap.config import GroupOfNamesType, LDAPSearch

from directory.ldapconn import DirectoryUnavailable, person_groups
from directory.roles import ROLE_GROUPS, ROLE_SUPERUSER


class DirectoryBackend(LDAPBackend):
    """django-auth-ldap against HPWSN_LDAP_URL, read when used (not frozen at import)."""

    @property
    def settings(self) -> LDAPSettings:
        if self._settings is None:
            self._settings = LDAPSettings(self.settings_prefix, ldap_auth_settings())
        return self._settings

    @settings.setter
    def settings(self, value: LDAPSettings) -> None:
        self._settings = value

    def authenticate(
        self, request: Any, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> Any:
        if not settings.HPWSN_LDAP_URL:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)

    def get_user(self, user_id: Any) -> Any:
        """The session's user while the directory still knows the person, with the roles of its
        groups now (read again at most every HPWSN_AUTH_CACHE_S): a person removed from the
        directory is logged out of every session at its next request or socket frame, and a role
        given or withdrawn applies without a new login. While the directory cannot be asked, the
        session keeps what it has."""
        if not settings.HPWSN_LDAP_URL:
            return None
        user = super().get_user(user_id)
        if user is None or user.has_usable_password():  # a local account: not the directory's
            return user
        now = time.monotonic()
        checked = _checked.get(user.pk)
        if checked is not None and now - checked < settings.HPWSN_AUTH_CACHE_S:
            return user
        try:
            groups = person_groups(user.get_username())
        except DirectoryUnavailable:
            return user
        if groups is None:
            _checked.pop(user.pk, None)
            return None
        _roles_follow(user, groups)
        if len(_checked) > 10_000:
            _checked.clear()
        _checked[user.pk] = now
        return user


# When this process last found each directory login's person in the directory (by user pk).
_checked: dict[Any, float] = {}


def _roles_follow(user: Any, groups: frozenset[str]) -> None:
    """The user's role groups and flags as its directory groups make them, as at a login."""
    roles = {g for g in ROLE_GROUPS if g in groups}
    held = set(user.groups.filter(name__in=ROLE_GROUPS).values_list("name", flat=True))
    if roles != held:
        user.groups.remove(*Group.objects.filter(name__in=held - roles))
        user.groups.add(*(Group.objects.get_or_create(name=name)[0] for name in roles - held))
    flags = (bool(roles), ROLE_SUPERUSER in roles)
    if (user.is_staff, user.is_superuser) != flags:
        user.is_staff, user.is_superuser = flags
        user.save(update_fields=["is_staff", "is_superuser"])


def ldap_auth_settings() -> dict[str, Any]:
    """django-auth-ldap's settings (without the AUTH_LDAP_ prefix) for the configured directory."""
    groups_dn = settings.HPWSN_LDAP_GROUPS_DN
    timeout = settings.HPWSN_LDAP_TIMEOUT_S
    role_dns = [f"cn={group},{groups_dn}" for group in ROLE_GROUPS]
    return {
        "SERVER_URI": settings.HPWSN_LDAP_URL,
        "BIND_DN": settings.HPWSN_LDAP_BIND_DN,
        "BIND_PASSWORD": settings.HPWSN_LDAP_BIND_PASSWORD,
        "CONNECTION_OPTIONS": {ldap.OPT_NETWORK_TIMEOUT: timeout, ldap.OPT_TIMEOUT: timeout},
        "USER_SEARCH": LDAPSearch(
            settings.HPWSN_LDAP_PEOPLE_DN, ldap.SCOPE_SUBTREE, "(uid=%(user)s)"
        ),
        "USER_ATTR_MAP": {"first_name": "givenName", "last_name": "sn", "email": "mail"},
        "GROUP_SEARCH": LDAPSearch(groups_dn, ldap.SCOPE_SUBTREE, "(objectClass=groupOfNames)"),
        "GROUP_TYPE": GroupOfNamesType(name_attr="cn"),
        "MIRROR_GROUPS": list(ROLE_GROUPS),
        "USER_FLAGS_BY_GROUP": {
            "is_superuser": f"cn={ROLE_SUPERUSER},{groups_dn}",
            "is_staff": role_dns,
        },
        "ALWAYS_UPDATE_USER": True,
        "CACHE_TIMEOUT": 0,
    }
