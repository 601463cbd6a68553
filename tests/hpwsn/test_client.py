"""The client against a real local HTTP server that answers like the broker (canned envelopes)."""

from __future__ import annotations

import asyncio
import copy
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from lxml import etree

from hpwsn import cli, ns, wsn
from hpwsn.client import (
    AsyncWsnClient,
    WsnClient,
    WsnFaultError,
    WsnHttpError,
    WsnTransportError,
)
from hpwsn.consumer import ConsumerServer
from hpwsn.soap import (
    Request,
    SoapFault,
    fault_envelope,
    fault_http_status,
    parse_request,
    response,
)

B2_XSD = Path("/work/shared/wsn-schemas/cxf/b-2.xsd")
T = f"{{{ns.WSNT}}}"
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@dataclass
class Seen:
    """One request the fake broker received."""

    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes

    @property
    def req(self) -> Request:
        return parse_request(
            self.body, max_bytes=10_000_000, max_depth=64, content_type=self.headers["content-type"]
        )


Reply = tuple[int, str, bytes]  # status, content type, body


@dataclass
class FakeBroker:
    url: str
    seen: list[Seen] = field(default_factory=list)
    reply: Callable[[Seen], Reply] | None = None

    @property
    def base(self) -> str:
        return self.url.removesuffix("/wsn/")


def _ct(version: str) -> str:
    return "text/xml; charset=utf-8" if version == "1.1" else "application/soap+xml; charset=utf-8"


def _ok(req: Request, operation: str, body_xml: str | bytes, port_type: str) -> Reply:
    text = body_xml.decode() if isinstance(body_xml, bytes) else body_xml
    action = ns.action(port_type, operation, response=True)
    return 200, _ct(req.version), response(req, action=action, body_xml=text)


def canned(broker: FakeBroker, seen: Seen) -> Reply:
    """What the broker answers to each operation, built with the broker's own codec."""
    req = seen.req
    name = etree.QName(req.body).localname
    if name == "Notify":
        return 202, "", b""
    if name == "Subscribe":
        address = f"{broker.base}/wsn/subscriptions/0b5e1c2d-aaaa-bbbb-cccc-123456789abc"
        body = wsn.subscribe_response(address, NOW, NOW + timedelta(hours=1))
        return _ok(req, "Subscribe", body, "NotificationProducer")
    if name == "Renew":
        return _ok(req, "Renew", wsn.renew_response(NOW, NOW + timedelta(days=1)), "X")
    if name in ("Unsubscribe", "PauseSubscription", "ResumeSubscription", "DestroyPullPoint"):
        return _ok(req, name, wsn.empty_response(f"{name}Response"), "X")
    if name == "CreatePullPoint":
        address = f"{broker.base}/wsn/pullpoints/9d7c0ffe-0000-4000-8000-000000000001"
        return _ok(req, name, wsn.create_pull_point_response(address), name)
    if name == "GetMessages":
        topic = wsn.topic_element("tns:ALL/ALARM", ns.DIALECT_CONCRETE, {"tns": "urn:t"})
        items = [
            (
                "http://b/wsn/subscriptions/1",
                topic + b"<wsnt:Message><alarm>1</alarm></wsnt:Message>",
            ),
            (None, b"<wsnt:Message>plain &amp; text</wsnt:Message>"),
        ]
        return _ok(req, name, wsn.get_messages_response(items), "PullPoint")
    if name == "GetCurrentMessage":
        content = b'<alarm xmlns="urn:a">on</alarm>'
        return _ok(req, name, wsn.get_current_message_response(content), "NotificationProducer")
    raise AssertionError(f"unexpected operation {name}")


def fault_reply(name: str, message: str, *, wsn_ns: str = ns.WSNT) -> Callable[[Seen], Reply]:
    def reply(seen: Seen) -> Reply:
        req = seen.req
        fault = SoapFault(message, wsn_name=name, wsn_ns=wsn_ns)
        body = fault_envelope(fault, version=req.version, relates_to=req.message_id)
        return fault_http_status(fault, req.version), _ct(req.version), body

    return reply


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    state = FakeBroker(url="")
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the client expects
        disable_nagle_algorithm = True  # headers and body go out in two writes

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            seen = Seen(
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=self.rfile.read(length),
            )
            with lock:
                state.seen.append(seen)
            try:
                status, ctype, body = (state.reply or (lambda s: canned(state, s)))(seen)
            except Exception as exc:  # a bad request fails the test through a 599
                status, ctype, body = 599, "text/plain", repr(exc).encode()
            self.send_response(status)
            if ctype:
                self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            body = b"Not Found"
            self.send_response(404)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256  # the default 5 drops concurrent connects (1 s SYN retries)

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/wsn/"
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def b2_schema() -> etree.XMLSchema:
    if not B2_XSD.exists():
        pytest.skip(f"{B2_XSD} is not available")
    return etree.XMLSchema(etree.parse(str(B2_XSD)))


def _valid(schema: etree.XMLSchema, el: etree._Element) -> None:
    ok = schema.validate(etree.ElementTree(etree.fromstring(etree.tostring(el))))
    assert ok, schema.error_log


def _content(n: wsn.NotificationIn) -> bytes:
    """The payload elements as sent (a copy drops the envelope's inherited declarations)."""
    assert n.message_el is not None
    return b"".join(etree.tostring(copy.copy(c), with_tail=False) for c in n.message_el)


def _declared(el: etree._Element) -> dict[str | None, str]:
    """The namespace declarations on this element itself (not inherited)."""
    parent = el.getparent()
    inherited = parent.nsmap if parent is not None else {}
    return {p: u for p, u in el.nsmap.items() if inherited.get(p) != u}


def _wsa_ok(seen: Seen, *, action: str, to: str) -> None:
    req = seen.req
    assert req.action == action
    assert req.to == to
    assert req.message_id
    assert req.message_id.startswith("urn:uuid:")


# ----------------------------------------------------------------------------- requests


def test_it_subscribes_with_a_schema_valid_soap_11_request(
    broker: FakeBroker, b2_schema: etree.XMLSchema
) -> None:
    with WsnClient(broker.url) as client:
        sub = client.subscribe(
            "http://127.0.0.1:9000/consumer",
            "tns:ALL/ALARM",
            namespaces={"tns": "urn:example:topics"},
            message_content="//tns:alarm[@level > 2]",
            termination=timedelta(hours=1),
            use_raw=True,
        )
    seen = broker.seen[0]
    assert seen.path == "/wsn/"
    assert seen.headers["content-type"] == "text/xml; charset=utf-8"
    action = "http://docs.oasis-open.org/wsn/bw-2/NotificationProducer/SubscribeRequest"
    assert seen.headers["soapaction"] == f'"{action}"'
    _wsa_ok(seen, action=action, to=broker.url)
    req = seen.req
    assert req.version == "1.1"
    assert req.body.tag == f"{T}Subscribe"
    _valid(b2_schema, req.body)
    parsed = wsn.parse_subscribe(req.body)
    assert parsed.consumer_address == "http://127.0.0.1:9000/consumer"
    assert parsed.topic is not None
    assert parsed.topic.text == "tns:ALL/ALARM"
    assert parsed.topic.dialect == ns.DIALECT_CONCRETE
    # The prefix is declared on the TopicExpression element itself, where the broker reads it.
    expr = req.body.find(f"{T}Filter/{T}TopicExpression")
    assert expr is not None
    assert _declared(expr) == {"tns": "urn:example:topics"}
    assert parsed.message_content is not None
    assert parsed.message_content.text == "//tns:alarm[@level > 2]"
    assert parsed.message_content.dialect == ns.FILTER_XPATH
    assert parsed.message_content.nsmap["tns"] == "urn:example:topics"
    assert parsed.initial_termination_time == "PT3600S"
    assert parsed.use_raw is True
    assert sub.address == f"{broker.base}/wsn/subscriptions/0b5e1c2d-aaaa-bbbb-cccc-123456789abc"
    assert sub.id == "0b5e1c2d-aaaa-bbbb-cccc-123456789abc"
    assert sub.current_time == NOW
    assert sub.termination_time == NOW + timedelta(hours=1)


def test_it_speaks_soap_12_with_the_action_in_the_content_type(broker: FakeBroker) -> None:
    with WsnClient(broker.url, soap_version="1.2") as client:
        sub = client.subscribe("http://127.0.0.1:9000/", "ALL")
    seen = broker.seen[0]
    action = ns.action("NotificationProducer", "Subscribe")
    assert seen.headers["content-type"] == f'application/soap+xml; charset=utf-8; action="{action}"'
    assert "soapaction" not in seen.headers
    assert seen.req.version == "1.2"
    assert seen.req.body.find(f"{T}Filter/{T}TopicExpression").get("Dialect") == ns.DIALECT_SIMPLE
    assert sub.id == "0b5e1c2d-aaaa-bbbb-cccc-123456789abc"


def test_it_publishes_colon_paths_with_the_simple_dialect_and_no_namespace(
    broker: FakeBroker, b2_schema: etree.XMLSchema
) -> None:
    with WsnClient(broker.url) as client:
        client.notify("ALL:ALARM:ALARM1", '<?xml version="1.0"?><alarm level="3">on</alarm>')
    seen = broker.seen[0]
    _wsa_ok(seen, action=ns.ACTION_NOTIFY, to=broker.url)
    assert seen.headers["soapaction"] == f'"{ns.ACTION_NOTIFY}"'
    body = seen.req.body
    _valid(b2_schema, body)
    [n] = wsn.parse_notify(body)
    assert n.topic is not None
    assert (n.topic.text, n.topic.dialect) == ("ALL:ALARM:ALARM1", ns.DIALECT_SIMPLE)
    topic_el = body.find(f"{T}NotificationMessage/{T}Topic")
    assert topic_el is not None
    assert _declared(topic_el) == {}
    assert _content(n) == b'<alarm level="3">on</alarm>'


def test_it_escapes_plain_text_messages(broker: FakeBroker) -> None:
    with WsnClient(broker.url) as client:
        client.notify("ALL", "5 < 6 & <3 you")
    [n] = wsn.parse_notify(broker.seen[0].req.body)
    assert n.message_el is not None
    assert n.message_el.text == "5 < 6 & <3 you"
    assert len(n.message_el) == 0


def test_notify_many_sends_every_message_in_one_notify(
    broker: FakeBroker, b2_schema: etree.XMLSchema
) -> None:
    with WsnClient(broker.url) as client:
        client.notify_many(
            [("tns:ALL/ALARM", "<a/>"), ("tns:ALL", "<b/>")],
            namespaces={"tns": "urn:t"},
            message_id="urn:uuid:00000000-0000-4000-8000-000000000042",
        )
    assert len(broker.seen) == 1
    req = broker.seen[0].req
    assert req.message_id == "urn:uuid:00000000-0000-4000-8000-000000000042"
    _valid(b2_schema, req.body)
    messages = wsn.parse_notify(req.body)
    assert [(m.topic.text, m.topic.dialect) for m in messages if m.topic] == [
        ("tns:ALL/ALARM", ns.DIALECT_CONCRETE),
        ("tns:ALL", ns.DIALECT_SIMPLE),
    ]
    assert all(m.topic and m.topic.nsmap["tns"] == "urn:t" for m in messages)
    assert [_content(m) for m in messages] == [b"<a/>", b"<b/>"]


def test_subscription_operations_go_to_the_subscription_address(broker: FakeBroker) -> None:
    address = f"{broker.base}/wsn/subscriptions/0b5e1c2d-aaaa-bbbb-cccc-123456789abc"
    with WsnClient(broker.url) as client:
        granted = client.renew(address, "PT24H")
        client.pause(address)
        client.resume(address)
        client.unsubscribe(address)
    assert granted == NOW + timedelta(days=1)
    expected = [
        ("Renew", ns.action("SubscriptionManager", "Renew")),
        ("PauseSubscription", ns.action("PausableSubscriptionManager", "PauseSubscription")),
        ("ResumeSubscription", ns.action("PausableSubscriptionManager", "ResumeSubscription")),
        ("Unsubscribe", ns.action("SubscriptionManager", "Unsubscribe")),
    ]
    for seen, (name, action) in zip(broker.seen, expected, strict=True):
        assert seen.path == "/wsn/subscriptions/0b5e1c2d-aaaa-bbbb-cccc-123456789abc"
        assert seen.req.body.tag == f"{T}{name}"
        _wsa_ok(seen, action=action, to=address)
    assert wsn.parse_termination_time(broker.seen[0].req.body) == "PT24H"


def test_it_creates_reads_and_destroys_a_pull_point(broker: FakeBroker) -> None:
    with WsnClient(broker.url) as client:
        address = client.create_pull_point()
        messages = client.get_messages(address, maximum=5)
        client.destroy_pull_point(address)
    assert address == f"{broker.base}/wsn/pullpoints/9d7c0ffe-0000-4000-8000-000000000001"
    create, get, destroy = broker.seen
    _wsa_ok(create, action=ns.action("CreatePullPoint", "CreatePullPoint"), to=broker.url)
    assert get.path == destroy.path == "/wsn/pullpoints/9d7c0ffe-0000-4000-8000-000000000001"
    _wsa_ok(get, action=ns.action("PullPoint", "GetMessages"), to=address)
    assert wsn.parse_maximum_number(get.req.body) == 5
    _wsa_ok(destroy, action=ns.action("PullPoint", "DestroyPullPoint"), to=address)
    first, second = messages
    assert (first.topic, first.topic_dialect) == ("tns:ALL/ALARM", ns.DIALECT_CONCRETE)
    assert first.topic_namespaces == {"tns": "urn:t"}
    assert first.subscription_address == "http://b/wsn/subscriptions/1"
    assert first.payload == b"<alarm>1</alarm>"
    assert second.topic is None
    assert second.payload == b"plain &amp; text"


def test_it_returns_the_current_message_as_inner_xml(broker: FakeBroker) -> None:
    with WsnClient(broker.url) as client:
        payload = client.get_current_message("tns:ALL", namespaces={"tns": "urn:t"})
    assert payload == b'<alarm xmlns="urn:a">on</alarm>'
    topic = wsn.parse_topic_of(broker.seen[0].req.body)
    assert (topic.text, topic.dialect, topic.nsmap["tns"]) == (
        "tns:ALL",
        ns.DIALECT_SIMPLE,
        "urn:t",
    )


def test_it_adds_a_username_token_when_credentials_are_given(broker: FakeBroker) -> None:
    with WsnClient(broker.url, username="alice", password="s3cret<") as client:
        client.notify("ALL", "x")
    security = broker.seen[0].req.security
    assert security is not None
    assert security.get(f"{{{ns.SOAP11}}}mustUnderstand") == "1"
    wsse = f"{{{ns.WSSE}}}"
    assert security.findtext(f"{wsse}UsernameToken/{wsse}Username") == "alice"
    password = security.find(f"{wsse}UsernameToken/{wsse}Password")
    assert password is not None
    assert password.text == "s3cret<"
    assert password.get("Type", "").endswith("#PasswordText")


def test_its_credentials_go_to_the_endpoints_origin_only(broker: FakeBroker) -> None:
    # The token carries the password in clear, and it went to any address given: a subscription
    # address read from a push (anyone may POST to a consumer), another host, plain http.
    same = f"{broker.base}/wsn/subscriptions/0b5e1c2d-aaaa-bbbb-cccc-123456789abc"
    port = int(broker.base.rsplit(":", 1)[1])
    elsewhere = [
        same.replace("127.0.0.1", "127.0.0.2"),
        same.replace(f":{port}/", f":{port + 1 if port < 65535 else port - 1}/"),
        same.replace("http://", "https://"),
    ]
    with WsnClient(broker.url, username="alice", password="s3cret") as client:
        client.pause(same)
        for address in elsewhere:
            with pytest.raises(ValueError, match="endpoint's origin"):
                client.pause(address)
    assert len(broker.seen) == 1
    with WsnClient(broker.url) as anonymous:  # nothing to give away
        anonymous.resume(same)
    assert len(broker.seen) == 2


def test_it_accepts_an_aware_datetime_as_termination(broker: FakeBroker) -> None:
    with WsnClient(broker.url) as client:
        client.subscribe("http://127.0.0.1:9000/", "ALL", termination=NOW)
        with pytest.raises(ValueError, match="timezone-aware"):
            client.subscribe("http://127.0.0.1:9000/", "ALL", termination=datetime(2026, 1, 1))
    parsed = wsn.parse_subscribe(broker.seen[0].req.body)
    assert parsed.initial_termination_time == "2026-01-02T03:04:05.000Z"


def test_it_refuses_an_unknown_dialect_shorthand(broker: FakeBroker) -> None:
    with WsnClient(broker.url) as client, pytest.raises(ValueError, match="unknown topic dialect"):
        client.notify("ALL", "x", dialect="weird")
    assert broker.seen == []


# ----------------------------------------------------------------------------- faults


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_it_raises_the_wsn_fault_name(broker: FakeBroker, version: str) -> None:
    broker.reply = fault_reply("TopicNotSupportedFault", "topic 'NOPE' is not in the topic tree")
    client = WsnClient(broker.url, soap_version=version)  # type: ignore[arg-type]
    with client, pytest.raises(WsnFaultError) as caught:
        client.notify("NOPE", "x")
    assert caught.value.fault_name == "TopicNotSupportedFault"
    assert caught.value.message == "topic 'NOPE' is not in the topic tree"
    assert caught.value.http_status == (500 if version == "1.1" else 400)
    assert caught.value.code == ("Client" if version == "1.1" else "Sender")


def test_it_names_a_wsrf_fault_by_its_detail_element(broker: FakeBroker) -> None:
    broker.reply = fault_reply("ResourceUnknownFault", "no such subscription", wsn_ns=ns.WSRF_R)
    with WsnClient(broker.url) as client, pytest.raises(WsnFaultError) as caught:
        client.unsubscribe(broker.base + "/wsn/subscriptions/123")
    assert caught.value.fault_name == "ResourceUnknownFault"
    assert caught.value.detail is not None
    assert etree.QName(caught.value.detail).namespace == ns.WSRF_R


def test_a_plain_soap_fault_is_named_by_its_code(broker: FakeBroker) -> None:
    def reply(seen: Seen) -> Reply:
        return 400, _ct("1.2"), fault_envelope(SoapFault("bad consumer"), version="1.2")

    broker.reply = reply
    with WsnClient(broker.url, soap_version="1.2") as client, pytest.raises(WsnFaultError) as c:
        client.subscribe("ftp://nowhere", "ALL")
    assert (c.value.fault_name, c.value.message, c.value.http_status) == (
        "Sender",
        "bad consumer",
        400,
    )


def test_a_non_soap_http_error_is_an_http_error(broker: FakeBroker) -> None:
    broker.reply = lambda seen: (404, "text/plain", b"Not Found")
    with WsnClient(broker.url) as client, pytest.raises(WsnHttpError) as caught:
        client.create_pull_point()
    assert caught.value.status == 404
    assert not caught.value.retryable
    assert "Not Found" in str(caught.value)


def test_an_unreachable_endpoint_is_a_transport_error() -> None:
    client = WsnClient("http://127.0.0.1:1/wsn/", timeout=2)
    with client, pytest.raises(WsnTransportError, match="cannot reach"):
        client.notify("ALL", "x")


# ----------------------------------------------------------------------------- asynchronous


def test_notify_async_calls_back_for_each_of_200_sends_and_flush_waits(
    broker: FakeBroker,
) -> None:
    def slow_accept(seen: Seen) -> Reply:
        time.sleep(0.002)  # so that sends are still in flight when flush() is called
        return 202, "", b""

    broker.reply = slow_accept
    done: list[Future[None]] = []
    lock = threading.Lock()

    def callback(future: Future[None]) -> None:
        with lock:
            done.append(future)

    with WsnClient(broker.url, max_in_flight=16) as client:
        futures = [
            client.notify_async("ALL:ALARM", f"<n>{i}</n>", callback=callback) for i in range(200)
        ]
        assert client.flush(timeout=10)
        assert len(done) == 200
        assert all(f.done() and f.exception() is None for f in futures)
    assert len(broker.seen) == 200
    payloads = {_content(wsn.parse_notify(s.req.body)[0]) for s in broker.seen}
    assert payloads == {f"<n>{i}</n>".encode() for i in range(200)}


def test_notify_async_hands_faults_to_the_callback(broker: FakeBroker) -> None:
    broker.reply = fault_reply("TopicNotSupportedFault", "no")
    errors: list[BaseException | None] = []
    with WsnClient(broker.url) as client:
        for _ in range(5):
            client.notify_async("NOPE", "x", callback=lambda f: errors.append(f.exception()))
    # close() (leaving the block) waited for every send and callback.
    assert len(errors) == 5
    assert all(
        isinstance(e, WsnFaultError) and e.fault_name == "TopicNotSupportedFault" for e in errors
    )


def test_notify_async_delivers_to_a_consumer_server() -> None:
    with ConsumerServer() as consumer, WsnClient(consumer.url) as client:
        for i in range(50):
            client.notify_async("ALL", f"<n>{i}</n>")
        assert client.flush(timeout=10)
        assert consumer.wait_for(50, timeout=5)
    assert sorted(m.payload for m in consumer.messages) == sorted(
        f"<n>{i}</n>".encode() for i in range(50)
    )


def test_the_async_client_runs_the_same_operations(broker: FakeBroker) -> None:
    async def scenario() -> tuple[str, bytes]:
        async with AsyncWsnClient(broker.url, soap_version="1.2") as client:
            sub = await client.subscribe("http://127.0.0.1:9000/", "ALL:ALARM")
            await client.notify("ALL:ALARM", "<a/>")
            await client.pause(sub.address)
            return sub.id, await client.get_current_message("ALL")

    sub_id, payload = asyncio.run(scenario())
    assert sub_id == "0b5e1c2d-aaaa-bbbb-cccc-123456789abc"
    assert payload == b'<alarm xmlns="urn:a">on</alarm>'
    assert [etree.QName(s.req.body).localname for s in broker.seen] == [
        "Subscribe",
        "Notify",
        "PauseSubscription",
        "GetCurrentMessage",
    ]
    assert all(s.req.version == "1.2" for s in broker.seen)


# ----------------------------------------------------------------------------- CLI


def test_cli_subscribe_prints_the_subscription_address(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--endpoint", broker.url, "subscribe", "ALL", "--consumer", "http://127.0.0.1:9/"]
    code = cli.main([*argv, "--termination", "PT1H", "--filter", "//alarm"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.strip() == f"{broker.base}/wsn/subscriptions/0b5e1c2d-aaaa-bbbb-cccc-123456789abc"
    parsed = wsn.parse_subscribe(broker.seen[0].req.body)
    assert parsed.initial_termination_time == "PT1H"
    assert parsed.message_content is not None
    assert parsed.message_content.text == "//alarm"


def test_cli_prints_the_fault_and_exits_2(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    broker.reply = fault_reply("TopicNotSupportedFault", "topic 'NOPE' is not in the topic tree")
    code = cli.main(["publish", "NOPE", "hello", "--endpoint", broker.url])
    assert code == 2
    err = capsys.readouterr().err
    assert err.strip() == "TopicNotSupportedFault: topic 'NOPE' is not in the topic tree"


def test_cli_publish_count_reports_a_summary(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["--endpoint", broker.url, "publish", "ALL", "<n>{n}</n>", "--count", "20"])
    assert code == 0
    assert capsys.readouterr().out.startswith("sent 20, failed 0, ")
    payloads = sorted(_content(wsn.parse_notify(s.req.body)[0]) for s in broker.seen)
    assert payloads == sorted(f"<n>{i}</n>".encode() for i in range(20))


def test_cli_topics_says_when_the_rest_api_is_missing(
    broker: FakeBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["--endpoint", broker.url, "topics"])
    assert code == 1
    err = capsys.readouterr().err
    assert f"the REST API is not available at {broker.base}/api/v1/topics" in err
