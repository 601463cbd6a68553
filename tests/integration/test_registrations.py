"""RegisterPublisher, DestroyRegistration and `require_registration` through the platform."""

from __future__ import annotations

import asyncio
import threading

import pytest
import zeep
from aiohttp import web

from hpwsn import ns, wsn
from hpwsn.client import WsnClient
from hpwsn.consumer import ConsumerServer
from hpwsn.soap import parse_request, response
from tests.support import (
    ANONYMOUS_ALLOWED,
    notify_xml,
    soap_call,
    subscribe_xml,
    topic_with_policy,
    wait_until,
)

pytestmark = pytest.mark.integration

BR = f'xmlns:wsnbr="{ns.WSNBR}"'
SENSOR = "http://sensor-7.example/wsn"
CXF = "http://cxf.apache.org/wsn/jaxws"


def register(platform, publisher: str | None, *topics: str, demand: str = "") -> object:  # type: ignore[no-untyped-def]
    ref = (
        f"<wsnbr:PublisherReference><wsa:Address>{publisher}</wsa:Address>"
        "</wsnbr:PublisherReference>"
        if publisher
        else ""
    )
    names = "".join(f'<wsnbr:Topic Dialect="{ns.DIALECT_SIMPLE}">{t}</wsnbr:Topic>' for t in topics)
    extra = f"<wsnbr:Demand>{demand}</wsnbr:Demand>" if demand else ""
    return soap_call(
        platform.endpoint,
        f"<wsnbr:RegisterPublisher {BR}>{ref}{names}{extra}</wsnbr:RegisterPublisher>",
    )


def notify_from(platform, topic: str, text: str, producer: str | None):  # type: ignore[no-untyped-def]
    body = notify_xml((topic, f"<e:ev xmlns:e='urn:r'>{text}</e:ev>"))
    if producer:
        ref = (
            f"<wsnt:ProducerReference><wsa:Address>{producer}</wsa:Address>"
            "</wsnt:ProducerReference>"
        )
        body = body.replace("<wsnt:Message>", ref + "<wsnt:Message>")
    return soap_call(platform.endpoint, body)


def registration_address(res) -> str:  # type: ignore[no-untyped-def]
    found = res.root.find(f".//{{{ns.WSNBR}}}PublisherRegistrationReference/{{{ns.WSA}}}Address")
    assert found is not None, res.body
    return str(found.text)


def fault_name(res) -> str:  # type: ignore[no-untyped-def]
    detail = res.root.find(".//{*}Detail/*")
    if detail is None:
        detail = res.root.find(".//detail/*")
    return str(detail.tag.rsplit("}", 1)[-1]) if detail is not None else ""


@pytest.fixture
def gated(committed) -> str:  # type: ignore[no-untyped-def]
    committed(
        topic_with_policy,
        "Registered:Feed",
        root=ANONYMOUS_ALLOWED,  # the root's policy is inherited, and judges a registration there
        require_registration=True,
    )
    return "Registered:Feed"


def test_only_a_registered_publisher_may_publish_on_a_topic_that_requires_it(
    platform, consumer_factory, gated
):
    consumer = consumer_factory()
    assert soap_call(platform.endpoint, subscribe_xml(consumer.url, gated)).status == 200

    refused = notify_from(platform, gated, "before", SENSOR)
    assert refused.status == 500, refused.body
    assert fault_name(refused) == "PublisherRegistrationRejectedFault"
    assert SENSOR.encode() in refused.body

    res = register(platform, SENSOR, "Registered")  # a registration covers the subtree
    assert res.status == 200, res.body
    address = registration_address(res)
    assert "/wsn/registrations/" in address
    consumer_ref = res.root.find(f".//{{{ns.WSNBR}}}ConsumerReference/{{{ns.WSA}}}Address")
    assert consumer_ref is not None
    assert consumer_ref.text == platform.endpoint

    assert notify_from(platform, gated, "registered", SENSOR).status == 202
    anonymous = notify_from(platform, gated, "anonymous", None)
    assert fault_name(anonymous) == "PublisherRegistrationRejectedFault"
    other = notify_from(platform, gated, "other", "http://sensor-8.example/wsn")
    assert fault_name(other) == "PublisherRegistrationRejectedFault"
    assert consumer.wait_for(1), platform.logs()

    gone = soap_call(address, f"<wsnbr:DestroyRegistration {BR}/>")
    assert gone.status == 200, gone.body
    assert gone.root.find(f".//{{{ns.WSNBR}}}DestroyRegistrationResponse") is not None
    after = notify_from(platform, gated, "after", SENSOR)
    assert fault_name(after) == "PublisherRegistrationRejectedFault"
    again = soap_call(address, f"<wsnbr:DestroyRegistration {BR}/>")
    assert fault_name(again) == "ResourceUnknownFault"

    assert consumer.payload_texts() == ["registered"]


def test_a_registration_is_renewed_at_its_own_address(platform, db_access):
    from subscriptions.models import PublisherRegistration

    res = register(platform, SENSOR, "ALL:ALARM")
    address = registration_address(res)
    renewed = soap_call(
        address, "<wsnt:Renew><wsnt:TerminationTime>PT1H</wsnt:TerminationTime></wsnt:Renew>"
    )
    assert renewed.status == 200, renewed.body
    assert renewed.findtext(".//wsnt:TerminationTime")
    reg = PublisherRegistration.objects.get(id=address.rsplit("/", 1)[1])
    assert reg.termination_time is not None
    past = soap_call(
        address,
        "<wsnt:Renew><wsnt:TerminationTime>2001-01-01T00:00:00Z</wsnt:TerminationTime></wsnt:Renew>",
    )
    assert fault_name(past) == "UnacceptableTerminationTimeFault"


def test_a_registration_for_another_topic_does_not_open_this_one(platform, gated):
    assert register(platform, SENSOR, "ALL:ALARM").status == 200
    res = notify_from(platform, gated, "x", SENSOR)
    assert fault_name(res) == "PublisherRegistrationRejectedFault"


def test_topics_without_the_policy_accept_unregistered_publishers(platform):
    res = notify_from(platform, "ALL:ALARM:ALARM1", "free", "http://anyone.example/")
    assert res.status == 202, res.body


def test_a_registration_needs_a_publisher_reference(platform):
    res = register(platform, None, "ALL")
    assert fault_name(res) == "PublisherRegistrationRejectedFault"
    assert b"PublisherReference" in res.body


@pytest.mark.parametrize(
    ("publisher", "why"),
    [
        ("sensor-7", b"not an absolute URI"),
        ("http://sensor 7.example/wsn", b"not an absolute URI"),
        ("http://sensor.example/&lt;script&gt;", b"not an absolute URI"),
        ("JavaScript:alert(1)//http://sensor.example/", b"'javascript:'"),
        ("data:text/html,x", b"'data:'"),
        ("urn:x:" + "a" * 2100, b"longer than 2048"),
    ],
)
def test_a_publisher_address_that_is_no_absolute_uri_is_refused_and_registers_nothing(
    platform, db_access, publisher, why
):  # type: ignore[no-untyped-def]
    """Without Demand too: the address names the publisher in pages, lists and the directory."""
    from subscriptions.models import PublisherRegistration

    before = PublisherRegistration.objects.count()
    res = register(platform, publisher, "ALL")
    assert fault_name(res) == "PublisherRegistrationRejectedFault", res.body
    assert why in res.body
    assert PublisherRegistration.objects.count() == before


@pytest.mark.parametrize("publisher", ["urn:uuid:7f1c2f4e-3c1a-4f5e-9d7b-2b0f0c1d9e10", SENSOR])
def test_a_publisher_named_by_a_urn_or_an_http_address_registers(platform, publisher):  # type: ignore[no-untyped-def]
    assert registration_address(register(platform, publisher, "ALL"))


def test_a_registration_for_an_unknown_topic_is_a_topic_not_supported_fault(platform):
    res = register(platform, SENSOR, "ALL:NoSuchTopic")
    assert fault_name(res) == "TopicNotSupportedFault"


def test_a_registration_with_a_bad_demand_is_a_client_fault(platform):
    res = register(platform, SENSOR, "ALL", demand="maybe")
    assert res.status == 500
    assert b"xsd:boolean" in res.body


def test_the_wsdl_advertises_registration_and_zeep_registers_and_destroys_through_it(platform):
    client = zeep.Client(platform.endpoint + "?wsdl")
    broker = client.wsdl.services["NotificationBrokerService"].ports["NotificationBrokerPort"]
    register_op = broker.binding._operations["RegisterPublisher"]
    assert "UnacceptableInitialTerminationTimeFault" in register_op.faults
    manager = client.wsdl.services["PublisherRegistrationManagerService"].ports[
        "PublisherRegistrationManagerPort"
    ]
    assert "DestroyRegistration" in manager.binding._operations
    assert broker.binding_options["address"] == manager.binding_options["address"]
    assert broker.binding_options["address"] == platform.endpoint

    epr = client.get_type(f"{{{ns.WSA}}}EndpointReferenceType")
    topic = client.get_type(f"{{{ns.WSNT}}}TopicExpressionType")
    service = client.bind("NotificationBrokerService", "NotificationBrokerPort")
    reply = service.RegisterPublisher(
        PublisherReference=epr(Address=SENSOR),
        Topic=[topic(_value_1="ALL:ALARM", Dialect=ns.DIALECT_SIMPLE)],
        Demand=False,
    )
    address = reply.PublisherRegistrationReference.Address._value_1
    assert "/wsn/registrations/" in address
    assert reply.ConsumerReference.Address._value_1 == platform.endpoint

    manager_service = client.create_service(f"{{{CXF}}}PublisherRegistrationManagerSoap", address)
    manager_service.DestroyRegistration()
    with pytest.raises(zeep.exceptions.Fault):
        manager_service.DestroyRegistration()


# ----------------------------------------------------------------------------- demand


class PublisherEndpoint(ConsumerServer):
    """A publisher's NotificationProducer on 127.0.0.1: the project's consumer server, answering
    Subscribe, PauseSubscription, ResumeSubscription and Unsubscribe with the project's codec, and
    recording what it was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []  # (operation, topic or subscription address)
        self.consumer = ""  # where it was asked to send (the broker's ConsumerReference)
        self._lock = threading.Lock()
        # Set: Unsubscribe is answered only once the test releases it (a publisher that hangs).
        self.hold_unsubscribe: threading.Event | None = None
        # Set: where the subscriptions it makes say they are (a publisher that names any address).
        self.references_at: str | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        req = parse_request(
            await request.read(),
            max_bytes=1 << 20,
            max_depth=64,
            content_type=request.headers.get("Content-Type"),
        )
        op = req.body.tag.rsplit("}", 1)[-1]
        if op == "Subscribe":
            s = wsn.parse_subscribe(req.body)
            with self._lock:
                self.consumer = s.consumer_address
                self.calls.append((op, s.topic.text if s.topic else ""))
                n = len(self.calls)
            at = self.references_at or f"{self.url}subscriptions/"
            body = wsn.subscribe_response(f"{at}{n}", _now(), None)
        else:
            hold = self.hold_unsubscribe
            if op == "Unsubscribe" and hold is not None:
                await asyncio.get_running_loop().run_in_executor(None, hold.wait, 60)
            with self._lock:
                self.calls.append((op, req.to or ""))
            body = wsn.empty_response(f"{op}Response")
        ctype = "text/xml; charset=utf-8" if req.version == "1.1" else "application/soap+xml"
        return web.Response(
            body=response(req, action=f"{op}Response", body_xml=body),
            headers={"Content-Type": ctype},
        )

    def operations(self) -> list[str]:
        with self._lock:
            return [op for op, _arg in self.calls]


def _now():  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    return datetime.now(UTC)


def test_a_demand_publisher_is_subscribed_only_while_the_broker_has_subscribers(
    platform, consumer_factory, committed
):
    committed(topic_with_policy, "Demand:Feed", root=ANONYMOUS_ALLOWED)
    publisher = PublisherEndpoint().start()
    try:
        res = register(platform, publisher.url, "Demand:Feed", demand="true")
        assert res.status == 200, res.body

        first = consumer_factory()
        sub = soap_call(platform.endpoint, subscribe_xml(first.url, "Demand:Feed"))
        assert sub.status == 200, sub.body
        assert wait_until(lambda: publisher.operations() == ["Subscribe"]), publisher.calls
        assert publisher.calls[0][1] == "Demand:Feed"
        assert publisher.consumer == platform.endpoint

        # Now it publishes, to the address the broker gave it, and the subscriber receives.
        with WsnClient(publisher.consumer) as client:
            client.notify("Demand:Feed", "<e:ev xmlns:e='urn:r'>on demand</e:ev>")
        assert first.wait_for(1), platform.logs()
        assert first.payload_texts() == ["on demand"]

        address = sub.findtext(".//wsnt:SubscriptionReference/wsa:Address")
        assert soap_call(address, "<wsnt:Unsubscribe/>").status == 200
        assert wait_until(lambda: publisher.operations() == ["Subscribe", "PauseSubscription"]), (
            publisher.calls
        )
        paused_address = publisher.calls[1][1]
        assert paused_address == f"{publisher.url}subscriptions/1"

        second = consumer_factory()
        assert soap_call(platform.endpoint, subscribe_xml(second.url, "Demand:Feed")).status == 200
        assert wait_until(
            lambda: (
                publisher.operations() == ["Subscribe", "PauseSubscription", "ResumeSubscription"]
            )
        ), publisher.calls

        # DestroyRegistration is answered without waiting for the publisher, which here answers
        # its Unsubscribe only after the reply came: a task ends the subscription there.
        publisher.hold_unsubscribe = threading.Event()
        gone = soap_call(registration_address(res), f"<wsnbr:DestroyRegistration {BR}/>")
        assert gone.status == 200, gone.body
        assert "Unsubscribe" not in publisher.operations()
        publisher.hold_unsubscribe.set()
        assert wait_until(lambda: publisher.operations()[-1] == "Unsubscribe"), publisher.calls
        assert publisher.operations().count("Subscribe") == 1  # never subscribed twice
    finally:
        if publisher.hold_unsubscribe is not None:
            publisher.hold_unsubscribe.set()
        publisher.stop()


def test_a_demand_registration_needs_its_topics(platform):
    res = register(platform, SENSOR, demand="true")
    assert fault_name(res) == "PublisherRegistrationRejectedFault"


def test_a_demand_publisher_cannot_send_the_broker_to_an_address_the_push_allow_list_refuses(
    platform, consumer_factory, committed, db_access
):  # type: ignore[no-untyped-def]
    """Its SubscriptionReference is where Pause, Resume and Unsubscribe go: a publisher naming the
    cloud metadata address there gets no call from the broker, neither when the last subscriber
    leaves nor when the registration is destroyed."""
    from subscriptions.models import PublisherRegistration

    committed(topic_with_policy, "Demand:Meta", root=ANONYMOUS_ALLOWED)
    publisher = PublisherEndpoint().start()
    publisher.references_at = "http://169.254.169.254/latest/meta-data/"
    try:
        res = register(platform, publisher.url, "Demand:Meta", demand="true")
        reg_address = registration_address(res)
        consumer = consumer_factory()
        sub = soap_call(platform.endpoint, subscribe_xml(consumer.url, "Demand:Meta"))
        assert sub.status == 200, sub.body
        assert wait_until(lambda: publisher.operations() == ["Subscribe"]), publisher.calls
        address = sub.findtext(".//wsnt:SubscriptionReference/wsa:Address")
        assert soap_call(address, "<wsnt:Unsubscribe/>").status == 200
        refused = f"not calling publisher {publisher.url} at http://169.254.169.254/"

        def refusals() -> int:
            return sum(p.read_text().count(refused) for p in platform.log_dir.glob("*.log"))

        assert wait_until(lambda: refusals() >= 1), platform.logs()
        before = refusals()
        reg_id = reg_address.rsplit("/", 1)[-1]
        assert PublisherRegistration.objects.get(id=reg_id).demand_state == {
            "Demand:Meta": {"address": "http://169.254.169.254/latest/meta-data/1", "paused": False}
        }
        destroyed = soap_call(reg_address, "<wsnbr:DestroyRegistration " + BR + "/>")
        assert destroyed.status == 200, destroyed.body
        assert wait_until(lambda: refusals() > before), platform.logs()
        assert publisher.operations() == ["Subscribe"]
    finally:
        publisher.stop()
