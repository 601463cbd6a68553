"""The console's tokens page makes tokens at the rate, and within the bound, of POST /api/v1/tokens:
each new token is a row that every web process loads again."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client

from hpwsn_site.api.models import ApiToken
from tests.console.conftest import make_user

pytestmark = pytest.mark.django_db
LOCAL = "django.contrib.auth.backends.ModelBackend"


def _signed_in() -> tuple[Client, str]:
    name = f"tokens-{uuid.uuid4().hex[:8]}"  # its own throttle window in Redis
    client = Client()
    client.force_login(make_user(name, "hpwsn-analysts"), backend=LOCAL)
    return client, name


def _live(name: str) -> int:
    return ApiToken.objects.filter(principal=name, revoked_at__isnull=True).count()


def test_the_console_makes_tokens_at_the_apis_rate(settings):  # type: ignore[no-untyped-def]
    settings.HPWSN_API_THROTTLE = {**settings.HPWSN_API_THROTTLE, "tokens": "2/minute"}
    client, name = _signed_in()

    answers = [client.post("/console/tokens/", {"name": f"t{i}"}) for i in range(3)]

    assert [a.status_code for a in answers] == [200, 200, 429]
    assert "Too many new tokens" in answers[2].content.decode()
    assert _live(name) == 2


def test_a_principal_holds_at_most_the_bound_of_live_tokens(settings):  # type: ignore[no-untyped-def]
    settings.HPWSN_API_THROTTLE = {**settings.HPWSN_API_THROTTLE, "tokens": "0/minute"}
    settings.HPWSN_API_MAX_TOKENS = 2
    client, name = _signed_in()

    answers = [client.post("/console/tokens/", {"name": f"t{i}"}) for i in range(3)]

    assert [a.status_code for a in answers] == [200, 200, 409]
    assert "HPWSN_API_MAX_TOKENS" in answers[2].content.decode()
    assert _live(name) == 2
    first = ApiToken.objects.filter(principal=name).order_by("pk").first()
    assert first is not None
    client.post(f"/console/tokens/{first.pk}/revoke/")
    assert client.post("/console/tokens/", {"name": "again"}).status_code == 200
    assert _live(name) == 2
