"""Login with an LDAP account (django-auth-ldap), configured from the HPWSN_LDAP_* settings.

The hpwsn-* groups map to roles (directory/roles.py): they set is_superuser / is_staff and are
mirrored as Django groups of the same names at every login, so a group change in the directory
takes effect at the user's next login. Without a directory this backend declines and Django's
ModelBackend (local users) is the only one left.
"""

from __future__ import annotations

from typing import Any

import ldap
from django.conf import settings
from django_auth_ldap.backend import LDAPBackend, LDAPSettings
from django_auth_ldap.config import GroupOfNamesType, LDAPSearch

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
        if not settings.HPWSN_LDAP_URL:
            return None
        return super().get_user(user_id)


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
