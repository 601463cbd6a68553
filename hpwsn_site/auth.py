"""Who is calling the SOAP endpoint: credentials checked against the LDAP directory.

A wsse:UsernameToken (PasswordText or PasswordDigest) or HTTP Basic names a person under
ou=people by uid. A text password is checked by a simple bind as that person; a digest against
the person's hpwsnDigestSecret, which only the broker's bind DN may read. The principal's groups
are the groupOfNames under ou=groups that list the person as a member.

Publishing must stay fast, so a verified principal is kept in this process for
HPWSN_AUTH_CACHE_S (text and Basic: keyed by a salted hash of the credentials; digest: the
person's secret and groups by user name, since every digest token differs). Within that time no
request reaches the directory; a password or group change takes effect when the entry expires.
Refusals are remembered for two seconds only, so a mistyped password costs a retry, not a
lock-out. When the directory cannot be reached, a principal verified in the last
HPWSN_AUTH_STALE_S is still accepted (the broker keeps serving from what it knows).
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import ldap
from asgiref.sync import sync_to_async
from django.conf import settings
from ldap.filter import escape_filter_chars
from lxml import etree
from redis.exceptions import RedisError

from directory.ldapconn import DirectoryUnavailable, directory_connect, directory_open
from hpwsn import wssecurity
from hpwsn.soap import SoapFault, security_fault
from hpwsn.wssecurity import Credentials, SecurityFault
from hpwsn_site import state
from topics.acl import ANONYMOUS, Principal, directory_groups

log = logging.getLogger(__name__)

NONCE_PREFIX = state.PREFIX + "wsse:nonce:"
REFUSAL_S = 2.0  # how long refused credentials are answered without asking the directory
CLEAN_S = 1.0  # how long a failed-login window read with no failure is not read again (_guessing)
# How long a directory that did not answer is taken as down: requests meanwhile are answered at
# once (from the cache when they may be), not after another connection timeout each.
DIRECTORY_RETRY_S = 5.0
MAX_ENTRIES = 10_000


def cache_s() -> float:
    return float(settings.HPWSN_AUTH_CACHE_S)


def stale_s() -> float:
    return float(settings.HPWSN_AUTH_STALE_S)


def token_max_age_s() -> float:
    return float(settings.HPWSN_WSSE_MAX_AGE_S)


def token_max_skew_s() -> float:
    return float(settings.HPWSN_WSSE_MAX_SKEW_S)


@dataclass(slots=True)
class _Verified:
    principal: Principal
    secret: str | None  # hpwsnDigestSecret (digest entries only)
    at: float  # time.monotonic() of the directory check


class _Cache:
    """Verified principals and recent refusals of this process (the event loop's thread only)."""

    def __init__(self) -> None:
        self.salt = secrets.token_bytes(16)
        self.by_credentials: dict[bytes, _Verified] = {}
        self.by_user: dict[str, _Verified] = {}  # digest secrets, by user name
        self.refused: dict[bytes, float] = {}
        # (client address, user name) -> until when its credentials are refused unchecked: it
        # failed HPWSN_LOGIN_THROTTLE's number of times in the window (_failure_counted).
        self.guessing: dict[tuple[str, str], float] = {}
        # (client address, user name) -> until when its shared window, read with no failure in
        # it, is not read again (CLEAN_S): a failure anywhere since may be missed that long.
        self.clean: dict[tuple[str, str], float] = {}
        self.directory_down_until = 0.0

    def clear(self) -> None:
        self.by_credentials.clear()
        self.by_user.clear()
        self.refused.clear()
        self.guessing.clear()
        self.clean.clear()
        self.directory_down_until = 0.0

    def is_guessing(self, pair: tuple[str, str]) -> bool:
        until = self.guessing.get(pair)
        if until is None:
            return False
        if until < time.monotonic():
            del self.guessing[pair]
            return False
        return True

    def put(self, table: dict[Any, _Verified], key: Any, entry: _Verified) -> None:
        if len(table) >= MAX_ENTRIES:
            table.clear()
        table[key] = entry

    def refuse(self, key: bytes) -> None:
        if len(self.refused) >= MAX_ENTRIES:
            self.refused.clear()
        self.refused[key] = time.monotonic() + REFUSAL_S

    def is_refused(self, key: bytes) -> bool:
        until = self.refused.get(key)
        if until is None:
            return False
        if until < time.monotonic():
            del self.refused[key]
            return False
        return True


_cache = _Cache()


def cache_clear() -> None:
    """Forget every verified principal (tests, and after a directory change that must apply now)."""
    _cache.clear()


# ----------------------------------------------------------------------------- the directory


class DirectoryDown(Exception):
    """The directory did not answer (unreachable, timed out, or refused the broker)."""


def _first(attrs: dict[str, list[bytes]], name: str) -> str | None:
    values = attrs.get(name) or []
    return values[0].decode() if values else None


def directory_verify(credentials: Credentials) -> tuple[Principal, str | None] | None:
    """Check credentials against the directory: (principal, digest secret), or None if refused.

    A text password is checked by a bind; a digest is left to the caller, who compares it with
    the secret returned (and keeps the secret for the next tokens). Blocking (python-ldap);
    raises DirectoryDown when the directory cannot answer.
    """
    try:
        broker = directory_connect()
    except DirectoryUnavailable as exc:
        raise DirectoryDown(str(exc)) from None
    try:
        found = [
            (dn, attrs)
            for dn, attrs in broker.search_s(
                settings.HPWSN_LDAP_PEOPLE_DN,
                ldap.SCOPE_SUBTREE,
                f"(uid={escape_filter_chars(credentials.username)})",
                ["uid", "hpwsnDigestSecret"],
            )
            if dn
        ]
        if len(found) != 1:
            return None
        dn, attrs = found[0]
        secret = _first(attrs, "hpwsnDigestSecret")
        if credentials.is_digest:
            if not secret:
                return None
        elif not _bind_as(dn, credentials.password):
            return None
        groups = broker.search_s(
            settings.HPWSN_LDAP_GROUPS_DN,
            ldap.SCOPE_SUBTREE,
            f"(&(objectClass=groupOfNames)(member={escape_filter_chars(dn)}))",
            ["cn"],
        )
        principal = Principal(
            name=_first(attrs, "uid") or credentials.username,
            groups=directory_groups(_first(a, "cn") or "" for d, a in groups if d),
            method=credentials.method,
        )
        return principal, secret
    except ldap.LDAPError as exc:
        raise DirectoryDown(f"directory search failed: {exc}") from None
    finally:
        broker.unbind_s()


def _bind_as(dn: str, password: str) -> bool:
    # An empty password would make a simple bind "unauthenticated" and succeed (RFC 4513 5.1.2).
    if not password:
        return False

    conn = directory_open()
    try:
        conn.simple_bind_s(dn, password)
        return True
    except ldap.INVALID_CREDENTIALS:
        return False
    except ldap.LDAPError as exc:
        raise DirectoryDown(f"bind as {dn} failed: {exc}") from None
    finally:
        conn.unbind_s()


async def _ask_directory(credentials: Credentials) -> tuple[Principal, str | None] | None:
    if _cache.directory_down_until > time.monotonic():
        raise DirectoryDown("the directory did not answer a moment ago")
    try:
        return await sync_to_async(directory_verify, thread_sensitive=False)(credentials)
    except DirectoryDown:
        _cache.directory_down_until = time.monotonic() + DIRECTORY_RETRY_S
        raise


# ----------------------------------------------------------------------------- verification


def _unavailable(exc: Exception) -> SoapFault:
    log.warning("credentials cannot be verified: %s", exc)
    return SoapFault(
        "the directory is unavailable; credentials cannot be verified now",
        code="Receiver",
        http_status=503,
    )


async def _verify_password(credentials: Credentials) -> Principal:
    key = credentials.cache_key(_cache.salt)
    entry = _cache.by_credentials.get(key)
    now = time.monotonic()
    if entry is not None and now - entry.at < cache_s():
        return entry.principal
    if _cache.is_refused(key):
        raise wssecurity.failed(f"authentication failed for '{credentials.username}'")
    try:
        verified = await _ask_directory(credentials)
    except DirectoryDown as exc:
        if entry is not None and now - entry.at < stale_s():
            return entry.principal
        raise _unavailable(exc) from None
    if verified is None:
        _cache.by_credentials.pop(key, None)
        _cache.refuse(key)
        raise wssecurity.failed(f"authentication failed for '{credentials.username}'")
    _cache.put(_cache.by_credentials, key, _Verified(verified[0], None, now))
    return verified[0]


async def _verify_digest(credentials: Credentials) -> Principal:
    assert credentials.created is not None
    wssecurity.check_created(
        credentials.created,
        now=datetime.now(UTC),
        max_age_s=token_max_age_s(),
        max_skew_s=token_max_skew_s(),
    )
    user = credentials.username
    entry = _cache.by_user.get(user)
    age = time.monotonic() - entry.at if entry is not None else None
    # The directory is asked when the user's secret is unknown or old, or when a digest does
    # not match a secret fetched more than REFUSAL_S ago (it may have changed since); wrong
    # digests in between are refused from the cache, so they cannot flood the directory.
    matches = entry is not None and wssecurity.digest_matches(credentials, entry.secret or "")
    if age is None or age >= cache_s() or (not matches and age >= REFUSAL_S):
        unknown_key = b"digest\0" + user.encode()
        if entry is None and _cache.is_refused(unknown_key):
            raise wssecurity.failed(f"authentication failed for '{user}'")
        try:
            verified = await _ask_directory(credentials)
        except DirectoryDown as exc:
            if not (matches and age is not None and age < stale_s()):
                raise _unavailable(exc) from None
        else:
            if verified is None:  # no such user, or one without a digest secret
                _cache.by_user.pop(user, None)
                _cache.refuse(unknown_key)
                raise wssecurity.failed(f"authentication failed for '{user}'") from None
            entry = _Verified(verified[0], verified[1], time.monotonic())
            _cache.put(_cache.by_user, user, entry)
            matches = wssecurity.digest_matches(credentials, entry.secret or "")
    if not matches or entry is None:
        raise wssecurity.failed(f"authentication failed for '{user}'")
    await _check_nonce(credentials, entry.principal)
    return entry.principal


async def _check_nonce(credentials: Credentials, principal: Principal) -> None:
    """A nonce is accepted once while its Created time is acceptable (replay protection).

    Keyed on the uid the directory returned, not the user name as sent: the directory matches
    uids case-insensitively, so `ALICE` is alice, and the same token resent under another
    spelling is the same replay.
    """
    if credentials.nonce is None:
        return
    ttl = token_max_age_s() + token_max_skew_s()
    key = wssecurity.nonce_key(NONCE_PREFIX, uid=principal.name or "", nonce=credentials.nonce)
    if not await wssecurity.nonce_first_use(state.get_async_redis(), key, ttl_s=ttl):
        raise wssecurity.failed("the UsernameToken's nonce was already used (a replayed message)")


async def _guessing(pair: tuple[str, str]) -> bool:
    """The pair's failures reached HPWSN_LOGIN_THROTTLE in this window: counted here, or by
    another process or at a login form (the shared window is read, then remembered here until
    it ends). Without Redis, what this process counted.

    A window read with no failure in it is not read again for CLEAN_S: a caller whose
    credentials never fail (a publisher) costs a Redis read a second, not one a call. A guesser
    who reaches the limit elsewhere within that second gets one more guess checked here at
    most: its failure is counted at once, and its count refuses the next."""
    if _cache.is_guessing(pair):
        return True
    now = time.monotonic()
    if _cache.clean.get(pair, 0.0) > now:
        return False
    window = state.login_window(*pair)
    if window is None:
        return False
    try:
        failures = await window.afailures()
    except RedisError:
        return False
    if failures >= window.limit:
        _guessing_until(pair, window)
        return True
    if failures == 0:
        if len(_cache.clean) >= MAX_ENTRIES:
            _cache.clean.clear()
        _cache.clean[pair] = now + CLEAN_S
    return False


def _guessing_until(pair: tuple[str, str], window: state.LoginWindow) -> None:
    if len(_cache.guessing) >= MAX_ENTRIES:
        _cache.guessing.clear()
    _cache.guessing[pair] = time.monotonic() + window.ends_in


async def _failure_counted(pair: tuple[str, str]) -> None:
    """Count failed credentials of a client address and user name, in the window the login
    forms count theirs in (state.login_window); past the limit this process refuses the pair
    unchecked until the window ends. Without Redis, nothing is counted."""
    window = state.login_window(*pair)
    if window is None:
        return
    _cache.clean.pop(pair, None)
    try:
        failures = await window.afailed()
    except RedisError:
        return
    if failures >= window.limit:
        _guessing_until(pair, window)


async def authenticate(
    *, security: etree._Element | None, authorization: str | None, client: str
) -> Principal:
    """The caller of a SOAP request: ANONYMOUS without credentials; a SoapFault when refused.

    A wsse:UsernameToken is used when present; otherwise HTTP Basic. Refused Basic credentials
    are answered with HTTP 401 and WWW-Authenticate; refused tokens with the SOAP fault's usual
    status (500 for SOAP 1.1, 400 for SOAP 1.2). `client`, the caller's address: a user name
    that failed HPWSN_LOGIN_THROTTLE's number of times from it is refused, its password
    unchecked, until the window ends (password guessing over SOAP and REST Basic, as at the
    login forms).
    """
    if security is None and not authorization:
        return ANONYMOUS
    basic = False
    pair: tuple[str, str] | None = None
    try:
        credentials = None
        if security is not None:
            credentials = wssecurity.parse_security_header(security)
        if credentials is None:
            basic = True
            credentials = wssecurity.parse_basic(authorization)
        if credentials is None:
            return ANONYMOUS
        if not settings.HPWSN_LDAP_URL:
            raise wssecurity.failed("no directory is configured: credentials cannot be checked")
        pair = (client, credentials.username.strip().lower())
        if await _guessing(pair):
            raise wssecurity.failed(f"authentication failed for '{credentials.username}'")
        if credentials.is_digest:
            return await _verify_digest(credentials)
        if credentials.created is not None:
            wssecurity.check_created(
                credentials.created,
                now=datetime.now(UTC),
                max_age_s=token_max_age_s(),
                max_skew_s=token_max_skew_s(),
            )
        principal = await _verify_password(credentials)
        await _check_nonce(credentials, principal)
        return principal
    except SecurityFault as exc:
        if pair is not None and exc.code == "FailedAuthentication":
            await _failure_counted(pair)
        raise security_fault(exc.code, exc.message, http_status=401 if basic else None) from None
