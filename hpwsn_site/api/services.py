"""API tokens: create (shown once), revoke. Every change moves the shared version."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from hpwsn import errors
from hpwsn_site import state
from hpwsn_site.api.models import ApiToken

TOKEN_PREFIX = "hpwsn_"  # noqa: S105 - a marker, not a secret


def token_digest(token: str) -> str:
    """What is stored of a token: it has 190 random bits, so a plain SHA-256 cannot be reversed."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class NewToken:
    row: ApiToken
    token: str  # the secret, returned once and never stored


class TooManyTokens(Exception):
    """The principal holds HPWSN_API_MAX_TOKENS live tokens already."""


def api_token_create(*, principal: str, name: str = "") -> NewToken:
    """A new token for `principal`; the caller shows `token` once, only its digest is kept.
    TooManyTokens past HPWSN_API_MAX_TOKENS live ones (two made at the same instant may pass
    it by one)."""
    prefix = secrets.token_hex(4)
    token = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(24)}"
    most = settings.HPWSN_API_MAX_TOKENS
    with transaction.atomic():
        held = ApiToken.objects.filter(principal=principal, revoked_at__isnull=True).count()
        if most and held >= most:
            raise TooManyTokens(
                f"{principal} holds {held} live API tokens, HPWSN_API_MAX_TOKENS ({most}): "
                "revoke one first"
            )
        row = ApiToken.objects.create(
            principal=principal, name=name[:100], prefix=prefix, digest=token_digest(token)
        )
        audit_record(
            actor=principal,
            action="apitoken.create",
            object_type="apitoken",
            object_id=prefix,
            after={"principal": principal, "name": row.name, "prefix": prefix},
        )
        transaction.on_commit(lambda: state.bump(state.VERSION_API_TOKENS))
    return NewToken(row=row, token=token)


def api_token_revoke(*, token_id: int, actor: str) -> ApiToken:
    """Revoke a token at once (every web process drops it at its next request)."""
    with transaction.atomic():
        row = ApiToken.objects.select_for_update().filter(pk=token_id).first()
        if row is None:
            raise errors.ResourceUnknown(f"API token {token_id} does not exist")
        if row.revoked_at is None:
            row.revoked_at = timezone.now()
            row.save(update_fields=["revoked_at"])
            audit_record(
                actor=actor,
                action="apitoken.revoke",
                object_type="apitoken",
                object_id=row.prefix,
                before={"principal": row.principal, "name": row.name, "prefix": row.prefix},
            )
            transaction.on_commit(lambda: state.bump(state.VERSION_API_TOKENS))
    return row
