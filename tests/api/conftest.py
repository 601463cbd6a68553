"""Fixtures of the REST API tests: the demo accounts' API tokens, a JSON webhook consumer."""

from __future__ import annotations

import http.server
import json
import threading
from dataclasses import dataclass, field

import httpx
import pytest
from django.test import override_settings

from subscriptions.selectors import resource_tag
from tests.conftest import PLATFORM_SECRET_KEY
from tests.support import free_port

PASSWORD = "hpwsn-demo"
USERS = ("publisher1", "subscriber1", "analyst1", "operator1", "admin1")


def tag_of(resource_id: object) -> str:
    """What analysts see instead of an id, as the platform computes it with its own secret key."""
    with override_settings(SECRET_KEY=PLATFORM_SECRET_KEY):
        return "#" + resource_tag(str(resource_id))


@dataclass
class Api:
    base: str
    tokens: dict[str, str]

    def headers(self, user: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[user]}"} if user else {}

    def call(self, method: str, path: str, user: str | None = None, **kw: object) -> httpx.Response:
        headers = {**self.headers(user), **(kw.pop("headers", None) or {})}  # type: ignore[misc]
        return httpx.request(method, self.base + path, headers=headers, timeout=30, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def api_tokens(platform) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """One API token per demo account, created over the API with HTTP Basic (LDAP)."""
    tokens = {}
    for user in USERS:
        r = httpx.post(
            platform.base_url + "/api/v1/tokens",
            json={"name": "tests"},
            auth=(user, PASSWORD),
            timeout=30,
        )
        assert r.status_code == 201, r.text
        tokens[user] = r.json()["token"]
    return tokens


@pytest.fixture
def api(platform, api_tokens) -> Api:  # type: ignore[no-untyped-def]
    return Api(base=platform.base_url + "/api/v1", tokens=api_tokens)


@dataclass
class Webhook:
    """A real HTTP consumer on 127.0.0.1 that records every POST (any content type)."""

    port: int = field(default_factory=free_port)
    posts: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def events(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        with self.lock:
            for _headers, body in self.posts:
                doc = json.loads(body)
                out.extend(doc if isinstance(doc, list) else [doc])
        return out

    def start(self) -> Webhook:
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with hook.lock:
                    hook.posts.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook():  # type: ignore[no-untyped-def]
    hook = Webhook().start()
    yield hook
    hook.stop()
