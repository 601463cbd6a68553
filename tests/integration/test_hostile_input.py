"""Hostile input that takes more than one request to show: against the running platform.

The one-request cases (each with the fault it must get) are in test_bad_input.py's corpus, run
beside a canary publisher that must lose nothing.
"""

from __future__ import annotations

import re
import socket
import time
import uuid

import httpx
import pytest

from hpwsn import ns
from tests.support import (
    ANONYMOUS_ALLOWED,
    CT,
    notify_xml,
    soap_call,
    subscribe_xml,
    topic_with_policy,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def topic(committed) -> str:  # type: ignore[no-untyped-def]
    path = f"Hostile:I{uuid.uuid4().hex[:8]}"
    committed(topic_with_policy, path, root=ANONYMOUS_ALLOWED, **ANONYMOUS_ALLOWED)
    return path


# ----------------------------------------------------------------------------- the broker itself


@pytest.mark.parametrize(
    "path", ["/wsn/", "/wsn/pullpoints/does-not-exist", "/wsn/subscriptions/x", "/"]
)
def test_the_broker_refuses_its_own_endpoints_as_push_targets(platform, topic, path):
    port = platform.base_url.rsplit(":", 1)[1]
    for base in (platform.base_url, f"http://localhost:{port}"):
        res = soap_call(platform.endpoint, subscribe_xml(base + path, topic))

        assert res.status == 500, res.body[:500]
        assert res.fault_name == "SubscribeCreationFailedFault", res.body[:500]
        assert "this broker's own endpoint" in res.fault_text


def test_a_notify_to_an_existing_pull_point_is_refused_not_published(
    platform, consumer_factory, topic
):
    consumer = consumer_factory()
    assert soap_call(platform.endpoint, subscribe_xml(consumer.url, topic)).status == 200
    res = soap_call(platform.endpoint, "<wsnt:CreatePullPoint/>")
    pull_point = res.findtext(".//wsnt:PullPoint/wsa:Address")

    res = soap_call(pull_point, notify_xml((topic, "<x:n xmlns:x='urn:x'>looped</x:n>")))

    assert res.status == 500, res.body[:500]
    assert res.fault_name is None
    assert "Notify is not an operation of a pull point" in res.fault_text
    res = soap_call(platform.endpoint, notify_xml((topic, "<x:n xmlns:x='urn:x'>direct</x:n>")))
    assert res.status == 202
    assert consumer.wait_for(1)
    time.sleep(0.5)  # a looped copy would arrive beside the direct one
    assert consumer.payload_texts() == ["direct"]


# ----------------------------------------------------------------------------- namespaces


def test_each_delivered_message_carries_only_the_namespaces_it_uses(
    platform, consumer_factory, topic
):
    consumer = consumer_factory()
    assert soap_call(platform.endpoint, subscribe_xml(consumer.url, topic)).status == 200
    unused = "".join(f' xmlns:u{i}="urn:hpwsn:test:unused:{i}"' for i in range(200))
    messages = "".join(
        f'<wsnt:NotificationMessage><wsnt:Topic Dialect="{ns.DIALECT_SIMPLE}">{topic}'
        f'</wsnt:Topic><wsnt:Message><d:m xmlns:d="urn:d" xmlns:xsi="{ns.XSI}" '
        f'xsi:type="u7:kind">{i}</d:m></wsnt:Message></wsnt:NotificationMessage>'
        for i in range(3)
    )
    envelope = (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}"><s:Body{unused}>'
        f"<wsnt:Notify>{messages}</wsnt:Notify></s:Body></s:Envelope>"
    )
    res = httpx.post(
        platform.endpoint, content=envelope.encode(), headers={"Content-Type": CT["1.1"]}
    )
    assert res.status_code == 202, res.content[:500]

    assert consumer.wait_for(3)
    assert sorted(consumer.payload_texts()) == ["0", "1", "2"]
    for received in consumer.received:
        # Of the 200 declarations in scope, only the one a QName uses (u7) travels.
        assert set(re.findall(rb"urn:hpwsn:test:unused:(\d+)", received.raw)) == {b"7"}
        # The QName in xsi:type keeps its binding.
        assert received.payload is not None
        assert received.payload.nsmap.get("u7") == "urn:hpwsn:test:unused:7"


# ----------------------------------------------------------------------------- SOAP versions


def test_a_soap_1_2_envelope_sent_as_text_xml_is_answered_in_soap_1_2(
    platform, consumer_factory, topic
):
    """ZoneMinder's way: the envelope's namespace says SOAP 1.2, the media type says 1.1."""
    consumer = consumer_factory()
    envelope = (
        f'<e:Envelope xmlns:e="{ns.SOAP12}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}">'
        f"<e:Header/><e:Body>{subscribe_xml(consumer.url, topic)}</e:Body></e:Envelope>"
    )
    res = httpx.post(
        platform.endpoint, content=envelope.encode(), headers={"Content-Type": "text/xml"}
    )

    assert res.status_code == 200, res.content[:500]
    assert res.headers["content-type"].startswith("application/soap+xml")
    assert f'xmlns:soap="{ns.SOAP12}"'.encode() in res.content
    assert b"SubscriptionReference" in res.content
    notify = envelope.replace(
        subscribe_xml(consumer.url, topic), notify_xml((topic, "<x:z xmlns:x='urn:x'>zm</x:z>"))
    )
    res = httpx.post(
        platform.endpoint, content=notify.encode(), headers={"Content-Type": CT["1.1"]}
    )
    assert res.status_code == 202, res.content[:500]
    assert consumer.wait_for(1)
    assert consumer.received[0].soap_version == "1.2"  # pushed in the version it subscribed with


# ----------------------------------------------------------------------------- slow clients


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        data = sock.recv(4096)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return data == b"" or data.startswith(b"HTTP/1.1 408")


def test_half_sent_requests_are_cut_off_while_valid_requests_are_answered(
    platform, consumer_factory, topic
):
    consumer = consumer_factory()
    assert soap_call(platform.endpoint, subscribe_xml(consumer.url, topic)).status == 200
    host, port = platform.base_url.removeprefix("http://").split(":")
    body = (
        f'<s:Envelope xmlns:s="{ns.SOAP11}"><s:Body><wsnt:Notify xmlns:wsnt="{ns.WSNT}">'
    ).encode()
    socks = []
    for i in range(100):
        sock = socket.create_connection((host, int(port)), timeout=10)
        if i % 2:  # half their headers
            sock.sendall(f"POST /wsn/ HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Ty".encode())
        else:  # all headers, and half the body they announced
            sock.sendall(
                f"POST /wsn/ HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {CT['1.1']}\r\n"
                f"Content-Length: {len(body) * 2}\r\n\r\n".encode()
                + body
            )
        sock.setblocking(False)
        socks.append(sock)
    try:
        res = soap_call(platform.endpoint, notify_xml((topic, "<x:s xmlns:x='urn:x'>ok</x:s>")))
        assert res.status == 202, res.body[:500]
        assert consumer.wait_for(1)

        # HPWSN_HEADER_TIMEOUT_S=3 and HPWSN_BODY_TIMEOUT_S=5 on the test platform.
        held = set(range(len(socks)))

        def all_cut_off() -> bool:
            held.difference_update({i for i in held if _closed_by_server(socks[i])})
            return not held

        wait_until(all_cut_off, timeout=30, interval=0.2)
        assert held == set(), f"{len(held)} of 100 half-sent requests still held"
    finally:
        for sock in socks:
            sock.close()


# ----------------------------------------------------------------------------- legacy endpoint


def test_a_client_fault_on_the_legacy_endpoint_is_logged_as_a_client_error(platform):
    marker = f"NOWHERE{uuid.uuid4().hex[:8]}"
    inner = (
        f'&lt;wsnt:NotificationMessage xmlns:wsnt="{ns.WSNT}"&gt;&lt;wsnt:Topic '
        f'Dialect="{ns.DIALECT_SIMPLE}"&gt;{marker}&lt;/wsnt:Topic&gt;&lt;wsnt:Message&gt;'
        "&lt;x/&gt;&lt;/wsnt:Message&gt;&lt;/wsnt:NotificationMessage&gt;"
    )
    envelope = (
        '<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" '
        f'xmlns:org="{ns.LEGACY}"><soapenv:Body><org:WsnProcess><org:message>{inner}'
        "</org:message></org:WsnProcess></soapenv:Body></soapenv:Envelope>"
    )
    res = httpx.post(
        platform.base_url + "/wsn/legacy/",
        content=envelope.encode(),
        headers={"Content-Type": CT["1.1"]},
        timeout=30,
    )
    assert res.status_code == 500
    assert b"Client</faultcode>" in res.content

    log = platform.log_dir / "web.log"
    assert wait_until(lambda: marker in log.read_text(errors="replace"), timeout=10)
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if marker in ln]
    assert all("client fault on /wsn/legacy/" in ln for ln in lines), lines
    text = log.read_text(errors="replace")
    tail = text[max(0, text.index(marker) - 2000) :]
    assert "Internal Server Error: /wsn/legacy/" not in tail
    assert "Traceback" not in tail
