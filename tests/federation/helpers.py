"""What the federation tests share: a push as a peer's pump makes it."""

from __future__ import annotations

import time
import uuid
from typing import Any
from unittest import mock

from django.conf import settings
from django.test import Client

from dispatch.push import signature_headers
from federation.peers import link_signing_secret


def peer_post(path: str, data: bytes, *, secret: str | None = None, at: float | None = None) -> Any:
    """POST to an inbound address as the peer it names does: signed with this site's
    SigningSecret for its links there (or with `secret`, when given; "" for unsigned),
    timestamped `at` (now)."""
    peer = path.split("/")[3]
    if secret is None:
        secret = link_signing_secret(settings.SECRET_KEY, peer)
    headers = {}
    if secret:
        with mock.patch("time.time", return_value=at or time.time()):
            signed = signature_headers(secret, f"msg_{uuid.uuid4().hex}", data)
        headers = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in signed.items()}
    return Client().post(path, data=data, content_type="text/xml; charset=utf-8", **headers)
