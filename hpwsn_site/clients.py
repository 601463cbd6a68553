"""Who a request comes from: the client's address, as the connection or the proxies say."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings


def client_address(remote_addr: str, forwarded_for: str | None) -> str:
    """An anonymous caller's address: the connection's, or with HPWSN_API_PROXIES = n > 0 the
    n-th address from the right of X-Forwarded-For (what the nearest proxy saw), as DRF's
    `NUM_PROXIES` reads it. The addresses left of that are the client's own word."""
    proxies = settings.REST_FRAMEWORK["NUM_PROXIES"]
    if not proxies or not forwarded_for:
        return remote_addr
    hops = forwarded_for.split(",")
    return hops[-min(proxies, len(hops))].strip()


def request_client(meta: Mapping[str, Any]) -> str:
    """client_address of a Django or DRF request, from its `META`."""
    return client_address(meta.get("REMOTE_ADDR") or "", meta.get("HTTP_X_FORWARDED_FOR"))
