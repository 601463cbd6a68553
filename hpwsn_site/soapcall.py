"""What a SOAP handler receives and returns; shared by the WSN and legacy edges."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from lxml import etree

from hpwsn.soap import Request
from topics.acl import ANONYMOUS, Principal

T = TypeVar("T")


def publish_key(principal: Principal, key: str | None) -> str | None:
    """The idempotency key of a publication (SOAP and REST): per principal, so that one caller's
    key cannot suppress another's messages."""
    return f"{principal.name or ''}|{key}" if key else None


@dataclass(slots=True)
class Call:
    req: Request
    body: etree._Element  # the operation element (inside WsnProcess for legacy calls)
    base_url: str  # scheme://host[:port] under which /wsn/ is reached
    resource_id: str | None  # subscription or pull point id, from the URL, wsa:To or a header
    principal: Principal = ANONYMOUS  # who is calling (hpwsn_site.auth)
    idempotency_key: str | None = None  # the Idempotency-Key header, else None
    resource_kind: str | None = None  # "subscriptions" or "pullpoints" when the URL names one

    @property
    def publish_key(self) -> str | None:
        """What makes a repeated Notify recognisable: Idempotency-Key, else wsa:MessageID."""
        return publish_key(self.principal, self.idempotency_key or self.req.message_id)

    def resource_from_to(self, kind: str) -> str | None:
        """The id of a `kind` resource addressed by URL path, wsa:To, or reference parameter."""
        if self.resource_id:
            return self.resource_id
        if self.req.to:
            parts = urlsplit(self.req.to).path.rstrip("/").split("/")
            if len(parts) >= 2 and parts[-2] == kind:
                return parts[-1]
        key = "SubscriptionId" if kind == "subscriptions" else "PullPointId"
        return self.req.reference_params.get(key)


@dataclass(slots=True)
class Reply:
    action: str
    body: bytes | str


Handler = Callable[[Call], Awaitable[Reply | None]]


async def db(fn: Callable[..., T], /, **kwargs: Any) -> T:
    """Run a database-touching service from async code, as a request would.

    SOAP calls bypass Django's request cycle (hpwsn_site.fastpath), so the connection hygiene
    that request_started/request_finished provide is done here.
    """

    def run() -> T:
        close_old_connections()
        try:
            return fn(**kwargs)
        finally:
            close_old_connections()

    return await sync_to_async(run)()
