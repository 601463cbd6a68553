"""Fragmentation end to end (thesis 5.3.3.4 and test case 功能-03), on the real platform.

The publisher plays the thesis's sending node: it cuts messages of 2, 5, 10 and 100 times its
fragment size (PUBLISHER_SIZE) into `wsnt:Package` fragments. With partial delivery forbidden the
broker reassembles them and the subscriber receives one whole message; with partial delivery
allowed the subscriber receives the fragments and reassembles them with `hpwsn.fragment`. The
platform itself pushes messages whose payload exceeds its HPWSN_FRAGMENT_SIZE (64 KiB in the test
platform, above every whole message of the inbound cases) as fragments.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections.abc import Iterator
from xml.sax.saxutils import escape

import httpx
import pytest
import redis.asyncio as aioredis
from lxml import etree

from dispatch import fragments
from hpwsn import fragment, ns, wsn
from hpwsn.fragment import Fragment
from hpwsn_site import state
from tests.integration.test_legacy import WSNT_DECL, returned_text, wsn_process
from tests.support import (
    ANONYMOUS_ALLOWED,
    NSMAP,
    RecordingConsumer,
    SoapResult,
    soap_call,
    subscribe_xml,
    topic_with_policy,
    wait_until,
)

pytestmark = pytest.mark.integration

TOPIC = "ALL"  # 功能-03 publishes on ALL
# Whose reassemblies these tests' anonymous calls over the loopback make (acl.Principal.publisher).
LOOPBACK = "@127.0.0.1"
PUBLISHER_SIZE = 512
MULTIPLES = [2, 5, 10, 100]
T = f"{{{ns.WSNT}}}"


# ----------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def subscriber(platform) -> Iterator[RecordingConsumer]:  # type: ignore[no-untyped-def]
    """One consumer subscribed to ALL for the whole module; each test picks its own messages."""
    consumer = RecordingConsumer().start()
    res = soap_call(platform.endpoint, subscribe_xml(consumer.url, TOPIC))
    assert res.status == 200, res.body
    address = res.findtext(".//wsnt:SubscriptionReference/wsa:Address")
    yield consumer
    soap_call(address, "<wsnt:Unsubscribe/>", to=address)
    consumer.stop()


def xml_payload(token: str, n_bytes: int) -> bytes:
    """A document of about n_bytes: elements, attributes, escaped markup and CJK text."""
    rng = random.Random(token)
    lines = []
    size = 0
    i = 0
    while size < n_bytes:
        words = " ".join(rng.choice(["alarm", "告警", "a<b", "x&y", "€", "😀"]) for _ in range(8))
        line = f'<e:line n="{i}">{escape(words)}</e:line>'
        lines.append(line)
        size += len(line.encode())
        i += 1
    return f'<e:doc xmlns:e="urn:frag" token="{token}">{"".join(lines)}</e:doc>'.encode()


def c14n(el: etree._Element) -> bytes:
    return etree.tostring(el, method="c14n", exclusive=True)


def notification_xml(f: Fragment, *, topic: str = TOPIC, decl: str = "") -> str:
    return (
        f"<wsnt:NotificationMessage{decl}>"
        f'<wsnt:Topic Dialect="{ns.DIALECT_SIMPLE}">{topic}</wsnt:Topic>'
        f"{f.package_xml()}{f.message_xml()}</wsnt:NotificationMessage>"
    )


def notify(platform, parts: list[Fragment], **kwargs) -> SoapResult:  # type: ignore[no-untyped-def]
    body = "".join(notification_xml(f, **kwargs) for f in parts)
    return soap_call(platform.endpoint, f"<wsnt:Notify>{body}</wsnt:Notify>")


def publish_in_notifies(platform, parts: list[Fragment], per_notify: int = 10) -> None:  # type: ignore[no-untyped-def]
    for i in range(0, len(parts), per_notify):
        res = notify(platform, parts[i : i + per_notify])
        assert res.status == 202, res.body


def publish_legacy(platform, f: Fragment) -> None:  # type: ignore[no-untyped-def]
    """One fragment per thesis WsnProcess envelope (figure 5-4)."""
    assert returned_text(wsn_process(platform, notification_xml(f, decl=" " + WSNT_DECL))) == (
        "accepted"
    )


def pushed(consumer: RecordingConsumer) -> list[etree._Element]:
    """Every NotificationMessage the consumer was pushed, in order."""
    with consumer.lock:
        bodies: list[bytes] = []
        for r in consumer.received:
            if not bodies or bodies[-1] is not r.raw:  # messages of one POST share its body
                bodies.append(r.raw)
    return [
        nm
        for b in bodies
        for nm in etree.fromstring(b).iterfind(".//wsnt:NotificationMessage", NSMAP)
    ]


def package_of(nm: etree._Element) -> wsn.Package | None:
    el = nm.find(f"{T}Package")
    return None if el is None else wsn.parse_package(el)


def whole_messages(consumer: RecordingConsumer, token: str) -> list[etree._Element]:
    """The wsnt:Message of every unfragmented notification that carries `token`."""
    return [
        m
        for nm in pushed(consumer)
        if package_of(nm) is None
        and (m := nm.find(f"{T}Message")) is not None
        and token in etree.tostring(m, encoding="unicode")
    ]


def fragments_of(consumer: RecordingConsumer, identification: str) -> list[Fragment]:
    out = []
    for nm in pushed(consumer):
        p = nm.find(f"{T}Package")
        if p is not None and p.findtext("Identification") == identification:
            out.append(
                fragment.from_parts(
                    identification=identification,
                    flags=p.findtext("Fragment") or "",
                    text=nm.findtext(f"{T}Message") or "",
                )
            )
    return out


def reassemble(parts: list[Fragment]) -> bytes:
    r = fragment.Reassembler()
    for f in parts:
        r.add(f)
    assert r.complete, r.missing()
    return r.payload()


def split(payload: bytes, token: str, *, partial: bool) -> list[Fragment]:
    return fragment.split(
        payload, fragment_size=PUBLISHER_SIZE, identification=token, partial_allowed=partial
    )


def stat(platform, name: str) -> int:  # type: ignore[no-untyped-def]
    return int(platform.redis().hget(fragments.STATS, name) or 0)


# ----------------------------------------------------------------------------- 功能-03, inbound


@pytest.mark.parametrize("multiple", MULTIPLES)
def test_func03_fragments_without_partial_delivery_arrive_as_one_whole_message(
    platform, subscriber, multiple
):
    token = f"whole-{multiple}-{uuid.uuid4().hex}"
    payload = xml_payload(token, PUBLISHER_SIZE * multiple)
    parts = split(payload, token, partial=False)
    assert len(parts) >= multiple

    publish_in_notifies(platform, parts)

    assert wait_until(lambda: whole_messages(subscriber, token), timeout=20), platform.logs()
    (message,) = whole_messages(subscriber, token)
    (doc,) = list(message)
    assert c14n(doc) == c14n(etree.fromstring(payload))
    assert fragments_of(subscriber, token) == []  # no fragment leaks through
    r = platform.redis()
    assert not r.exists(fragments.reassembly_key(LOOPBACK, TOPIC, token))
    assert r.zscore(fragments.DEADLINES, fragments.reassembly_key(LOOPBACK, TOPIC, token)) is None


@pytest.mark.parametrize("multiple", MULTIPLES)
def test_func03_fragments_with_partial_delivery_arrive_as_fragments_that_reassemble(
    platform, subscriber, multiple
):
    token = f"partial-{multiple}-{uuid.uuid4().hex}"
    payload = xml_payload(token, PUBLISHER_SIZE * multiple)
    parts = split(payload, token, partial=True)

    publish_in_notifies(platform, parts)

    assert wait_until(lambda: len(fragments_of(subscriber, token)) >= len(parts), timeout=20)
    got = fragments_of(subscriber, token)
    assert [f.offset for f in got] == list(range(len(parts)))  # in publication order
    assert all(f.partial_allowed for f in got)
    assert reassemble(got) == payload
    assert whole_messages(subscriber, token) == []


def _notify_from(platform, source: str, parts: list[Fragment]) -> int:  # type: ignore[no-untyped-def]
    """A Notify of these fragments from another address of the loopback; the HTTP status."""
    body = "".join(notification_xml(f) for f in parts)
    envelope = (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}"><s:Body>'
        f"<wsnt:Notify>{body}</wsnt:Notify></s:Body></s:Envelope>"
    )
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=30) as client:
        r = client.post(
            platform.endpoint,
            content=envelope.encode(),
            headers={"Content-Type": "text/xml; charset=utf-8"},
        )
    return r.status_code


def test_another_publishers_fragments_under_the_same_identification_leave_a_message_whole(
    platform, subscriber
):
    # Identifications are the publisher's (the thesis's are timestamps): another publisher that
    # sends the same one, by chance or on purpose, once ended this publisher's reassembly (its
    # message complete at once, the rest of ours "late", 202 and nothing stored) or dropped it
    # (an offset past the limit).
    token = f"shared-{uuid.uuid4().hex}"
    ours = xml_payload(token + "-ours", PUBLISHER_SIZE * 3)
    parts = split(ours, token, partial=False)
    theirs = split(xml_payload(token + "-theirs", PUBLISHER_SIZE // 2), token, partial=False)
    assert len(parts) >= 3
    assert len(theirs) == 1
    far = fragment.from_parts(identification=token, flags="1-1-0-99999", text="x")

    assert _notify_from(platform, "127.0.0.2", parts[:1]) == 202
    assert _notify_from(platform, "127.0.0.3", [far]) == 500  # past the limit: its own, dropped
    assert _notify_from(platform, "127.0.0.3", theirs) == 202  # whole at once
    assert _notify_from(platform, "127.0.0.2", parts[1:]) == 202

    def texts() -> list[str]:
        return [etree.tostring(m, encoding="unicode") for m in whole_messages(subscriber, token)]

    assert wait_until(lambda: len(texts()) == 2, timeout=20), (texts(), platform.logs())
    docs = sorted((c14n(doc) for m in whole_messages(subscriber, token) for doc in m), key=len)
    assert docs == [
        c14n(etree.fromstring(xml_payload(token + "-theirs", PUBLISHER_SIZE // 2))),
        c14n(etree.fromstring(ours)),
    ]


def test_fragments_sent_out_of_order_in_wsn_process_envelopes_are_reassembled_once(
    platform, subscriber
):
    token = f"shuffled-{uuid.uuid4().hex}"
    # Not XML: markup characters, CJK and 4-byte characters cut at character boundaries.
    text = f"{token} x < y && z > 0; 中文告警 😀 " * 300
    parts = split(text.encode(), token, partial=False)
    random.Random(token).shuffle(parts)
    if not parts[-1].more:  # make sure the final fragment is not the last to arrive
        parts[0], parts[-1] = parts[-1], parts[0]
    assert parts[-1].more

    for f in parts:
        publish_legacy(platform, f)

    assert wait_until(lambda: whole_messages(subscriber, token), timeout=20), platform.logs()
    (message,) = whole_messages(subscriber, token)
    assert len(message) == 0
    assert message.text == text
    # A publisher that resends a fragment after its message was whole (a lost answer) is told
    # "accepted"; nothing is delivered again and no new reassembly starts.
    publish_legacy(platform, parts[-1])
    assert not platform.redis().exists(fragments.reassembly_key(LOOPBACK, TOPIC, token))
    time.sleep(0.5)
    assert len(whole_messages(subscriber, token)) == 1


def test_a_lost_fragment_delivers_nothing_and_ends_in_a_counted_timeout(platform, subscriber):
    token = f"lost-{uuid.uuid4().hex}"
    parts = split(xml_payload(token, PUBLISHER_SIZE * 5), token, partial=False)
    before = stat(platform, "fragments_timed_out")
    key = fragments.reassembly_key(LOOPBACK, TOPIC, token)
    r = platform.redis()

    publish_in_notifies(platform, parts[:2] + parts[3:])  # offset 2 is lost

    assert r.hget(key, "count") == str(len(parts) - 1).encode()  # held, waiting
    # HPWSN_FRAGMENT_TIMEOUT_S is 2 s on the test platform; the beat sweeps every 5 s.
    assert wait_until(lambda: stat(platform, "fragments_timed_out") > before, timeout=20)
    assert wait_until(lambda: not r.exists(key), timeout=5)
    assert r.zscore(fragments.DEADLINES, key) is None
    assert whole_messages(subscriber, token) == []
    assert fragments_of(subscriber, token) == []
    assert f"reassembly of '{token}'" in platform.logs()
    assert f"{len(parts) - 1} of {len(parts)} fragments arrived" in platform.logs()


def test_the_last_two_fragments_arriving_at_once_make_exactly_one_notification(
    platform, subscriber
):
    tokens = [f"race-{i}-{uuid.uuid4().hex}" for i in range(10)]
    lasts = []
    for token in tokens:
        parts = split(xml_payload(token, PUBLISHER_SIZE * 4), token, partial=False)
        publish_in_notifies(platform, parts[:-2])
        lasts.append(parts[-2:])

    def send(f: Fragment) -> None:
        assert notify(platform, [f]).status == 202

    threads = [threading.Thread(target=send, args=(f,)) for pair in lasts for f in pair]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert wait_until(lambda: all(whole_messages(subscriber, t) for t in tokens), timeout=20)
    time.sleep(1.0)  # a second notification of the same message would have arrived by now
    assert [len(whole_messages(subscriber, t)) for t in tokens] == [1] * len(tokens)


def test_two_concurrent_completions_of_one_message_yield_it_once(platform, monkeypatch):
    """The hold is one Redis script: of two completions racing on two connections, one wins."""
    token = f"direct-{uuid.uuid4().hex}"
    parts = split(xml_payload(token, PUBLISHER_SIZE * 3), token, partial=False)

    def incoming(f: Fragment) -> wsn.NotificationIn:
        el = etree.fromstring(notification_xml(f, decl=" " + WSNT_DECL).encode())
        return wsn.parse_notification_message(el)

    async def run() -> list[wsn.NotificationIn | None]:
        client = aioredis.Redis.from_url(platform.env["REDIS_URL"])
        monkeypatch.setattr(state, "get_async_redis", lambda: client)
        try:
            for f in parts[:-2]:
                assert (
                    await fragments.fragment_hold(
                        notification=incoming(f), topic_path="ALL", publisher=LOOPBACK
                    )
                    is None
                )
            results = await asyncio.gather(
                *(
                    fragments.fragment_hold(
                        notification=incoming(f), topic_path="ALL", publisher=LOOPBACK
                    )
                    for f in parts[-2:]
                )
            )
            # The winner stored the whole message: the reassembly ends.
            await fragments.fragments_done([(LOOPBACK, "ALL", token)])
            return results
        finally:
            await client.aclose()

    results = asyncio.run(run())

    whole = [w for w in results if w is not None]
    assert len(whole) == 1
    assert c14n(next(iter(whole[0].message_el))) == c14n(
        etree.fromstring(b"".join(f.data for f in parts))
    )
    assert whole[0].topic is not None
    assert whole[0].topic.text == "ALL"
    assert not platform.redis().exists(fragments.reassembly_key(LOOPBACK, "ALL", token))


def test_the_timeout_sweeper_can_run_twice(platform, monkeypatch, settings):
    token = f"sweep-{uuid.uuid4().hex}"
    (first, _rest) = split(b"x" * (PUBLISHER_SIZE * 2), token, partial=False)
    settings.HPWSN_FRAGMENT_TIMEOUT_S = -1.0  # already late
    el = etree.fromstring(notification_xml(first, decl=" " + WSNT_DECL).encode())

    async def hold() -> None:
        client = aioredis.Redis.from_url(platform.env["REDIS_URL"])
        monkeypatch.setattr(state, "get_async_redis", lambda: client)
        try:
            n = wsn.parse_notification_message(el)
            assert (
                await fragments.fragment_hold(notification=n, topic_path="ALL", publisher=LOOPBACK)
                is None
            )
        finally:
            await client.aclose()

    asyncio.run(hold())
    key = fragments.reassembly_key(LOOPBACK, "ALL", token)
    r = platform.redis()
    assert r.exists(key)

    fragments.fragments_expire()
    fragments.fragments_expire()

    assert not r.exists(key)
    assert r.zscore(fragments.DEADLINES, key) is None


# ----------------------------------------------------------------------------- outbound


@pytest.mark.parametrize("multiple", [2, 10, 100])
def test_a_message_larger_than_the_fragment_size_is_pushed_as_fragments(
    platform, subscriber, multiple
):
    size = int(platform.env["HPWSN_FRAGMENT_SIZE"])
    token = f"outbound-{multiple}-{uuid.uuid4().hex}"
    payload = xml_payload(token, size * multiple)
    small = f"<e:small xmlns:e='urn:frag'>{token}-before</e:small>"

    res = soap_call(
        platform.endpoint,
        f"<wsnt:Notify><wsnt:NotificationMessage><wsnt:Topic Dialect='{ns.DIALECT_SIMPLE}'>ALL"
        f"</wsnt:Topic><wsnt:Message>{small}</wsnt:Message></wsnt:NotificationMessage>"
        f"<wsnt:NotificationMessage><wsnt:Topic Dialect='{ns.DIALECT_SIMPLE}'>ALL"
        f"</wsnt:Topic><wsnt:Message>{payload.decode()}</wsnt:Message></wsnt:NotificationMessage>"
        "</wsnt:Notify>",
    )
    assert res.status == 202, res.body

    def identification() -> str | None:
        for nm in pushed(subscriber):
            p = package_of(nm)
            if p is not None and token in (nm.findtext(f"{T}Message") or ""):
                return p.identification
        return None

    assert wait_until(lambda: identification() is not None, timeout=30), platform.logs()
    ident = identification()
    assert ident is not None
    assert wait_until(lambda: any(not f.more for f in fragments_of(subscriber, ident)), timeout=30)
    got = fragments_of(subscriber, ident)
    assert len(got) >= multiple
    assert all(len(f.data) <= size for f in got)
    assert [f.offset for f in got] == list(range(len(got)))
    assert not any(f.partial_allowed for f in got)  # HPWSN_FRAGMENT_PARTIAL defaults to false
    (doc,) = etree.fromstring(b"<m>" + reassemble(got) + b"</m>")
    assert c14n(doc) == c14n(etree.fromstring(payload))
    # The small message before it went whole, and first: the queue's order is kept.
    assert [m.find("{urn:frag}small").text for m in whole_messages(subscriber, token)] == [
        f"{token}-before"
    ]

    def kind(nm: etree._Element) -> str | None:
        p = package_of(nm)
        if p is not None:
            return "fragment" if p.identification == ident else None
        return "small" if f"{token}-before" in etree.tostring(nm, encoding="unicode") else None

    order = [k for k in map(kind, pushed(subscriber)) if k is not None]
    assert order == ["small"] + ["fragment"] * len(got)


# ----------------------------------------------------------------------------- bad input


def fragment_with(flags: str, text: str = "piece", ident: str | None = None) -> str:
    return (
        f'<wsnt:NotificationMessage><wsnt:Topic Dialect="{ns.DIALECT_SIMPLE}">{TOPIC}</wsnt:Topic>'
        f"{fragment.package_xml(ident or uuid.uuid4().hex, flags)}"
        f"<wsnt:Message>{text}</wsnt:Message></wsnt:NotificationMessage>"
    )


@pytest.mark.parametrize(
    ("flags", "mentions"),
    [
        ("1-1-0-100000", "fragment offset 100000 exceeds 99999"),
        ("1-2-0-3", "is not of the form F-M-P-OFFSET"),
        ("1-1-0", "is not of the form F-M-P-OFFSET"),
        ("one-1-0-3", "is not of the form F-M-P-OFFSET"),
        ("1-1-0-99999", "exceeds the limit of 99999 fragments per message"),
    ],
)
def test_bad_fragment_flags_are_client_faults_that_name_the_problem(
    platform, subscriber, flags, mentions
):
    res = soap_call(platform.endpoint, f"<wsnt:Notify>{fragment_with(flags)}</wsnt:Notify>")

    assert res.status == 500
    assert res.findtext(".//faultcode").endswith("Client")
    assert mentions in res.fault_text
    assert_still_delivering(platform, subscriber)


def test_a_bad_fragment_in_wsn_process_is_a_client_fault(platform, subscriber):
    res = wsn_process(
        platform,
        fragment_with("1-1-0-100000").replace(
            "<wsnt:NotificationMessage>", f"<wsnt:NotificationMessage {WSNT_DECL}>"
        ),
    )

    assert res.status == 500
    assert res.fault_code == "Client"
    assert "fragment offset 100000 exceeds 99999" in res.fault_text
    assert_still_delivering(platform, subscriber)


def test_a_fragment_beyond_the_reassembly_byte_limit_is_refused_and_the_reassembly_dropped(
    platform, subscriber
):
    limit = int(platform.env["HPWSN_MAX_REASSEMBLY_BYTES"])
    ident = f"huge-{uuid.uuid4().hex}"
    piece = "x" * (limit // 2 + 1)
    ok = soap_call(
        platform.endpoint, f"<wsnt:Notify>{fragment_with('1-1-0-0', piece, ident)}</wsnt:Notify>"
    )
    assert ok.status == 202, ok.body

    res = soap_call(
        platform.endpoint, f"<wsnt:Notify>{fragment_with('1-0-0-1', piece, ident)}</wsnt:Notify>"
    )

    assert res.status == 500
    assert "HPWSN_MAX_REASSEMBLY_BYTES" in res.fault_text
    assert f"would hold {2 * len(piece)} bytes" in res.fault_text
    assert not platform.redis().exists(fragments.reassembly_key(LOOPBACK, TOPIC, ident))
    assert_still_delivering(platform, subscriber)


@pytest.mark.parametrize(
    ("sequence", "whole"),
    [
        (
            [
                ("1-1-0-0", "one ", None),
                ("1-1-0-0", "uno ", "offset 0 was already received with other content"),
                ("1-1-0-0", "one ", None),  # the same fragment again is a harmless duplicate
                ("1-0-0-1", "two", None),
            ],
            "one two",
        ),
        (
            [
                ("1-0-0-1", "two", None),
                ("1-1-0-5", "five", "offset 5 lies beyond the last fragment (offset 1)"),
                ("1-1-0-0", "one ", None),
            ],
            "one two",
        ),
        (
            [
                ("1-1-0-2", "three ", None),
                ("1-0-0-1", "two", "offset 1 says it is the last fragment, but offset 2 was"),
                ("1-1-0-1", "two ", None),
                ("1-1-0-0", "one ", None),
                ("1-0-0-3", "four", None),
            ],
            "one two three four",
        ),
        (
            [
                ("1-1-0-0", "one ", None),
                ("1-1-0-1", "<e:x xmlns:e='urn:t'/>", "as the text of wsnt:Message"),
                ("1-0-0-1", "two", None),
            ],
            "one two",
        ),
    ],
    ids=["other-content", "beyond-the-last", "a-second-last", "elements"],
)
def test_conflicting_fragments_are_refused_and_the_message_still_completes(
    platform, subscriber, sequence, whole
):
    ident = f"conflict-{uuid.uuid4().hex}"

    for flags, text, fault in sequence:
        text = f"{ident} {text}" if flags.endswith("-0") else text
        res = soap_call(
            platform.endpoint, f"<wsnt:Notify>{fragment_with(flags, text, ident)}</wsnt:Notify>"
        )
        if fault is None:
            assert res.status == 202, res.body
        else:
            assert res.status == 500
            assert res.findtext(".//faultcode").endswith("Client")
            assert fault in res.fault_text, res.fault_text

    assert wait_until(lambda: whole_messages(subscriber, ident), timeout=20)
    assert [m.text for m in whole_messages(subscriber, ident)] == [f"{ident} {whole}"]


def assert_still_delivering(platform, subscriber: RecordingConsumer) -> None:  # type: ignore[no-untyped-def]
    token = f"good-{uuid.uuid4().hex}"
    res = soap_call(
        platform.endpoint,
        f"<wsnt:Notify><wsnt:NotificationMessage><wsnt:Topic Dialect='{ns.DIALECT_SIMPLE}'>ALL"
        f"</wsnt:Topic><wsnt:Message><ok>{token}</ok></wsnt:Message></wsnt:NotificationMessage>"
        "</wsnt:Notify>",
    )
    assert res.status == 202, res.body
    assert wait_until(lambda: whole_messages(subscriber, token), timeout=20)


def test_a_topics_fragment_size_policy_splits_its_messages_at_that_size(
    platform, consumer_factory, committed
):
    committed(
        topic_with_policy,
        "Frag:Small",
        root=ANONYMOUS_ALLOWED,
        fragment_size=1024,
        partial_delivery=True,
    )
    consumer = consumer_factory()
    assert soap_call(platform.endpoint, subscribe_xml(consumer.url, "Frag:Small")).status == 200
    token = f"policy-{uuid.uuid4().hex}"
    payload = xml_payload(token, 5 * 1024)

    res = soap_call(
        platform.endpoint,
        f"<wsnt:Notify><wsnt:NotificationMessage><wsnt:Topic Dialect='{ns.DIALECT_SIMPLE}'>"
        f"Frag:Small</wsnt:Topic><wsnt:Message>{payload.decode()}</wsnt:Message>"
        "</wsnt:NotificationMessage></wsnt:Notify>",
    )
    assert res.status == 202, res.body

    def packages() -> list[wsn.Package]:
        return [p for nm in pushed(consumer) if (p := package_of(nm)) is not None]

    assert wait_until(lambda: any(not p.more for p in packages()), timeout=30), platform.logs()
    ident = packages()[0].identification
    got = fragments_of(consumer, ident)
    assert len(got) >= 5
    assert all(len(f.data) <= 1024 for f in got)  # the topic's size, not HPWSN_FRAGMENT_SIZE
    assert all(f.partial_allowed for f in got)  # the topic's partial delivery
    (doc,) = etree.fromstring(b"<m>" + reassemble(got) + b"</m>")
    assert c14n(doc) == c14n(etree.fromstring(payload))
