"""Who calls /api/v1/: an API token, HTTP Basic against the directory, or the console's session.

Every way ends in the same `topics.acl.Principal` the SOAP edge uses (a name and its directory
groups), so the per-topic ACLs and the roles (hpwsn-admins, -operators, -analysts) are judged by
the same rules. A token names its principal only; the principal's groups are looked up when it is
used (kept HPWSN_AUTH_CACHE_S in this process, HPWSN_AUTH_STALE_S while the directory is down),
so a group change in the directory reaches tokens as it reaches SOAP callers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from directory.ldapconn import DirectoryUnavailable, person_groups
from hpwsn.soap import SoapFault
from hpwsn_site import auth as soap_auth
from hpwsn_site.api.exceptions import ServiceUnavailable
from hpwsn_site.api.models import ApiToken
from hpwsn_site.api.selectors import api_token_lookup
from hpwsn_site.api.services import TOKEN_PREFIX, token_digest
from hpwsn_site.clients import request_client
from topics.acl import ADMIN_GROUP, ANONYMOUS, Principal, split_groups

OPERATOR_GROUP = "hpwsn-operators"
ANALYST_GROUP = "hpwsn-analysts"


@dataclass(frozen=True, slots=True)
class ApiUser:
    """request.user of an authenticated API call."""

    principal: Principal
    via: str  # token, basic, session
    token_id: int | None = None

    is_authenticated = True
    is_anonymous = False
    is_active = True

    @property
    def username(self) -> str:
        return self.principal.name or ""

    @property
    def pk(self) -> str:  # what DRF's throttles and logs use to tell callers apart
        return self.username

    def __str__(self) -> str:
        return self.username


def principal_of(request: Request | Any) -> Principal:
    """The acl.Principal of a request (ANONYMOUS without credentials)."""
    user = getattr(request, "user", None)
    return user.principal if isinstance(user, ApiUser) else ANONYMOUS


# ----------------------------------------------------------------------------- groups of a name

_groups: dict[str, tuple[float, frozenset[str]]] = {}


def _directory_groups(name: str) -> frozenset[str] | None:
    """The groups of uid=name in the directory; None when there is no such person."""
    try:
        return person_groups(name)
    except DirectoryUnavailable as exc:
        raise soap_auth.DirectoryDown(str(exc)) from None


def _local_groups(name: str) -> frozenset[str] | None:
    """Without a directory: a local Django user's groups (a superuser is an admin)."""
    user = get_user_model().objects.filter(username=name, is_active=True).first()
    if user is None:
        return None
    groups = set(split_groups(",".join(user.groups.values_list("name", flat=True))))
    if user.is_superuser:
        groups.add(ADMIN_GROUP)
    return frozenset(groups)


def principal_cached(name: str) -> Principal | None:
    """principal_named without I/O: None unless verified within HPWSN_AUTH_CACHE_S."""
    cached = _groups.get(name)
    if cached is None or time.monotonic() - cached[0] >= float(settings.HPWSN_AUTH_CACHE_S):
        return None
    return Principal(name=name, groups=cached[1], method="api")


def principal_named(name: str) -> Principal | None:
    """The principal `name` with its current groups; None when it no longer exists."""
    now = time.monotonic()
    cached = _groups.get(name)
    if cached is not None and now - cached[0] < float(settings.HPWSN_AUTH_CACHE_S):
        return Principal(name=name, groups=cached[1], method="api")
    try:
        groups = _directory_groups(name) if settings.HPWSN_LDAP_URL else _local_groups(name)
    except soap_auth.DirectoryDown:
        if cached is not None and now - cached[0] < float(settings.HPWSN_AUTH_STALE_S):
            return Principal(name=name, groups=cached[1], method="api")
        raise ServiceUnavailable(
            "the directory is unavailable; credentials cannot be verified now"
        ) from None
    if groups is None:
        _groups.pop(name, None)
        return None
    if len(_groups) > 10_000:
        _groups.clear()
    _groups[name] = (now, groups)
    return Principal(name=name, groups=groups, method="api")


# ----------------------------------------------------------------------------- DRF classes

_last_used: dict[int, float] = {}


def touch_due(token_id: int) -> bool:
    """True when this process has not recorded the token's use for a minute."""
    return time.monotonic() - _last_used.get(token_id, -1e9) >= 60


def _touch(token_id: int) -> None:
    """Record use at most once a minute per token and process (not a write per request)."""
    if not touch_due(token_id):
        return
    _last_used[token_id] = time.monotonic()
    ApiToken.objects.filter(pk=token_id).update(last_used_at=timezone.now())


def bearer_user(authorization: str) -> ApiUser | None:
    """The caller of an `Authorization: Bearer hpwsn_…` header; None when it is not one.

    Raises AuthenticationFailed for an unknown or revoked token, or a principal that is gone.
    """
    scheme, _sp, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    if not token.startswith(TOKEN_PREFIX):
        raise exceptions.AuthenticationFailed("the bearer token is not an HPwsn API token")
    found = api_token_lookup(digest=token_digest(token))
    if found is None:
        raise exceptions.AuthenticationFailed("the API token is unknown or revoked")
    token_id, name = found
    principal = principal_named(name)
    if principal is None:
        raise exceptions.AuthenticationFailed(f"the principal '{name}' of this token is gone")
    _touch(token_id)
    return ApiUser(principal=principal, via="token", token_id=token_id)


class TokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer hpwsn_…` (create one at POST /api/v1/tokens)."""

    def authenticate(self, request: Request) -> tuple[ApiUser, int | None] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        user = bearer_user(header) if header else None
        return None if user is None else (user, user.token_id)

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="hpwsn"'


class DirectoryBasicAuthentication(authentication.BaseAuthentication):
    """HTTP Basic checked against the directory, exactly as for SOAP callers (hpwsn_site.auth)."""

    def authenticate(self, request: Request) -> tuple[ApiUser, None] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header.lower().startswith("basic "):
            return None
        client = request_client(request.META)
        try:
            principal = async_to_sync(soap_auth.authenticate)(
                security=None, authorization=header, client=client
            )
        except SoapFault as fault:
            if fault.http_status == 503:
                raise ServiceUnavailable(fault.message) from None
            raise exceptions.AuthenticationFailed(fault.message) from None
        if principal.anonymous:
            raise exceptions.AuthenticationFailed("malformed HTTP Basic credentials")
        return ApiUser(principal=principal, via="basic"), None

    def authenticate_header(self, request: Request) -> str:
        return 'Basic realm="hpwsn"'


class ConsoleSessionAuthentication(authentication.SessionAuthentication):
    """The console's login session (with Django's CSRF check on unsafe methods)."""

    def authenticate(self, request: Request) -> tuple[ApiUser, None] | None:
        found = super().authenticate(request)
        if found is None:
            return None
        user = found[0]
        principal = principal_named(user.get_username())
        if principal is None:
            # A directory login (no password of its own here) whose person the directory no
            # longer knows is gone, as its tokens are: the groups its last login mirrored grant
            # nothing. Only a local account (`make superuser`) falls back to its Django groups.
            if not user.has_usable_password():
                raise exceptions.AuthenticationFailed(
                    f"the principal '{user.get_username()}' of this session is gone"
                )
            groups = _local_groups(user.get_username()) or frozenset()
            principal = Principal(name=user.get_username(), groups=groups, method="session")
        return ApiUser(principal=principal, via="session"), None
