"""The ASGI route of SOAP POSTs (hpwsn_site/fastpath.py): the Host header checked as Django does."""

from __future__ import annotations

import asyncio
from typing import Any

from hpwsn_site.fastpath import wrap

CT = "application/soap+xml; charset=utf-8"


def _post(
    path: str, host: str, body: bytes = b"<not-soap/>", ctype: str = CT
) -> list[dict[str, Any]]:
    to_django: list[str] = []

    async def django_app(scope: Any, receive: Any, send: Any) -> None:
        to_django.append(scope["path"])

    async def call() -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []
        scope = {
            "type": "http", "method": "POST", "path": path, "scheme": "http",
            "headers": [(b"host", host.encode()), (b"content-type", ctype.encode())],
        }  # fmt: skip

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await wrap(django_app)(scope, receive, send)
        return sent

    sent = asyncio.run(call())
    if to_django:
        return [{"django": to_django}]
    return sent


def test_a_host_outside_allowed_hosts_is_refused_every_time(settings):
    settings.ALLOWED_HOSTS = ["broker.example"]
    for _ in range(2):  # the second answer comes from the memo of hosts
        start, body = _post("/wsn/", "evil.example:8000")
        assert start["status"] == 400
        assert b"host 'evil.example:8000' is not served here (ALLOWED_HOSTS)" in body["body"]


def test_a_change_of_allowed_hosts_is_followed(settings):
    settings.ALLOWED_HOSTS = ["broker.example"]
    start, body = _post("/wsn/", "broker.example")
    assert start["status"] == 400
    assert b"not served here" not in body["body"]  # past the host: the body is not SOAP
    assert b"is not a SOAP 1.1 or 1.2 Envelope" in body["body"]
    settings.ALLOWED_HOSTS = ["other.example"]
    _start, body = _post("/wsn/", "broker.example")
    assert b"host 'broker.example' is not served here" in body["body"]


def test_a_rest_publish_to_a_host_not_served_goes_to_django(settings):
    settings.ALLOWED_HOSTS = ["broker.example"]
    path = "/api/v1/topics/ALL/messages"
    assert _post(path, "evil.example", b"{", "application/json") == [{"django": [path]}]
    start, body = _post(path, "broker.example", b"{", "application/json")  # served here
    assert start["status"] == 400, body
