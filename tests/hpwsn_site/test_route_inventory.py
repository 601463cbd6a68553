"""Every route the site serves, and what it answers a caller without credentials.

The inventory is read from the running configuration: Django's URL resolver (hpwsn_site/urls.py and
its includes), the WebSocket router of hpwsn_site/asgi.py, and the ASGI fast path
(hpwsn_site/fastpath.py), found by what it answers without Django. Each route is either PUBLIC
(open by design, with the documentation that says so), POLICY (open to anonymous callers where a
topic's policy or an object's owner allows it, so what is checked is that a closed topic or someone
else's object is refused), or GUARDED (refused to an anonymous caller, whatever it asks). A route in
none of the three fails the inventory test, so a route added without a decision cannot go unseen.

Requests go through Django's test client without CSRF checks: a CSRF refusal would hide a view
that forgot its login check.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from asgiref.sync import async_to_sync
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import Client, override_settings
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.urls.converters import UUIDConverter
from django.utils import timezone

from hpwsn import ns
from tests.support import in_own_thread

pytestmark = pytest.mark.django_db(transaction=True)

CONSOLE_LOGIN = "/console/login/"
ADMIN_LOGIN = "/admin/login/"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
OWNER = "guard-owner"  # a directory user who owns the objects an anonymous caller must not touch
CLOSED_TOPIC = "GuardClosed:Door"  # a new root: secure by default, nobody but admins (protocol.md)

# ----------------------------------------------------------------------------- the decisions

# Open to anyone by design. The reason quotes where the documentation says so.
PUBLIC: dict[str, str] = {
    "healthz": "load balancers' health check (docs/monitoring.md: 'load balancers | /healthz')",
    "admin/login/": "the admin's login form (README Monitoring: 'log in at /admin/login/')",
    "console/login/": "the console's login form (docs/console.md: 'Log in at /console/login/')",
    "vendor/<str:name>": "Chart.js, vendored and 'served by the site at /vendor/chart.umd.min.js' "
    "like a static file (docs/monitoring.md, docs/analytics.md); only names in VENDOR_FILES",
    "api/schema/": "the OpenAPI schema integrations read (README REST API, docs/api.md intro)",
    "api/docs/": "Swagger UI over the schema (README REST API, docs/api.md intro)",
    "api/docs/redoc/": "Redoc over the schema (README REST API, docs/api.md intro)",
    "api/v1/ [IndexView]": "the API's index: links to the resources, the schema and the docs, no "
    "data (README: 'Integrations use JSON at /api/v1/')",
    "api/v1/ [NotFoundView]": "the catch-all that answers any unrouted /api/v1/ path with a 404 "
    "problem (docs/api.md, errors: not-found); it serves nothing",
    "wsn/legacy/": "the Spyne legacy service: GET ?wsdl is its WSDL (docs/protocol.md, WSDL); "
    "POSTs are judged by the topics' policies like /wsn/ (docs/protocol.md, last paragraph of "
    "'Who may act on a subscription or pull point')",
}

# ASGI-level routes that are not URL patterns.
PUBLIC_ASGI: dict[str, str] = {
    "/static/": "drf-spectacular-sidecar's and the admin's scripts and styles, served by "
    "ASGIStaticFilesHandler (hpwsn_site/asgi.py; docs/api.md intro)",
    "POST /bench/echo/": "the benchmark's ceiling; exists only with HPWSN_BENCH_ENDPOINTS=1, which "
    "only the benchmark sets (bench/README.md, docs/benchmarks.md); checked to be absent otherwise",
}


@dataclass(frozen=True)
class Call:
    """One anonymous request and the refusal it must get.

    expect: "401", "403", "401|403" (statuses); "login:<path>" (a redirect, possibly through other
    redirects, to that login page); "soap-not-authorized" (a SOAP fault hpwsn:NotAuthorized);
    "hides:<field>" (200, and the object's id is not in the answer).
    """

    method: str
    url: str  # formatted with the objects' ids: {topic_pk}, {sub}, {pp}, {reg}, {letter}, ...
    expect: str
    body: bytes | str | None = None
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


def _login(url: str, path: str, methods: tuple[str, ...] = ("GET",)) -> tuple[Call, ...]:
    return tuple(Call(m, url, f"login:{path}") for m in methods)


def _api(url: str, *methods: str, expect: str = "401") -> tuple[Call, ...]:
    return tuple(Call(m, url, expect, body="{}") for m in methods)


def _soap(operation: str) -> bytes:
    return (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}" xmlns:wsn-br="{ns.WSNBR}">'
        f"<s:Body>{operation}</s:Body></s:Envelope>"
    ).encode()


NOTIFY_CLOSED = _soap(
    f'<wsnt:Notify><wsnt:NotificationMessage><wsnt:Topic Dialect="{ns.DIALECT_COLON}">'
    f"{CLOSED_TOPIC}</wsnt:Topic><wsnt:Message><door>open</door></wsnt:Message>"
    "</wsnt:NotificationMessage></wsnt:Notify>"
)
SOAP_CT = "text/xml; charset=utf-8"

# Refused to a caller without credentials, for every method. The methods listed are those the view
# serves; any other method must be refused too, or answered 405.
GUARDED: dict[str, tuple[Call, ...]] = {
    # The console (docs/console.md; README Security: 'The console ... need[s] a login').
    "console/": _login("/console/", CONSOLE_LOGIN),
    "console/logout/": _login("/console/logout/", CONSOLE_LOGIN, ("POST",)),
    "console/topics/new/": _login("/console/topics/new/", CONSOLE_LOGIN, ("GET", "POST")),
    "console/topics/<int:pk>/": _login(
        "/console/topics/{topic_pk}/", CONSOLE_LOGIN, ("GET", "POST")
    ),
    "console/topics/<int:pk>/rename/": _login(
        "/console/topics/{topic_pk}/rename/", CONSOLE_LOGIN, ("POST",)
    ),
    "console/topics/<int:pk>/move/": _login(
        "/console/topics/{topic_pk}/move/", CONSOLE_LOGIN, ("POST",)
    ),
    "console/topics/<int:pk>/delete/": _login(
        "/console/topics/{topic_pk}/delete/", CONSOLE_LOGIN, ("GET", "POST")
    ),
    "console/subscriptions/": _login("/console/subscriptions/", CONSOLE_LOGIN),
    "console/subscriptions/<uuid:sub_id>/<slug:action>/": _login(
        "/console/subscriptions/{sub}/pause/", CONSOLE_LOGIN, ("POST",)
    ),
    "console/pullpoints/": _login("/console/pullpoints/", CONSOLE_LOGIN),
    "console/pullpoints/<uuid:pp_id>/remove/": _login(
        "/console/pullpoints/{pp}/remove/", CONSOLE_LOGIN, ("POST",)
    ),
    "console/registrations/": _login("/console/registrations/", CONSOLE_LOGIN),
    "console/peers/": _login("/console/peers/", CONSOLE_LOGIN),
    "console/deadletters/": _login("/console/deadletters/", CONSOLE_LOGIN),
    "console/deadletters/redrive/": _login(
        "/console/deadletters/redrive/", CONSOLE_LOGIN, ("POST",)
    ),
    "console/audit/": _login("/console/audit/", CONSOLE_LOGIN),
    "console/tokens/": _login("/console/tokens/", CONSOLE_LOGIN, ("GET", "POST")),
    "console/tokens/<int:pk>/revoke/": _login(
        "/console/tokens/{token_pk}/revoke/", CONSOLE_LOGIN, ("POST",)
    ),
    # The analysts' page (README Analytics: for hpwsn-analysts, operators and admins); starting a
    # run answers a 401 problem, the pages send to the console's login.
    "analytics/": _login("/analytics/", CONSOLE_LOGIN),
    "analytics/runs/": (Call("POST", "/analytics/runs/", "401"),),
    "analytics/runs/<uuid:run_id>/": _login("/analytics/runs/{run}/", CONSOLE_LOGIN),
    "analytics/runs/<uuid:run_id>/<slug:job>.csv": _login(
        "/analytics/runs/{run}/traffic.csv", CONSOLE_LOGIN
    ),
    # The dashboard: staff only, login at /admin/login/ (docs/monitoring.md).
    "monitoring/": _login("/monitoring/", ADMIN_LOGIN),
    # Open while HPWSN_METRICS_TOKEN is empty (README, docs/monitoring.md: 'When HPWSN_METRICS_TOKEN
    # is set, /metrics needs Authorization: Bearer <token>'); with a token set it must refuse.
    "metrics": (
        Call("GET", "/metrics", "401", settings={"HPWSN_METRICS_TOKEN": "guard-metrics-token"}),
    ),
    # A peer's push: the address is an HMAC of this site's secret and each push must be signed
    # (docs/deployment.md, 'Signed pushes': 'The inbound edge answers 401 to a push whose signature
    # is missing'). The address used here is the right one, so the refusal is the signature's.
    "federation/in/<slug:peer>/<slug:token>/": (
        Call("POST", "{inbound}", "401", body=NOTIFY_CLOSED, content_type=SOAP_CT),
    ),
    # The REST API's role matrix (docs/api.md, 'Who may do what': anonymous 'no (401)').
    "api/v1/tokens": _api("/api/v1/tokens", "GET", "POST"),
    "api/v1/tokens/<int:pk>": _api("/api/v1/tokens/{token_pk}", "DELETE"),
    "api/v1/topics": _api("/api/v1/topics", "GET", "POST"),
    "api/v1/topics/<path>": _api(f"/api/v1/topics/{CLOSED_TOPIC}", "GET", "PATCH", "DELETE"),
    "api/v1/deadletters": _api("/api/v1/deadletters", "GET"),
    "api/v1/deadletters:redrive": _api("/api/v1/deadletters:redrive", "POST"),
    "api/v1/deadletters/<int:pk>": _api("/api/v1/deadletters/{letter}", "GET", "DELETE"),
    "api/v1/consumers": _api("/api/v1/consumers", "GET", "PUT"),
    "api/v1/stats": _api("/api/v1/stats", "GET"),
    "api/v1/nodes": _api("/api/v1/nodes", "GET"),
    "api/v1/audit": _api("/api/v1/audit", "GET"),
    "api/v1/analytics": _api("/api/v1/analytics", "GET", "POST"),
    "api/v1/analytics/<run_id>": _api("/api/v1/analytics/{run}", "GET"),
}
# Every route of the admin site ('The console, the admin and the dashboard need a login', README
# Security) but its login form: GET and POST must end at the admin's login page.
ADMIN_PREFIX = "admin/"

# Open to anonymous callers where the policy allows (docs/api.md, Authentication: 'Nothing: the
# anonymous caller. It may publish and subscribe where a topic's policy allows anonymous callers';
# docs/protocol.md, Security; README Security). Checked: what a closed topic or another principal's
# object would give is refused.
POLICY: dict[str, tuple[str, tuple[Call, ...]]] = {
    "wsn/": (
        "the SOAP endpoint: GET ?wsdl / ?xsd is the WSDL (docs/protocol.md, WSDL), POSTs are "
        "judged by each topic's policy (docs/protocol.md, 'Who may do what')",
        (Call("POST", "/wsn/", "soap-not-authorized", body=NOTIFY_CLOSED, content_type=SOAP_CT),),
    ),
    "wsn/<kind>/<resource_id>/": (
        "a subscription's, pull point's or registration's address: its owner, operators and "
        "admins; anyone on what an anonymous caller made (docs/protocol.md, 'Who may act ...')",
        (
            Call(
                "POST",
                "/wsn/subscriptions/{sub}",
                "soap-not-authorized",
                body=_soap("<wsnt:Unsubscribe/>"),
                content_type=SOAP_CT,
            ),
            Call(
                "POST",
                "/wsn/pullpoints/{pp}",
                "soap-not-authorized",
                body=_soap("<wsnt:GetMessages/>"),
                content_type=SOAP_CT,
            ),
            Call(
                "POST",
                "/wsn/registrations/{reg}",
                "soap-not-authorized",
                body=_soap("<wsn-br:DestroyRegistration/>"),
                content_type=SOAP_CT,
            ),
        ),
    ),
    "api/v1/topics/<path>/messages": (
        "publish and current message: the topic's ACL (docs/api.md, Publishing)",
        (
            Call(
                "POST",
                f"/api/v1/topics/{CLOSED_TOPIC}/messages",
                "403",
                body='{"json": {"door": "open"}}',
            ),
            Call("GET", f"/api/v1/topics/{CLOSED_TOPIC}/messages", "403"),
        ),
    ),
    "api/v1/subscriptions": (
        "subscribe: the topic's ACL; the list shows an anonymous caller nothing (docs/api.md, "
        "'list subscriptions ...': anonymous 'empty')",
        (
            Call("GET", "/api/v1/subscriptions", "hides:{sub}"),
            Call(
                "POST",
                "/api/v1/subscriptions",
                "403",
                body=f'{{"consumer": "http://127.0.0.1:9/guard", "topic": "{CLOSED_TOPIC}", '
                '"dialect": "concrete"}',
            ),
        ),
    ),
    "api/v1/subscriptions/<sub_id>": (
        "the owner rule (docs/api.md, 'read a subscription ... by id': own*)",
        _api("/api/v1/subscriptions/{sub}", "GET", "DELETE", expect="403"),
    ),
    "api/v1/subscriptions/<sub_id>:pause": (
        "the owner rule (docs/api.md, 'change or end a subscription': own*)",
        _api("/api/v1/subscriptions/{sub}:pause", "POST", expect="403"),
    ),
    "api/v1/subscriptions/<sub_id>:resume": (
        "the owner rule (docs/api.md, 'change or end a subscription': own*)",
        _api("/api/v1/subscriptions/{sub}:resume", "POST", expect="403"),
    ),
    "api/v1/subscriptions/<sub_id>:renew": (
        "the owner rule (docs/api.md, 'change or end a subscription': own*)",
        _api("/api/v1/subscriptions/{sub}:renew", "POST", expect="403"),
    ),
    "api/v1/pullpoints": (
        "CreatePullPoint is anyone's (docs/protocol.md); the list shows anonymous callers nothing",
        (Call("GET", "/api/v1/pullpoints", "hides:{pp}"),),
    ),
    "api/v1/pullpoints/<pp_id>": (
        "the owner rule (docs/api.md, own*)",
        _api("/api/v1/pullpoints/{pp}", "GET", "DELETE", expect="403"),
    ),
    "api/v1/pullpoints/<pp_id>/messages:pull": (
        "the owner rule (docs/api.md, own*)",
        _api("/api/v1/pullpoints/{pp}/messages:pull", "POST", expect="403"),
    ),
    "api/v1/registrations": (
        "register a publisher: the topic's ACL; the list shows an anonymous caller nothing",
        (Call("GET", "/api/v1/registrations", "hides:{reg}"),),
    ),
    "api/v1/registrations/<reg_id>": (
        "the owner rule (docs/api.md, own*)",
        _api("/api/v1/registrations/{reg}", "GET", "DELETE", expect="403"),
    ),
    "api/v1/registrations/<reg_id>:renew": (
        "the owner rule (docs/api.md, own*)",
        # Refused before the body is read: an empty one too gets 403, not 400.
        _api("/api/v1/registrations/{reg}:renew", "POST", expect="403"),
    ),
}

# The sockets: 'A socket without a session is closed before the handshake with code 4401'
# (docs/monitoring.md; the analytics run's socket the same, spark/consumers.py).
WEBSOCKETS: dict[str, str] = {
    "ws/monitoring/": "/ws/monitoring/",
    "ws/analytics/runs/<uuid:run_id>/": "/ws/analytics/runs/{run}/",
}

# What the ASGI fast path answers itself (hpwsn_site/fastpath.py), as regular expressions over
# the path of a POST, and the policy call that shows each still refuses what it must.
FAST_PATH: dict[str, tuple[str, Call]] = {
    "POST /wsn/": (
        r"/wsn/",
        Call("POST", "/wsn/", "soap-not-authorized", body=NOTIFY_CLOSED, content_type=SOAP_CT),
    ),
    "POST /wsn/<kind>/<resource_id>": (
        r"/wsn/(subscriptions|pullpoints|registrations)/[^/]{1,128}/?",
        Call(
            "POST",
            "/wsn/subscriptions/{sub}",
            "soap-not-authorized",
            body=_soap("<wsnt:Unsubscribe/>"),
            content_type=SOAP_CT,
        ),
    ),
    "POST /api/v1/topics/<path>/messages": (
        r"/api/v1/topics/[^/]+/messages",
        Call(
            "POST",
            f"/api/v1/topics/{CLOSED_TOPIC}/messages",
            "403",
            body='{"json": {"door": "open"}}',
        ),
    ),
}
# A made-up token is refused by the fast path as by DRF (docs/api.md errors: 401).
FAST_PATH_BAD_TOKEN = Call(
    "POST", f"/api/v1/topics/{CLOSED_TOPIC}/messages", "401", body='{"json": 1}',
    headers={"Authorization": "Bearer hpwsn_00000000_not-a-real-token"},
)  # fmt: skip


# ----------------------------------------------------------------------------- the inventory


@dataclass(frozen=True)
class Route:
    key: str  # the readable route: regex groups shown as <name>
    raw: str  # as Django concatenates it (ResolverMatch.route)
    pattern: URLPattern


def _view_name(pattern: URLPattern) -> str:
    callback = pattern.callback
    view_class = getattr(callback, "view_class", None)
    return view_class.__name__ if view_class else callback.__name__


def _groups(raw: str) -> Iterator[tuple[int, int, str, str]]:
    """Each named regex group of `raw`: start, end, name, body."""
    for m in re.finditer(r"\(\?P<(\w+)>", raw):
        depth, i = 1, m.end()
        while depth:
            if raw[i] == "\\":
                i += 1
            elif raw[i] == "(":
                depth += 1
            elif raw[i] == ")":
                depth -= 1
            i += 1
        yield m.start(), i, m.group(1), raw[m.end() : i - 1]


def _substitute_groups(raw: str, value: Callable[[str, str], str]) -> str:
    out, last = [], 0
    for start, end, name, body in _groups(raw):
        out += [raw[last:start], value(name, body)]
        last = end
    text = "".join([*out, raw[last:]])
    return text.replace("^", "").replace("$", "").replace("/?", "/")


def _readable(raw: str) -> str:
    return _substitute_groups(raw, lambda name, _body: f"<{name}>")


def _sample(name: str, body: str) -> str:
    if re.fullmatch(r"\w+(\|\w+)+", body):
        return body.split("|")[0]
    return "1" if name.endswith("id") or name == "pk" else "guard-probe"


def _instantiate(route: Route) -> str:
    """A concrete path for any route: converters and regex groups filled with plausible values."""
    converters = (
        route.pattern.pattern.converters if hasattr(route.pattern.pattern, "converters") else {}
    )

    def converter_value(m: re.Match[str]) -> str:
        # A path, int, slug or str converter takes "1"; a UUID converter a fresh id.
        return str(uuid.uuid4()) if isinstance(converters.get(m.group(2)), UUIDConverter) else "1"

    text = _substitute_groups(route.raw, _sample)
    return "/" + re.sub(r"<(?:(\w+):)?(\w+)>", converter_value, text)


def _walk(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for p in patterns:
        raw = prefix + str(p.pattern)
        if isinstance(p, URLResolver):
            yield from _walk(p.url_patterns, raw)
        else:
            yield raw, p


def django_routes() -> list[Route]:
    found = [(_readable(raw), raw, p) for raw, p in _walk(get_resolver().url_patterns)]
    keys = [k for k, _, _ in found]
    return [
        Route(key=f"{k} [{_view_name(p)}]" if keys.count(k) > 1 else k, raw=raw, pattern=p)
        for k, raw, p in found
    ]


def websocket_routes() -> list[str]:
    from hpwsn_site.asgi import application

    app: Any = application.application_mapping["websocket"]
    while not isinstance(app, URLRouter):  # origin validator, cookies, session, auth
        app = getattr(app, "application", None) or app.inner

    def walk(router: URLRouter, prefix: str) -> Iterator[str]:
        for route in router.routes:
            raw = prefix + str(route.pattern)
            inner = getattr(route, "callback", None)
            if isinstance(inner, URLRouter):
                yield from walk(inner, raw)
            else:
                yield _readable(raw)

    return list(walk(app, ""))


def _is_admin(route: Route) -> bool:
    return route.key.startswith(ADMIN_PREFIX) and route.key not in PUBLIC


def _inventory_text(routes: list[Route], sockets: list[str]) -> str:
    lines = []
    for r in routes:
        if r.key in PUBLIC:
            lines.append(f"  public   {r.key}: {PUBLIC[r.key]}")
        elif r.key in POLICY:
            lines.append(f"  policy   {r.key}: {POLICY[r.key][0]}")
        elif r.key in GUARDED or _is_admin(r):
            lines.append(f"  guarded  {r.key}")
        else:
            lines.append(f"  UNDECIDED {r.key} ({_view_name(r.pattern)})")
    lines += [f"  socket   {s}" for s in sockets]
    lines += [f"  fastpath {k}" for k in FAST_PATH]
    lines += [f"  public   {k}: {v}" for k, v in PUBLIC_ASGI.items()]
    return "\n".join(lines)


def test_every_route_is_public_by_design_or_checked() -> None:
    routes = django_routes()
    sockets = websocket_routes()
    keys = {r.key for r in routes}
    decided = set(PUBLIC) | set(POLICY) | set(GUARDED)
    undecided = sorted(r.key for r in routes if r.key not in decided and not _is_admin(r))
    stale = sorted(decided - keys)
    sockets_undecided = sorted(set(sockets) - set(WEBSOCKETS))
    sockets_stale = sorted(set(WEBSOCKETS) - set(sockets))
    inventory = _inventory_text(routes, sockets)
    assert not undecided, f"routes neither public nor checked: {undecided}\n{inventory}"
    assert not stale, f"decisions about routes that no longer exist: {stale}\n{inventory}"
    assert not sockets_undecided, f"sockets not checked: {sockets_undecided}\n{inventory}"
    assert not sockets_stale, f"checked sockets that no longer exist: {sockets_stale}"
    assert set(PUBLIC).isdisjoint(GUARDED)
    assert set(PUBLIC).isdisjoint(POLICY)
    assert set(GUARDED).isdisjoint(POLICY)


# ----------------------------------------------------------------------------- the objects


@pytest.fixture
def objects(settings) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Real objects for the routes that take an id, owned by a directory user, not by anonymous."""
    from dispatch.models import DeadLetter
    from federation.peers import inbound_token, peers_parse
    from hpwsn_site.api.services import api_token_create
    from spark.models import AnalyticsRun, JobResult
    from subscriptions.models import PublisherRegistration, PullPoint, Subscription
    from topics.models import Topic
    from topics.services import topic_create

    topic_create(path=CLOSED_TOPIC)
    topic = Topic.objects.get(path=CLOSED_TOPIC)
    sub = Subscription.objects.create(
        consumer_address="http://127.0.0.1:9/guard",
        topic_expression=CLOSED_TOPIC,
        topic_path=CLOSED_TOPIC,
        dedup_key=uuid.uuid4().hex,
        owner=OWNER,
    )
    pp = PullPoint.objects.create(owner=OWNER, address="http://testserver/wsn/pullpoints/x")
    reg = PublisherRegistration.objects.create(
        publisher_address="http://127.0.0.1:9/publisher", owner=OWNER, topic_paths=[CLOSED_TOPIC]
    )
    letter = DeadLetter.objects.create(
        subscription_id=str(sub.id),
        consumer_address=sub.consumer_address,
        notification_id=uuid.uuid4().hex,
        message=b"<door>open</door>",
        reason=DeadLetter.Reason.PERMANENT,
    )
    now = timezone.now()
    run = AnalyticsRun.objects.create(jobs=["traffic"], since=now - timedelta(hours=1), until=now)
    JobResult.objects.create(
        run=run, job="traffic", status=JobResult.Status.SUCCEEDED, columns=["n"], rows=[[1]]
    )
    token = api_token_create(principal=OWNER, name="guard")
    settings.HPWSN_SITE_NAME = "a"
    settings.HPWSN_FEDERATION_PEERS = peers_parse("b=http://127.0.0.1:9", own="a")
    return {
        "topic_pk": str(topic.pk),
        "sub": str(sub.id),
        "pp": str(pp.id),
        "reg": str(reg.id),
        "letter": str(letter.pk),
        "run": str(run.id),
        "token_pk": str(token.row.pk),
        "inbound": f"/federation/in/b/{inbound_token(settings.SECRET_KEY, 'b')}/",
    }


def _unchanged(objects: dict[str, str]) -> list[str]:
    """What an anonymous caller's requests changed, that they must not have."""
    from dispatch.models import DeadLetter
    from hpwsn_site.api.models import ApiToken
    from subscriptions.models import PublisherRegistration, PullPoint, Subscription
    from topics.models import Topic

    sub = Subscription.objects.filter(id=objects["sub"]).first()
    pp = PullPoint.objects.filter(id=objects["pp"]).first()
    checks = {
        "topic deleted or renamed": Topic.objects.filter(path=CLOSED_TOPIC).exists(),
        "subscription ended or paused": sub is not None and sub.state == Subscription.State.ACTIVE,
        "pull point destroyed": pp is not None and pp.destroyed_at is None,
        "registration destroyed": PublisherRegistration.objects.filter(id=objects["reg"]).exists(),
        "dead letter deleted or redriven": DeadLetter.objects.filter(
            pk=objects["letter"], redriven_at=None
        ).exists(),
        "token revoked": ApiToken.objects.filter(pk=objects["token_pk"], revoked_at=None).exists(),
        "token or topic created": not ApiToken.objects.exclude(pk=objects["token_pk"]).exists()
        and not Topic.objects.filter(path="guard-probe").exists(),
    }
    return [what for what, ok in checks.items() if not ok]


def _assert_refused(
    failures: list[str], checked: list[str], objects: dict[str, str], title: str
) -> None:
    """Fail with every route that was not refused, what anonymous requests changed, and the list
    of what was checked."""
    problems = failures + [f"changed by anonymous requests: {c}" for c in _unchanged(objects)]
    assert not problems, (
        title + "\n  " + "\n  ".join(problems) + "\nchecked:\n  " + "\n  ".join(checked)
    )


# ----------------------------------------------------------------------------- the requests


def _send(client: Client, call: Call, objects: dict[str, str]) -> Any:
    url = call.url.format(**objects)
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in call.headers.items()}
    with override_settings(**call.settings):
        return client.generic(
            call.method, url, data=call.body or b"", content_type=call.content_type, **extra
        )


def _refused(client: Client, response: Any, expect: str, objects: dict[str, str]) -> str | None:
    """None if `response` is the refusal `expect` names, else what was seen instead."""
    status = response.status_code
    seen = f"{status} {response.get('Location', '')}".strip()
    if expect.startswith("login:"):
        login = expect.removeprefix("login:")
        for _ in range(4):  # e.g. the admin's object URL redirects to its change page first
            if response.status_code not in (301, 302, 303, 307, 308):
                return seen
            location = urlsplit(response["Location"])
            if location.path == login:
                return None
            response = client.get(location.path, QUERY_STRING=location.query)
            seen += f" -> {response.status_code} {response.get('Location', '')}".rstrip()
        return seen
    if expect == "soap-not-authorized":
        body = response.content
        ok = status in (400, 500) and b"NotAuthorized" in body
        return None if ok else f"{seen} {body[:300]!r}"
    if expect.startswith("hides:"):
        hidden = expect.removeprefix("hides:").format(**objects)
        body = response.content.decode(errors="replace")
        return None if status == 200 and hidden not in body else f"{seen} {body[:300]}"
    return None if str(status) in expect.split("|") else f"{seen} {response.content[:300]!r}"


def _not_served_or_refused(
    client: Client, response: Any, expect: str, objects: dict[str, str]
) -> bool:
    """For a method the route does not list: 405, or the refusal the listed methods get."""
    return response.status_code == 405 or _refused(client, response, expect, objects) is None


def test_every_guarded_route_refuses_an_anonymous_caller(objects) -> None:  # type: ignore[no-untyped-def]
    client = Client()  # no credentials; CSRF not enforced (module docstring)
    routes = {r.key: r for r in django_routes()}
    table = dict(GUARDED)
    for route in routes.values():
        if _is_admin(route):
            table[route.key] = _login(_instantiate(route), ADMIN_LOGIN, ("GET", "POST"))
    checked, failures = [], []
    for key, calls in table.items():
        route = routes.get(key)
        if route is None:
            continue  # the inventory test names it
        for call in calls:
            path = call.url.format(**objects)
            match = resolve(urlsplit(path).path)
            if (
                _readable(match.route) != _readable(route.raw)
                or match.func is not route.pattern.callback
            ):
                failures.append(f"{key}: {path} resolves to {match.route}, not to this route")
                continue
            seen = _refused(client, _send(client, call, objects), call.expect, objects)
            checked.append(f"{key}: {call.method} {path} -> {call.expect}")
            if seen is not None:
                failures.append(f"{key}: {call.method} {path} answered {seen}, not {call.expect}")
        listed = {c.method for c in calls}
        for method in METHODS:
            if method in listed:
                continue
            other = Call(method, calls[0].url, calls[0].expect, body=calls[0].body)
            response = _send(client, other, objects)
            if not _not_served_or_refused(client, response, other.expect, objects):
                failures.append(
                    f"{key}: {method} {other.url.format(**objects)} answered "
                    f"{response.status_code}, neither refused nor 405"
                )
    _assert_refused(failures, checked, objects, "open to an anonymous caller:")


def test_policy_routes_refuse_an_anonymous_caller_what_the_policy_closes(objects) -> None:  # type: ignore[no-untyped-def]
    client = Client()
    routes = {r.key: r for r in django_routes()}
    checked, failures = [], []
    for key, (_reason, calls) in POLICY.items():
        route = routes.get(key)
        if route is None:
            continue  # the inventory test names it
        for call in calls:
            path = call.url.format(**objects)
            match = resolve(urlsplit(path).path)
            if _readable(match.route) != _readable(route.raw):
                failures.append(f"{key}: {path} resolves to {match.route}, not to this route")
                continue
            seen = _refused(client, _send(client, call, objects), call.expect, objects)
            checked.append(f"{key}: {call.method} {path} -> {call.expect}")
            if seen is not None:
                failures.append(f"{key}: {call.method} {path} answered {seen}, not {call.expect}")
    _assert_refused(failures, checked, objects, "not refused:")


# ----------------------------------------------------------------------------- the sockets


def test_every_socket_is_closed_to_a_caller_without_a_session(objects) -> None:  # type: ignore[no-untyped-def]
    from hpwsn_site.asgi import application

    async def connect(path: str) -> tuple[bool, object]:
        # An Origin of our own host, so that the refusal seen is the login's, not the origin's.
        headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
        comm = WebsocketCommunicator(application, path, headers=headers)
        result = await comm.connect(timeout=10)
        if result[0]:
            await comm.disconnect()
        else:
            await comm.wait()
        return result

    seen = {}
    for route, template in WEBSOCKETS.items():
        path = template.format(**objects)
        seen[route] = in_own_thread(lambda path=path: async_to_sync(connect)(path))
    assert seen == dict.fromkeys(WEBSOCKETS, (False, 4401)), seen


# ----------------------------------------------------------------------------- the fast path


def _asgi_post(app: Any, call: Call, objects: dict[str, str]) -> tuple[int, bytes] | None:
    """POST through the ASGI app; None when it handed the request to Django."""
    to_django: list[str] = []

    async def django_app(scope: Any, receive: Any, send: Any) -> None:
        to_django.append(scope["path"])

    body = call.body.encode() if isinstance(call.body, str) else call.body or b""
    headers = [(b"host", b"127.0.0.1"), (b"content-type", call.content_type.encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in call.headers.items()]

    async def run() -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []
        scope = {
            "type": "http", "method": "POST", "path": call.url.format(**objects),
            "scheme": "http", "headers": headers, "client": ("127.0.0.1", 50000),
        }  # fmt: skip

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(django_app)(scope, receive, send)
        return sent

    sent = asyncio.run(run())
    if to_django:
        return None
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


class _Answer:
    """An ASGI answer read like a test client's response."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status_code, self.content = status, body

    def get(self, _name: str, default: str = "") -> str:
        return default


def test_the_fast_path_serves_only_its_routes_and_refuses_what_they_close(
    objects, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from hpwsn_site.fastpath import wrap

    # Every path the site routes, each as a POST: which ones does the fast path keep for itself?
    paths = {_instantiate(r) for r in django_routes()}
    paths |= {c.url.format(**objects) for calls in GUARDED.values() for c in calls}
    paths |= {c.url.format(**objects) for _, calls in POLICY.values() for c in calls}
    paths |= {p.format(**objects) for p in WEBSOCKETS.values()}
    paths |= {"/", "/bench/echo/", "/static/x.js", "/wsn/subscriptions/x/"}

    def kept(app: Any) -> set[str]:
        out = set()
        for path in sorted(paths):
            ctype = "application/json" if path.startswith("/api/") else SOAP_CT
            if (
                _asgi_post(app, Call("POST", path, "", body=b"", content_type=ctype), {})
                is not None
            ):
                out.add(path)
        return out

    fast = [re.compile(rx) for rx, _ in FAST_PATH.values()]
    expected = {p for p in paths if any(rx.fullmatch(p) for rx in fast)}
    monkeypatch.delenv("HPWSN_BENCH_ENDPOINTS", raising=False)
    assert kept(wrap) == expected, "the fast path serves other paths than FAST_PATH lists"
    monkeypatch.setenv("HPWSN_BENCH_ENDPOINTS", "1")
    assert kept(wrap) == expected | {"/bench/echo/"}
    monkeypatch.delenv("HPWSN_BENCH_ENDPOINTS")

    failures, checked = [], []
    client = Client()
    for key, call in [
        *((k, c) for k, (_, c) in FAST_PATH.items()),
        ("bad token", FAST_PATH_BAD_TOKEN),
    ]:
        answer = _asgi_post(wrap, call, objects)
        if answer is None:
            failures.append(f"{key}: {call.url} went to Django, not the fast path")
            continue
        seen = _refused(client, _Answer(*answer), call.expect, objects)
        checked.append(f"{key}: POST {call.url.format(**objects)} -> {call.expect}")
        if seen is not None:
            failures.append(f"{key}: answered {seen}, not {call.expect}")
    _assert_refused(failures, checked, objects, "not refused:")
