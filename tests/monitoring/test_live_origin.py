"""Who may open the live dashboard's WebSocket, and the analytics page's, over real sockets to the
running platform.

A browser sends the operator's session cookie with a WebSocket handshake whatever page opens it,
and to every port of the host: only the Origin tells the dashboard's own page from another one.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.support import console_login, free_port

pytestmark = pytest.mark.integration

PATH = "/ws/monitoring/"


@dataclass
class Operator:
    """A user logged in through the admin's login form, as a browser would be."""

    username: str
    http: httpx.Client

    @property
    def cookie(self) -> str:
        return f"sessionid={self.http.cookies['sessionid']}"

    def logout(self) -> None:
        resp = self.http.post(
            "/admin/logout/",
            data={"csrfmiddlewaretoken": self.http.cookies["csrftoken"]},
            headers={"Origin": str(self.http.base_url).rstrip("/")},
        )
        assert resp.status_code == 200, resp.text[:300]


def _user_make(username: str, password: str, *, staff: bool) -> None:
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(username=username)
    user.is_staff = staff
    user.is_active = True
    user.set_password(password)
    user.save()


def _user_change(username: str, **fields: bool) -> None:
    from django.contrib.auth import get_user_model

    get_user_model().objects.filter(username=username).update(**fields)


def _force_login_cookie(username: str) -> str:
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    return f"sessionid={client.cookies['sessionid'].value}"


@pytest.fixture
def operator(platform, committed) -> Iterator[Operator]:  # type: ignore[no-untyped-def]
    username, password = f"op-{uuid.uuid4().hex[:8]}", "op-pass-51c9"
    committed(_user_make, username, password, staff=True)
    http = httpx.Client(base_url=platform.base_url, timeout=30)
    http.get("/admin/login/")
    resp = http.post(
        "/admin/login/?next=/monitoring/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": http.cookies["csrftoken"],
            "next": "/monitoring/",
        },
        headers={"Origin": platform.base_url},
    )
    assert resp.status_code == 302, resp.text[:300]
    assert "sessionid" in http.cookies
    yield Operator(username, http)
    http.close()


def _open(
    platform: Any,
    *,
    origin: str | None,
    cookie: str | None,
    host: str | None = None,
    path: str = PATH,
) -> ClientConnection:
    """A WebSocket to the platform's dashboard socket; `host` is what the Host header names (the
    connection goes to the platform whatever it says)."""
    port = urlsplit(platform.base_url).port
    assert port is not None
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    headers = {"Cookie": cookie} if cookie else {}
    return connect(
        f"ws://{host or f'127.0.0.1:{port}'}{path}",
        sock=sock,
        origin=origin,  # type: ignore[arg-type]
        additional_headers=headers,
        proxy=None,
        open_timeout=10,
    )


def _refused(platform: Any, **kwargs: Any) -> bool:
    """Whether the handshake was answered 403 (a socket closed before it was accepted)."""
    try:
        ws = _open(platform, **kwargs)
    except InvalidStatus as exc:
        return exc.response.status_code == 403
    ws.close()
    return False


def _first_frame(ws: ClientConnection) -> dict[str, Any]:
    frame = json.loads(ws.recv(timeout=10))
    assert isinstance(frame, dict)
    return frame


def test_the_dashboard_s_own_page_opens_the_socket_and_gets_the_history(platform, operator):
    ws = _open(platform, origin=platform.base_url, cookie=operator.cookie)
    try:
        assert _first_frame(ws)["type"] == "history"
    finally:
        ws.close()


def test_an_allowed_host_name_with_its_own_origin_opens_the_socket(platform, operator):
    port = urlsplit(platform.base_url).port
    origin, host = f"http://localhost:{port}", f"localhost:{port}"
    ws = _open(platform, origin=origin, cookie=operator.cookie, host=host)
    try:
        assert _first_frame(ws)["type"] == "history"
    finally:
        ws.close()


@pytest.mark.parametrize(
    "origin",
    [
        "https://evil.example",
        "http://evil.example:{port}",
        "http://127.0.0.1.evil.example:{port}",
        "http://evil.example#@127.0.0.1:{port}",
        "null",
        "",
        "127.0.0.1",
        "http://127.0.0.1:{other}",  # another server on the same host: another origin
        "http://localhost:{other}",
        "https://127.0.0.1:{port}",  # the other scheme
        "ws://127.0.0.1:{port}",
        None,  # no Origin at all
    ],
)
def test_a_page_of_another_origin_cannot_open_the_socket_with_an_operator_s_cookie(
    platform, operator, origin
):
    port = urlsplit(platform.base_url).port
    if origin is not None:
        origin = origin.format(port=port, other=free_port())
    assert _refused(platform, origin=origin, cookie=operator.cookie)


@pytest.mark.parametrize(
    ("host", "origin"),
    [
        ("evil.example:{port}", "http://evil.example:{port}"),  # a rebound name: not our host
        ("evil.example:{port}", "http://127.0.0.1:{port}"),
        ("127.0.0.1:{other}", "http://127.0.0.1:{port}"),
    ],
)
def test_a_host_header_that_is_not_the_origin_s_or_not_allowed_is_refused(
    platform, operator, host, origin
):
    port, other = urlsplit(platform.base_url).port, free_port()
    assert _refused(
        platform,
        origin=origin.format(port=port, other=other),
        cookie=operator.cookie,
        host=host.format(port=port, other=other),
    )


def test_an_anonymous_or_non_staff_socket_is_refused(platform, committed):
    assert _refused(platform, origin=platform.base_url, cookie=None)
    assert _refused(platform, origin=platform.base_url, cookie="sessionid=not-a-session")
    username = f"plain-{uuid.uuid4().hex[:8]}"
    committed(_user_make, username, "plain-pass-0d2e", staff=False)
    cookie = committed(_force_login_cookie, username)
    assert _refused(platform, origin=platform.base_url, cookie=cookie)


def _closed_with(ws: ClientConnection, *, within: float = 20.0) -> int | None:
    """The close code the server ends the socket with, reading frames meanwhile; None if frames
    still come after `within` seconds."""
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            ws.recv(timeout=10)
    except ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd else None
    return None


def _streaming(platform: Any, operator: Operator) -> ClientConnection:
    ws = _open(platform, origin=platform.base_url, cookie=operator.cookie)
    assert _first_frame(ws)["type"] == "history"
    assert _first_frame(ws)["type"] == "stats"  # the stream runs
    return ws


def test_a_socket_whose_operator_logged_out_stops_receiving(platform, operator):
    ws = _streaming(platform, operator)
    try:
        operator.logout()
        assert _closed_with(ws) == 4401
    finally:
        ws.close()


@pytest.mark.parametrize(
    ("change", "code"),
    [({"is_active": False}, 4401), ({"is_staff": False}, 4403)],
    ids=["deactivated", "no longer staff"],
)
def test_a_socket_whose_user_was_changed_so_stops_receiving(
    platform, operator, committed, change, code
):  # type: ignore[no-untyped-def]
    ws = _streaming(platform, operator)
    try:
        committed(_user_change, operator.username, **change)
        assert _closed_with(ws) == code
    finally:
        ws.close()


def _user_grant(username: str, group: str, *, granted: bool) -> None:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    user = get_user_model().objects.get(username=username)
    if granted:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    else:
        user.groups.remove(Group.objects.get(name=group))


def _progress_sent(run_id: str, jobs_done: int) -> None:
    """A report of the run, sent to its group the way a worker's run sends it."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from spark import keys

    layer = get_channel_layer()
    assert layer is not None
    progress = {"jobs_done": jobs_done, "jobs_total": 3}
    async_to_sync(layer.group_send)(
        keys.group(run_id), {"type": "analytics.progress", "progress": progress}
    )


def _progress_or_close(ws: ClientConnection, run_id: str, jobs_done: int) -> dict[str, Any] | int:
    """The next progress frame after a report is sent (reports are sent until one arrives, since
    the socket's group membership is made just after its handshake), or the close code."""
    for _ in range(20):
        _progress_sent(run_id, jobs_done)
        try:
            frame = json.loads(ws.recv(timeout=0.5))
        except TimeoutError:
            continue
        except ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd else 0
        assert isinstance(frame, dict)
        return frame
    raise AssertionError("no progress frame and no close")


@pytest.mark.parametrize(
    ("change", "code"),
    [("logout", 4401), ("deactivated", 4401), ("role withdrawn", 4403)],
)
def test_the_analytics_progress_socket_stops_once_its_login_no_longer_admits_it(
    platform, committed, change, code
):  # type: ignore[no-untyped-def]
    username, password = f"an-{uuid.uuid4().hex[:8]}", "an-pass-7e21"
    committed(_user_make, username, password, staff=False)
    committed(_user_grant, username, "hpwsn-analysts", granted=True)
    http = console_login(platform.base_url, username, password)
    run_id = str(uuid.uuid4())
    path = f"/ws/analytics/runs/{run_id}/"
    cookie = f"sessionid={http.cookies['sessionid']}"
    # Only from the page's own origin, as the dashboard's socket.
    assert _refused(platform, origin="https://evil.example", cookie=cookie, path=path)
    ws = _open(platform, origin=platform.base_url, cookie=cookie, path=path)
    try:
        assert _progress_or_close(ws, run_id, 1) == {
            "type": "progress",
            "progress": {"jobs_done": 1, "jobs_total": 3},
        }
        if change == "logout":
            out = http.post(
                "/console/logout/",
                data={"csrfmiddlewaretoken": http.cookies["csrftoken"]},
                headers={"Origin": platform.base_url},
            )
            assert out.status_code in (200, 302), out.text[:300]
        elif change == "deactivated":
            committed(_user_change, username, is_active=False)
        else:
            committed(_user_grant, username, "hpwsn-analysts", granted=False)
        assert _progress_or_close(ws, run_id, 2) == code
    finally:
        ws.close()
        http.close()
