"""Consumer addresses written to reach what the push allow-list refuses: other spellings of an
address, IPv6 forms that carry an IPv4 one, URL parser tricks, and DNS answers that change.

tests/hpwsn/test_targets.py has the plain cases. Here the numeric spellings go through the system
resolver (getaddrinfo reads 0x7f.1 and 2130706433 itself, no DNS involved), names whose answer a
test must choose through the policy's resolver hook, and pushes over real sockets on 127.0.0.x.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from dispatch import push
from hpwsn.client import WsnClientError
from hpwsn.targets import TargetPolicy, TargetRefused
from tests.support import free_port, soap_call, subscribe_xml

METADATA_SPELLINGS = [
    "http://169.254.169.254/",
    "http://2852039166/",  # decimal
    "http://0251.0376.0251.0376/",  # octal
    "http://0xa9.0xfe.0xa9.0xfe/",  # hex by part
    "http://0xa9fea9fe/",  # hex whole
    "http://169.254.43518/",  # short form: a.b.c16
    "http://[::ffff:169.254.169.254]/",  # IPv4-mapped
    "http://[::ffff:a9fe:a9fe]/",
    "http://[0:0:0:0:0:ffff:169.254.169.254]/",
    "http://[::169.254.169.254]/",  # IPv4-compatible
    "http://[::ffff:0:a9fe:a9fe]/",  # IPv4-translated (SIIT)
    "http://[2002:a9fe:a9fe::]/",  # 6to4
    "http://[2002:a9fe:a9fe:1::1]/",
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64, well-known prefix
    "http://[64:ff9b:1::a9fe:a9fe]/",  # NAT64, local-use prefix
    "http://[fe80::1%25eth0]/",  # link-local with a zone id
    "http://[fe80::a9fe:a9fe%25lo]/",
    "http://127.0.0.1@169.254.169.254/",  # userinfo: the host is after the last @
    "http://a@b@169.254.169.254/",
    "http://127.0.0.1%2f@169.254.169.254/",
    "http://127.0.0.1\\@169.254.169.254/",  # backslash: urlsplit reads it as userinfo too
    "http://100.100.100.200/",  # Alibaba Cloud metadata
    "http://[fd00:ec2::254]/",  # AWS metadata over IPv6
    "http://0/",  # 0.0.0.0
    "http://[::]/",
]


@pytest.mark.parametrize("url", METADATA_SPELLINGS)
def test_every_spelling_of_a_metadata_or_link_local_address_is_refused_even_by_a_star(url):
    with pytest.raises(TargetRefused, match="always refused"):
        TargetPolicy(["*"]).check(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://2130706433/",
        "http://0177.0.0.1/",
        "http://0x7f.1/",
        "http://127.1/",
        "http://[0:0:0:0:0:ffff:127.0.0.1]/",
        "http://[::ffff:7f00:1]/",
    ],
)
def test_other_spellings_of_loopback_are_loopback_and_a_narrower_list_refuses_them(url):
    """Accepted by the default list as what they are (127.0.0.1), never as another address; a
    list narrowed to 127.0.0.2 refuses them, whatever the spelling."""
    assert TargetPolicy().check(url).addresses in (("127.0.0.1",), ("::ffff:7f00:1",))
    with pytest.raises(TargetRefused, match=r"127\.0\.0\.1, which is outside the push allow-list"):
        TargetPolicy(["127.0.0.2/32"]).check(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://[::127.0.0.2]/",  # IPv4-compatible: an IPv6 address of its own, not loopback
        "http://[64:ff9b::7f00:2]/",
        "http://[2002:7f00:2::]/",
    ],
)
def test_ipv6_forms_carrying_an_allowed_ipv4_address_are_not_taken_for_it(url):
    with pytest.raises(TargetRefused, match="outside the push allow-list"):
        TargetPolicy(["127.0.0.0/8"]).check(url)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:0/c", "port 0"),
        ("http://127.0.0.1:65536/c", "invalid port"),
        ("http://127.0.0.1:+80/c", "invalid port"),
        ("http://127.0.0.1:\u0668\u0660/c", "invalid port"),  # Arabic-Indic digits
        ("http://127.0.0.1/a\tb", r"U\+0009"),
        ("http://127.0.0.1/a\nb", r"U\+000A"),
        ("http://127.0.\t0.1/", r"U\+0009"),
        ("http://127.0.0.1\r\nHost: 169.254.169.254/", r"U\+000D"),
        ("gopher://127.0.0.1:70/_GET", "is not an http"),
        ("file:///etc/passwd", "is not an http"),
        ("ftp://127.0.0.1/", "is not an http"),
        ("ws://127.0.0.1/", "is not an http"),
        ("http:/127.0.0.1/", "has no host"),
        ("http:127.0.0.1/", "has no host"),
    ],
)
def test_a_url_whose_port_scheme_or_characters_are_hostile_is_refused(url, reason):
    with pytest.raises(TargetRefused, match=reason):
        TargetPolicy(["*"]).check(url)


def _answers(table: dict[str, list[str]]) -> Callable[[str, int], list[str]]:
    def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise TargetRefused(f"host '{host}' does not resolve")
        return table[host]

    return resolve


@pytest.mark.parametrize(
    "answer",
    [
        ["127.0.0.1", "169.254.169.254"],
        ["169.254.169.254", "127.0.0.1"],
        ["::1", "::ffff:169.254.169.254"],
        ["127.0.0.1", "fe80::1%eth0"],
        ["127.0.0.1", "64:ff9b::a9fe:a9fe"],
    ],
)
def test_a_name_with_one_refused_address_among_its_answers_is_refused(answer):
    dns = _answers({"multi.example.com": answer})
    for allow in (["127.0.0.0/8", "::1/128"], ["*"], ["multi.example.com"], [".example.com"]):
        with pytest.raises(TargetRefused, match="always refused"):
            TargetPolicy(allow, resolver=dns).check("http://multi.example.com/")


def test_a_name_allowed_by_name_is_not_allowed_in_a_lookalike_spelling():
    """A lookalike that the IDNA codec or the resolver turns into the allowed name is not that
    name to the list: its addresses must be inside the networks."""
    dns = _answers(
        {
            "consumer.example.com": ["203.0.113.7"],
            "consumer.example.com.": ["203.0.113.7"],
            "\uff43onsumer.example.com": ["203.0.113.7"],  # fullwidth c
            "consumer.example.com.evil.test": ["203.0.113.7"],
            "evilexample.com": ["203.0.113.7"],
        }
    )
    by_name = TargetPolicy(["127.0.0.0/8", "consumer.example.com"], resolver=dns)
    by_suffix = TargetPolicy(["127.0.0.0/8", ".example.com"], resolver=dns)
    assert by_name.check("http://consumer.example.com/").addresses == ("203.0.113.7",)
    assert by_suffix.check("http://consumer.example.com/").addresses == ("203.0.113.7",)
    for policy, host in (
        (by_name, "consumer.example.com."),
        (by_name, "\uff43onsumer.example.com"),
        (by_name, "consumer.example.com.evil.test"),
        (by_suffix, "consumer.example.com.evil.test"),
        (by_suffix, "evilexample.com"),
    ):
        with pytest.raises(TargetRefused, match="outside the push allow-list"):
            policy.check(f"http://{host}/")


# ----------------------------------------------------------------------------- pushes


@dataclass
class _Listener:
    """An HTTP server on one loopback address that records the Host header of every POST."""

    host: str
    port: int
    hosts: list[str] = field(default_factory=list)

    def start(self) -> _Listener:
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                listener.hosts.append(self.headers.get("Host", ""))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((self.host, self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listeners() -> Iterator[tuple[_Listener, _Listener]]:
    """One server on 127.0.0.1 and one on 127.0.0.2, on the same port."""
    port = free_port()
    pair = (_Listener("127.0.0.1", port).start(), _Listener("127.0.0.2", port).start())
    yield pair
    for listener in pair:
        listener.stop()


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[str]]]:
    """The answers the push policy's resolver gives, which a test may change; only 127.0.0.2 is
    allowed, and every push checks its URL again (no cached check)."""
    table: dict[str, list[str]] = {}
    monkeypatch.setattr(push, "_policy", TargetPolicy(["127.0.0.2/32"], resolver=_answers(table)))
    monkeypatch.setattr(push, "_resolved", {})
    monkeypatch.setattr(push, "RESOLVE_TTL_S", 0.0)
    monkeypatch.setattr(push, "_clients", type(push._clients)())
    yield table
    for held in push._clients.values():
        held.client.close()


def test_a_push_connects_to_the_checked_address_not_to_what_the_name_resolves_to_later(
    dns, listeners
):
    """The system resolves localhost to 127.0.0.1, the policy's resolver says 127.0.0.2: the
    push goes where the policy looked, with the name kept in the Host header."""
    low, allowed = listeners
    dns["localhost"] = ["127.0.0.2"]
    url = f"http://localhost:{allowed.port}/c"

    assert push.post(url, b"<x/>", soap_version="1.1").ok
    assert allowed.hosts == [f"localhost:{allowed.port}"]
    assert low.hosts == []


def test_a_name_rebound_to_a_refused_address_gets_no_further_push(dns, listeners):
    low, allowed = listeners
    dns["localhost"] = ["127.0.0.2"]
    url = f"http://localhost:{allowed.port}/c"
    assert push.post(url, b"<x/>", soap_version="1.1").ok

    dns["localhost"] = ["127.0.0.1"]  # the answer changes: a kept connection must not be used
    outcome = push.post(url, b"<x/>", soap_version="1.1")

    assert not outcome.ok
    assert outcome.permanent
    assert "outside the push allow-list" in outcome.detail
    assert len(allowed.hosts) == 1
    assert low.hosts == []


def _demand_call(url: str) -> str | None:
    """Unsubscribe at a demand publisher as the broker calls it; the client's error, if any."""
    from subscriptions.registrations import _client

    try:
        with _client(url) as client:
            client.unsubscribe(url)
    except WsnClientError as exc:
        return str(exc)
    return None


def test_a_call_to_a_demand_publisher_connects_to_the_checked_address(dns, listeners):
    """The broker's calls to a demand publisher go where the allow-list looked, as pushes do,
    not where the name resolves when the connection is made."""
    low, allowed = listeners
    dns["localhost"] = ["127.0.0.2"]
    _demand_call(f"http://localhost:{allowed.port}/publisher")  # its empty answer is no matter
    assert allowed.hosts == [f"localhost:{allowed.port}"]
    assert low.hosts == []


def test_a_demand_publisher_s_name_rebound_to_a_refused_address_is_not_called(dns, listeners):
    low, allowed = listeners
    dns["localhost"] = ["127.0.0.1"]
    error = _demand_call(f"http://localhost:{allowed.port}/publisher")
    assert error is not None
    assert "outside the push allow-list" in error
    assert allowed.hosts == low.hosts == []


@pytest.mark.parametrize(
    "template",
    [
        "http://127.0.0.1@127.0.0.2:{port}/c",
        "http://127.0.0.1\\@127.0.0.2:{port}/c",
        "http://a@b@127.0.0.2:{port}/c",
    ],
)
def test_a_url_with_userinfo_is_pushed_to_the_host_after_its_last_at_sign(dns, listeners, template):
    low, allowed = listeners
    outcome = push.post(template.format(port=allowed.port), b"<x/>", soap_version="1.1")

    assert outcome.ok, outcome
    assert allowed.hosts == [f"127.0.0.2:{allowed.port}"]
    assert low.hosts == []


def test_a_push_to_port_zero_is_refused_and_reaches_no_default_port(dns):
    dns["localhost"] = ["127.0.0.2"]
    outcome = push.post("http://127.0.0.2:0/c", b"<x/>", soap_version="1.1")

    assert not outcome.ok
    assert outcome.permanent
    assert "port 0" in outcome.detail


# ----------------------------------------------------------------------------- Subscribe

REFUSED_AT_SUBSCRIBE = [
    "http://2852039166/latest/meta-data/",
    "http://0251.0376.0251.0376/",
    "http://0xa9.0xfe.0xa9.0xfe/",
    "http://[::ffff:169.254.169.254]/",
    "http://[::169.254.169.254]/",
    "http://[2002:a9fe:a9fe::]/",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://[fe80::1%25eth0]/",
    "http://127.0.0.1@169.254.169.254/",
    "http://127.0.0.1\\@169.254.169.254/",
    "http://10.0.0.5/c",
    "http://127.0.0.1:0/c",
    "http://127.0.0.1:65536/c",
    "gopher://127.0.0.1:70/_x",
]


@pytest.mark.integration
@pytest.mark.parametrize("url", REFUSED_AT_SUBSCRIBE)
def test_subscribe_over_soap_refuses_every_hostile_consumer_address(platform, url):
    res = soap_call(platform.endpoint, subscribe_xml(url.replace("&", "&amp;"), "ALL"))

    assert res.status == 500, res.body[:500]
    assert res.fault_name in ("SubscribeCreationFailedFault", None), res.body[:500]
    assert "refused" in res.fault_text or "not a valid URL" in res.fault_text, res.fault_text


@pytest.mark.integration
@pytest.mark.parametrize("url", REFUSED_AT_SUBSCRIBE)
def test_the_rest_api_refuses_every_hostile_consumer_address(platform, url):
    api = platform.base_url + "/api/v1/subscriptions"
    auth = ("subscriber1", "hpwsn-demo")
    resp = httpx.post(api, json={"consumer": url, "topic": "ALL:ALARM"}, auth=auth, timeout=30)

    # 400 for an address no client could be handed, 403 for one the allow-list refuses.
    assert resp.status_code in (400, 403), resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    detail = resp.json()["detail"]
    assert "refused" in detail or "valid URL" in detail, detail
    listed = httpx.get(api, auth=auth, timeout=30)
    assert listed.status_code == 200
    assert url not in listed.text
