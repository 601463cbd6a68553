"""HTTP delivery of Notify envelopes to consumers over a keep-alive client."""

from __future__ import annotations

import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import httpx
from django.conf import settings

from hpwsn import ns
from hpwsn.soap import SOAP11_CT, SOAP12_CT

_client: httpx.Client | None = None


def _http() -> httpx.Client:
    global _client
    if _client is None:
        _client = httpx.Client(
            timeout=httpx.Timeout(settings.HPWSN_PUSH_TIMEOUT_S, connect=5.0),
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=100),
            follow_redirects=False,
            headers={"User-Agent": "HPwsn-push/1"},
        )
    return _client


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    permanent: bool = False  # not worth retrying (4xx other than 408/429, bad URL)
    status: int | None = None
    detail: str = ""
    retry_after: float | None = None  # seconds the consumer asked us to wait


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def post(url: str, body: bytes, *, soap_version: str, raw: bool = False) -> Outcome:
    """POST one envelope; classify the result as success, transient or permanent failure."""
    if raw:
        headers = {"Content-Type": "application/xml; charset=utf-8"}
    elif soap_version == "1.2":
        headers = {"Content-Type": f'{SOAP12_CT}; action="{ns.ACTION_NOTIFY}"'}
    else:
        headers = {"Content-Type": SOAP11_CT, "SOAPAction": f'"{ns.ACTION_NOTIFY}"'}
    try:
        resp = _http().post(url, content=body, headers=headers)
    except httpx.UnsupportedProtocol as exc:
        return Outcome(ok=False, permanent=True, detail=f"unsupported URL: {exc}")
    except httpx.TimeoutException as exc:
        return Outcome(ok=False, detail=f"timeout: {exc.__class__.__name__}")
    except httpx.HTTPError as exc:
        return Outcome(ok=False, detail=f"{exc.__class__.__name__}: {exc}")
    if 200 <= resp.status_code < 300:
        return Outcome(ok=True, status=resp.status_code)
    excerpt = resp.text[:200]
    transient = resp.status_code in (408, 429) or resp.status_code >= 500
    return Outcome(
        ok=False,
        permanent=not transient,
        status=resp.status_code,
        detail=excerpt,
        retry_after=_retry_after(resp.headers.get("Retry-After")),
    )
