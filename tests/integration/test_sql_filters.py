"""SQL-like filters through the running platform: Subscribe over SOAP, Notify, real consumers."""

from __future__ import annotations

from xml.sax.saxutils import escape

import pytest
from lxml import etree

from hpwsn import ns
from hpwsn.sqlfilter import DIALECT
from tests.support import NSMAP, notify_xml, soap_call, subscribe_xml

pytestmark = pytest.mark.integration

TOPIC = "ALL:ALARM:ALARM1"
H = f'xmlns:hpwsn="{ns.HPWSN}"'


def sql_subscribe(  # type: ignore[no-untyped-def]
    platform, consumer_url: str, content: str = "", *, params=(), producer: str = ""
):
    filters = ""
    if content:
        filters += (
            f'<wsnt:MessageContent Dialect="{DIALECT}">{escape(content)}</wsnt:MessageContent>'
        )
    if producer:
        filters += (
            f'<wsnt:ProducerProperties Dialect="{DIALECT}">{escape(producer)}'
            "</wsnt:ProducerProperties>"
        )
    body = subscribe_xml(consumer_url, TOPIC, extra=filters)
    if params:
        values = "".join(f"<hpwsn:Parameter>{escape(p)}</hpwsn:Parameter>" for p in params)
        policy = (
            f"<wsnt:SubscriptionPolicy><hpwsn:FilterParameters {H}>{values}"
            "</hpwsn:FilterParameters></wsnt:SubscriptionPolicy>"
        )
        body = body.replace("</wsnt:Subscribe>", policy + "</wsnt:Subscribe>")
    return soap_call(platform.endpoint, body)


def alarm(level: int, severity: str, name: str = "x") -> str:
    return (
        f"<a:alarm xmlns:a='urn:alarm' severity='{severity}'>"
        f"<a:level>{level}</a:level><a:name>{name}</a:name></a:alarm>"
    )


def notify(platform, *payloads: str, producer: str = "") -> None:  # type: ignore[no-untyped-def]
    body = notify_xml(*((TOPIC, p) for p in payloads))
    if producer:
        ref = (
            f"<wsnt:ProducerReference><wsa:Address>{producer}</wsa:Address>"
            "</wsnt:ProducerReference>"
        )
        body = body.replace("<wsnt:Message>", ref + "<wsnt:Message>")
    res = soap_call(platform.endpoint, body)
    assert res.status == 202, res.body


def message_texts(consumer) -> list[str]:  # type: ignore[no-untyped-def]
    """What each delivered wsnt:Message held, as text (XML payloads by their text content)."""
    out = []
    # One push may carry several messages: every one of them shares the push's raw body.
    for raw in dict.fromkeys(r.raw for r in consumer.received):
        root = etree.fromstring(raw)
        for m in root.iterfind(".//wsnt:Message", NSMAP):
            out.append("".join(m.itertext()).strip())
    return out


def test_an_sql_filter_with_parameters_delivers_only_matching_messages(platform, consumer_factory):
    majors, minors, everything = consumer_factory(), consumer_factory(), consumer_factory()
    text = "alarm.level > %0 AND alarm.@severity = %1"
    for consumer, params in ((majors, ["3", "'major'"]), (minors, ["0", "minor"])):
        res = sql_subscribe(platform, consumer.url, text, params=params)
        assert res.status == 200, res.body
    assert sql_subscribe(platform, everything.url, "alarm.level IS NOT NULL").status == 200

    notify(platform, alarm(5, "major", "a"), alarm(2, "major", "b"), alarm(7, "minor", "c"))
    notify(platform, alarm(9, "major", "d"), "<other>no level</other>")
    # The last message matches every subscriber: once it arrived, everything before it had been
    # matched (per-subscription order), so what did not arrive was filtered out.
    notify(platform, alarm(8, "major", "last"))

    assert everything.wait_for(5), platform.logs()
    assert majors.wait_for(3), platform.logs()
    assert minors.wait_for(1), platform.logs()
    assert message_texts(majors) == ["5a", "9d", "8last"]
    assert message_texts(minors) == ["7c"]
    assert message_texts(everything) == ["5a", "2b", "7c", "9d", "8last"]


def test_an_sql_filter_reads_json_payloads(platform, consumer_factory):
    cheap = consumer_factory()
    res = sql_subscribe(platform, cheap.url, "StockCode IN ('AAPL', 'MSFT') AND price < 200")
    assert res.status == 200, res.body
    notify(
        platform,
        '{"StockCode": "AAPL", "price": 190.5}',
        '{"StockCode": "IBM", "price": 100}',
        '{"StockCode": "MSFT", "price": 420}',
        '{"StockCode": "MSFT", "price": "150"}',  # a string is no number (JMS typing)
        '{"StockCode": "MSFT", "price": 150}',
    )
    assert cheap.wait_for(2), platform.logs()
    texts = message_texts(cheap)
    assert texts == ['{"StockCode": "AAPL", "price": 190.5}', '{"StockCode": "MSFT", "price": 150}']


def test_a_producer_properties_filter_selects_by_publisher(platform, consumer_factory):
    consumer = consumer_factory()
    res = sql_subscribe(platform, consumer.url, producer="$producer LIKE 'http://sensor-7%'")
    assert res.status == 200, res.body
    notify(platform, alarm(1, "minor", "other"), producer="http://sensor-8.example/")
    notify(platform, alarm(1, "minor", "anonymous"))
    notify(platform, alarm(1, "minor", "seven"), producer="http://sensor-7.example/")
    assert consumer.wait_for(1), platform.logs()
    assert message_texts(consumer) == ["1seven"]


def test_the_same_filter_with_other_parameters_is_another_subscription(platform, consumer_factory):
    consumer = consumer_factory()
    first = sql_subscribe(platform, consumer.url, "alarm.level = %0", params=["1"])
    again = sql_subscribe(platform, consumer.url, "alarm.level = %0", params=["1"])
    other = sql_subscribe(platform, consumer.url, "alarm.level = %0", params=["2"])
    address = ".//wsnt:SubscriptionReference/wsa:Address"
    assert first.findtext(address) == again.findtext(address)
    assert first.findtext(address) != other.findtext(address)


# ----------------------------------------------------------------------------- faults


def fault_detail(res) -> tuple[str, str, list[str]]:  # type: ignore[no-untyped-def]
    name = res.root.find(".//{*}Detail/*") if res.root is not None else None
    if name is None:
        name = res.root.find(".//detail/*")
    position = res.root.findtext(f".//{{{ns.HPWSN}}}Position")
    expected = [e.text for e in res.root.iterfind(f".//{{{ns.HPWSN}}}Expected")]
    return etree.QName(name).localname, position, expected


def test_a_syntax_error_is_a_fault_naming_the_position_and_what_was_expected(platform):
    res = sql_subscribe(platform, "http://127.0.0.1:9/never", "alarm.level > AND x = 1")
    assert res.status == 500, res.body
    name, position, expected = fault_detail(res)
    assert name == "InvalidMessageContentExpressionFault"
    assert position == "15"
    assert "a number" in expected
    assert b"column 15" in res.body


def test_a_type_error_is_a_fault_naming_the_position(platform):
    res = sql_subscribe(platform, "http://127.0.0.1:9/never", "alarm.level = 1 AND 'a' > 2")
    name, position, _expected = fault_detail(res)
    assert name == "InvalidMessageContentExpressionFault"
    assert position == "27"
    assert b"a string is compared with a number" in res.body


def test_a_missing_parameter_is_a_fault(platform):
    res = sql_subscribe(platform, "http://127.0.0.1:9/never", "alarm.level = %1", params=["1"])
    name, position, _expected = fault_detail(res)
    assert name == "InvalidMessageContentExpressionFault"
    assert position == "15"
    assert b"parameter %1 has no value" in res.body


def test_a_producer_filter_on_payload_fields_is_an_invalid_producer_properties_fault(platform):
    res = sql_subscribe(platform, "http://127.0.0.1:9/never", producer="alarm.level = 1")
    name, position, _expected = fault_detail(res)
    assert name == "InvalidProducerPropertiesExpressionFault"
    assert position == "1"


def test_a_producer_filter_in_another_dialect_is_an_invalid_filter_fault(platform):
    body = subscribe_xml(
        "http://127.0.0.1:9/never",
        TOPIC,
        extra=f'<wsnt:ProducerProperties Dialect="{ns.FILTER_XPATH}">true()'
        "</wsnt:ProducerProperties>",
    )
    res = soap_call(platform.endpoint, body)
    name, _position, _expected = fault_detail(res)
    assert name == "InvalidFilterFault"
    assert b"ProducerProperties" in res.body


def test_parameters_without_an_sql_filter_are_refused(platform):
    body = subscribe_xml("http://127.0.0.1:9/never", TOPIC).replace(
        "</wsnt:Subscribe>",
        f"<wsnt:SubscriptionPolicy><hpwsn:FilterParameters {H}><hpwsn:Parameter>1"
        "</hpwsn:Parameter></hpwsn:FilterParameters></wsnt:SubscriptionPolicy></wsnt:Subscribe>",
    )
    res = soap_call(platform.endpoint, body)
    name, _position, _expected = fault_detail(res)
    assert name == "InvalidMessageContentExpressionFault"
    assert b"FilterParameters" in res.body
