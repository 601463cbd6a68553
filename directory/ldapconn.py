"""Connections to the LDAP directory as the broker (settings HPWSN_LDAP_*)."""

from __future__ import annotations

from typing import Any

import ldap
from django.conf import settings
from ldap.filter import escape_filter_chars

from topics.acl import directory_groups


class DirectoryUnavailable(Exception):
    """The directory is not configured, cannot be reached, or refused the broker's bind."""


def directory_configured() -> bool:
    return bool(settings.HPWSN_LDAP_URL)


def directory_open(*, timeout: float | None = None) -> Any:
    """A python-ldap connection to HPWSN_LDAP_URL with the broker's timeouts, not yet bound."""
    seconds = settings.HPWSN_LDAP_TIMEOUT_S if timeout is None else timeout
    conn = ldap.initialize(settings.HPWSN_LDAP_URL)
    conn.set_option(ldap.OPT_PROTOCOL_VERSION, ldap.VERSION3)
    conn.set_option(ldap.OPT_REFERRALS, 0)
    conn.set_option(ldap.OPT_NETWORK_TIMEOUT, seconds)
    conn.set_option(ldap.OPT_TIMEOUT, seconds)
    return conn


def directory_connect(*, timeout: float | None = None) -> Any:
    """A python-ldap connection bound as the broker (HPWSN_LDAP_BIND_DN), with timeouts.

    Raises DirectoryUnavailable when no directory is configured or it cannot be reached; the
    caller closes the connection with `unbind_s()`.
    """
    if not directory_configured():
        raise DirectoryUnavailable("no directory configured (HPWSN_LDAP_URL / LDAP_URL is empty)")
    if not settings.HPWSN_LDAP_BIND_PASSWORD:
        # An empty password makes an LDAP simple bind anonymous: the broker would see an empty
        # directory instead of an error.
        raise DirectoryUnavailable("HPWSN_LDAP_BIND_PASSWORD is empty: the broker cannot bind")
    conn = directory_open(timeout=timeout)
    try:
        conn.simple_bind_s(settings.HPWSN_LDAP_BIND_DN, settings.HPWSN_LDAP_BIND_PASSWORD)
    except ldap.INVALID_CREDENTIALS as exc:
        raise DirectoryUnavailable(
            f"the directory refused the broker's bind as {settings.HPWSN_LDAP_BIND_DN}"
        ) from exc
    except ldap.LDAPError as exc:
        raise DirectoryUnavailable(
            f"directory {settings.HPWSN_LDAP_URL}: {describe_error(exc)}"
        ) from exc
    return conn


def describe_error(exc: BaseException) -> str:
    """python-ldap's {'desc', 'info'} error as text."""
    info = exc.args[0] if exc.args else {}
    if isinstance(info, dict):
        return str(info.get("desc", "")) + (f" ({info['info']})" if info.get("info") else "")
    return str(exc)


def person_groups(uid: str) -> frozenset[str] | None:
    """The groups of the person uid=`uid` under HPWSN_LDAP_PEOPLE_DN, None when the directory
    knows no such person (or more than one); DirectoryUnavailable when it cannot be asked."""
    conn = directory_connect()
    try:
        people = [
            dn
            for dn, _a in conn.search_s(
                settings.HPWSN_LDAP_PEOPLE_DN,
                ldap.SCOPE_SUBTREE,
                f"(uid={escape_filter_chars(uid)})",
                ["uid"],
            )
            if dn
        ]
        if len(people) != 1:
            return None
        found = conn.search_s(
            settings.HPWSN_LDAP_GROUPS_DN,
            ldap.SCOPE_SUBTREE,
            f"(&(objectClass=groupOfNames)(member={escape_filter_chars(people[0])}))",
            ["cn"],
        )
        return directory_groups((a.get("cn") or [b""])[0].decode() for d, a in found if d)
    except ldap.LDAPError as exc:
        raise DirectoryUnavailable(f"directory search failed: {describe_error(exc)}") from None
    finally:
        conn.unbind_s()
