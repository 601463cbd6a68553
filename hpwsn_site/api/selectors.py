"""Reads of API tokens: the live set every web process keeps, one principal's list."""

from __future__ import annotations

from django.db.models import QuerySet

from hpwsn_site import state
from hpwsn_site.api.models import ApiToken


def _load() -> dict[str, tuple[int, str]]:
    rows = ApiToken.objects.filter(revoked_at__isnull=True).values_list("digest", "id", "principal")
    return {digest: (pk, principal) for digest, pk, principal in rows}


_live = state.VersionedCache(state.VERSION_API_TOKENS, _load)


def api_token_lookup(*, digest: str) -> tuple[int, str] | None:
    """(row id, principal) of a live token, from the process's copy (one Redis read)."""
    return _live.get(max_age=0.0).get(digest)


def api_token_cached(*, digest: str, max_age: float = 1.0) -> tuple[int, str] | None:
    """api_token_lookup without I/O, from a copy checked within `max_age` s; None: ask again."""
    if not _live.is_fresh(max_age=max_age):
        return None
    live = _live.peek()
    return live.get(digest) if live is not None else None


def api_tokens_of(*, principal: str | None = None) -> QuerySet[ApiToken]:
    """Tokens, newest first: one principal's, or every one (operators)."""
    qs = ApiToken.objects.all()
    return qs.filter(principal=principal) if principal is not None else qs
