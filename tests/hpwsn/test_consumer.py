"""The consumer server, fed with the broker's own push envelopes and by the client."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import httpx
import pytest

from hpwsn import ns, wsn
from hpwsn.client import ReceivedMessage, WsnClient
from hpwsn.consumer import ConsumerServer

SOAP_CT = {"1.1": "text/xml; charset=utf-8", "1.2": "application/soap+xml; charset=utf-8"}


def _push(
    version: str,
    items: Sequence[tuple[str | None, bytes]],
    *,
    to: str = "http://c/",
    message_id: str = "urn:uuid:1",
) -> tuple[bytes, dict[str, str]]:
    """A Notify exactly as the broker pushes it (hpwsn.wsn.notify_envelope)."""
    body = wsn.notify_envelope(version=version, to=to, message_id=message_id, items=list(items))
    headers = {"Content-Type": SOAP_CT[version]}
    if version == "1.1":
        headers["SOAPAction"] = f'"{ns.ACTION_NOTIFY}"'
    return body, headers


def _fragment(topic: str, message: bytes, nsmap: dict[str, str] | None = None) -> bytes:
    dialect = ns.DIALECT_CONCRETE if "/" in topic else ns.DIALECT_SIMPLE
    return (
        wsn.topic_element(topic, dialect, nsmap) + b"<wsnt:Message>" + message + b"</wsnt:Message>"
    )


@pytest.fixture
def consumer() -> Iterator[ConsumerServer]:
    with ConsumerServer() as server:
        yield server


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_it_records_a_pushed_notify_with_its_message_id_and_soap_version(
    consumer: ConsumerServer, version: str
) -> None:
    body, headers = _push(
        version,
        [
            (
                "http://b/wsn/subscriptions/7",
                _fragment("tns:ALL/ALARM", b"<alarm>on</alarm>", {"tns": "urn:t"}),
            )
        ],
        message_id="urn:uuid:abc",
    )
    resp = httpx.post(consumer.url, content=body, headers=headers)
    assert resp.status_code == 200
    assert resp.content == b""
    [m] = consumer.messages
    assert (m.topic, m.topic_dialect) == ("tns:ALL/ALARM", ns.DIALECT_CONCRETE)
    assert m.topic_namespaces == {"tns": "urn:t"}
    assert m.subscription_address == "http://b/wsn/subscriptions/7"
    assert m.payload == b"<alarm>on</alarm>"
    assert (m.message_id, m.soap_version) == ("urn:uuid:abc", version)
    assert m.received_at.tzinfo is not None


def test_it_records_every_message_of_a_notify_in_order(consumer: ConsumerServer) -> None:
    items = [(None, _fragment("ALL:ALARM", f"<n>{i}</n>".encode())) for i in range(5)]
    body, headers = _push("1.1", items)
    assert httpx.post(consumer.url, content=body, headers=headers).status_code == 200
    assert [m.payload for m in consumer.messages] == [f"<n>{i}</n>".encode() for i in range(5)]
    assert all(m.subscription_address is None for m in consumer.messages)


def test_it_records_raw_bodies_whole_with_no_topic(consumer: ConsumerServer) -> None:
    xml = b'<alarm xmlns="urn:a" level="3">on</alarm>'
    raw = {"Content-Type": "application/xml; charset=utf-8"}
    assert httpx.post(consumer.url + "raw", content=xml, headers=raw).status_code == 200
    assert httpx.post(consumer.url, content=b"plain <text>", headers=raw).status_code == 200
    first, second = consumer.messages
    assert (first.topic, first.payload, first.soap_version) == (None, xml, None)
    assert first.element is not None
    assert first.element.get("level") == "3"
    assert (second.topic, second.payload, second.element) == (None, b"plain <text>", None)


def test_it_answers_the_configured_status_and_keeps_only_accepted_messages() -> None:
    body, headers = _push("1.2", [(None, _fragment("ALL", b"<a/>"))])
    with ConsumerServer(status=503) as consumer:
        assert httpx.post(consumer.url, content=body, headers=headers).status_code == 503
        assert consumer.messages == []
        consumer.status = 204
        assert httpx.post(consumer.url, content=body, headers=headers).status_code == 204
        assert len(consumer.messages) == 1
        assert consumer.requests == 2


def test_it_refuses_a_dtd_with_a_soap_fault(consumer: ConsumerServer) -> None:
    evil = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><x>&e;</x>'
    resp = httpx.post(consumer.url, content=evil, headers={"Content-Type": SOAP_CT["1.1"]})
    assert resp.status_code == 400
    assert b"Fault" in resp.content
    assert consumer.messages == []


def test_it_refuses_an_envelope_that_is_not_a_notify(consumer: ConsumerServer) -> None:
    body = (
        f'<s:Envelope xmlns:s="{ns.SOAP12}"><s:Body><wsnt:Subscribe xmlns:wsnt="{ns.WSNT}"/>'
        "</s:Body></s:Envelope>"
    ).encode()
    resp = httpx.post(consumer.url, content=body, headers={"Content-Type": SOAP_CT["1.2"]})
    assert resp.status_code == 400
    assert consumer.messages == []


def test_wait_for_times_out_when_too_few_arrive(consumer: ConsumerServer) -> None:
    body, headers = _push("1.1", [(None, _fragment("ALL", b"<a/>"))])
    httpx.post(consumer.url, content=body, headers=headers)
    assert consumer.wait_for(1, timeout=1)
    assert not consumer.wait_for(2, timeout=0.05)


def test_it_calls_on_message_for_each_message() -> None:
    got: list[ReceivedMessage] = []
    arrived = threading.Event()

    def on_message(message: ReceivedMessage) -> None:
        got.append(message)
        if len(got) == 2:
            arrived.set()

    with ConsumerServer(on_message=on_message) as consumer, WsnClient(consumer.url) as client:
        client.notify_many([("ALL:A", "<a/>"), ("ALL:B", "text & more")])
        assert arrived.wait(5)
    assert [(m.topic, m.payload) for m in got] == [
        ("ALL:A", b"<a/>"),
        ("ALL:B", b"text &amp; more"),
    ]


def test_a_consumer_keeps_only_as_many_messages_as_asked() -> None:
    # `hpwsn listen` kept every message pushed to it, parsed document included, for as long as
    # it ran: anyone who could reach it (it listens beyond loopback for a remote broker) grew
    # it by 16 MB a POST until it was killed.
    got: list[ReceivedMessage] = []
    with (
        ConsumerServer(keep=0, on_message=got.append) as none,
        ConsumerServer(keep=2) as latest,
        WsnClient(none.url) as to_none,
        WsnClient(latest.url) as to_latest,
    ):
        for n in range(5):
            to_none.notify("ALL", f"<m>{n}</m>")
            to_latest.notify("ALL", f"<m>{n}</m>")
        assert none.wait_for(5)
        assert latest.wait_for(5)
        assert none.messages == []
        assert [m.payload for m in latest.messages] == [b"<m>3</m>", b"<m>4</m>"]
    assert len(got) == 5


def test_it_takes_many_pushes_over_keep_alive(consumer: ConsumerServer) -> None:
    body, headers = _push("1.1", [(None, _fragment("ALL", b"<a/>"))])
    with httpx.Client() as http:
        for _ in range(300):
            assert http.post(consumer.url, content=body, headers=headers).status_code == 200
    assert consumer.wait_for(300, timeout=5)


def test_stop_frees_the_port_and_can_be_called_twice() -> None:
    consumer = ConsumerServer().start()
    port = consumer.port
    consumer.stop()
    consumer.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"http://127.0.0.1:{port}/", content=b"<a/>")
    with ConsumerServer(port=port) as again:
        assert again.url == f"http://127.0.0.1:{port}/"
