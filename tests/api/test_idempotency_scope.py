"""A publication's idempotency key is the caller's own: another anonymous caller's key, or a long
key that shares its first characters with another, never makes a message vanish behind a 202."""

from __future__ import annotations

import time
import uuid

import httpx

from tests.support import notify_xml, soap_call, subscribe_xml

TOPIC = "ALL:ALARM:ALARM1:ALARM13"  # anonymous callers may publish here (the demo tree)
ENVELOPE = (
    '<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/" '
    'xmlns:wsnt="http://docs.oasis-open.org/wsn/b-2" '
    'xmlns:wsa="http://www.w3.org/2005/08/addressing">'
    "<s:Header>{header}</s:Header><s:Body>{body}</s:Body></s:Envelope>"
)


def _from(source: str) -> httpx.Client:
    """A client whose connections come from `source` (another address of the loopback)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30)


def _notify(text: str, *, message_id: str = "", key: str = "") -> tuple[bytes, dict[str, str]]:
    header = f"<wsa:MessageID>{message_id}</wsa:MessageID>" if message_id else ""
    body = ENVELOPE.format(header=header, body=notify_xml((TOPIC, f"<m xmlns='urn:t'>{text}</m>")))
    headers = {"Content-Type": "text/xml; charset=utf-8"}
    if key:
        headers["Idempotency-Key"] = key
    return body.encode(), headers


def _subscribed(platform, consumer_factory):  # type: ignore[no-untyped-def]
    consumer = consumer_factory()
    res = soap_call(platform.endpoint, subscribe_xml(consumer.url, TOPIC))
    assert res.status == 200, res.body
    return consumer


def _received(consumer, n: int) -> list[str]:  # type: ignore[no-untyped-def]
    assert consumer.wait_for(n), consumer.payload_texts()
    time.sleep(1.0)  # one more, if any, would arrive within this
    return sorted(consumer.payload_texts())


def test_two_anonymous_publishers_with_the_same_message_id_are_both_delivered(
    platform, consumer_factory
):  # type: ignore[no-untyped-def]
    # The message id is guessable (or simply reused by another program): before, the first
    # anonymous caller's id made the second's Notify answer 202 and store nothing.
    consumer = _subscribed(platform, consumer_factory)
    message_id = f"urn:uuid:{uuid.uuid4()}"
    answers = []
    for source, text in (("127.0.0.2", "first"), ("127.0.0.3", "second"), ("127.0.0.3", "again")):
        data, headers = _notify(text, message_id=message_id)
        with _from(source) as client:
            r = client.post(platform.endpoint, content=data, headers=headers)
        answers.append(r.status_code)
    assert answers == [202, 202, 202]
    # The third repeats the second caller's own id: stored once.
    assert _received(consumer, 2) == ["first", "second"]


def test_two_anonymous_rest_publishers_with_the_same_key_are_both_delivered(
    platform, consumer_factory
):  # type: ignore[no-untyped-def]
    consumer = _subscribed(platform, consumer_factory)
    url = f"{platform.base_url}/api/v1/topics/{TOPIC}/messages"
    key = {"Idempotency-Key": "order-4711"}  # the README's example
    ids = []
    for source, text in (("127.0.0.2", "first"), ("127.0.0.3", "second"), ("127.0.0.3", "again")):
        with _from(source) as client:
            r = client.post(url, json={"xml": f"<m xmlns='urn:t'>{text}</m>"}, headers=key)
        assert r.status_code == 202, r.text
        ids.append(r.json()["ids"])
    assert ids[0] != ids[1]
    assert ids[1] == ids[2]
    assert _received(consumer, 2) == ["first", "second"]


def test_long_keys_that_differ_after_200_characters_are_two_publications(
    platform, consumer_factory, api
):  # type: ignore[no-untyped-def]
    # The SOAP edge's fast path and the REST publish once kept the first 200 characters of a key:
    # the second of two such keys was answered with the first's ids and never stored.
    consumer = _subscribed(platform, consumer_factory)
    stem = "k" * 240
    for n in (1, 2):
        data, headers = _notify(f"soap{n}", key=f"{stem}-{uuid.uuid4().hex}")
        assert httpx.post(platform.endpoint, content=data, headers=headers).status_code == 202
    ids = []
    for n in (1, 2):
        r = api.call(
            "POST",
            f"/topics/{TOPIC}/messages",
            "publisher1",
            json={"xml": f"<m xmlns='urn:t'>rest{n}</m>"},
            headers={"Idempotency-Key": f"{stem}-{uuid.uuid4().hex}"},
        )
        assert r.status_code == 202, r.text
        ids.append(r.json()["ids"])
    assert ids[0] != ids[1]
    assert _received(consumer, 4) == ["rest1", "rest2", "soap1", "soap2"]
