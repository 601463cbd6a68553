"""/api/v1/registrations on the running platform: RegisterPublisher over REST, owners, faults."""

from __future__ import annotations

import uuid

import httpx
import pytest

from hpwsn import ns
from tests.api.conftest import tag_of
from tests.api.test_api import _problem
from tests.support import notify_xml, soap_call, topic_with_policy

GATED = "APIREG:FEED"  # require_registration; publish: alarm-publishers (publisher1)
SENSOR = "http://sensor-9.example/wsn"
BR = f'xmlns:wsnbr="{ns.WSNBR}"'


@pytest.fixture
def gated(platform, committed):  # type: ignore[no-untyped-def]
    committed(
        topic_with_policy,
        GATED,
        root={
            "publish_groups": "alarm-publishers",
            "subscribe_groups": "alarm-subscribers",
            "anonymous_publish": False,
            "anonymous_subscribe": False,
        },
        require_registration=True,
    )
    return GATED


def notify_from(platform, producer: str):  # type: ignore[no-untyped-def]
    """A Notify on GATED whose ProducerReference names `producer`, as publisher1 (HTTP Basic)."""
    ref = f"<wsnt:ProducerReference><wsa:Address>{producer}</wsa:Address></wsnt:ProducerReference>"
    body = notify_xml((GATED, "<e:ev xmlns:e='urn:r'>x</e:ev>"))
    body = body.replace("<wsnt:Message>", ref + "<wsnt:Message>")
    env = (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsa="{ns.WSA}" xmlns:wsnt="{ns.WSNT}">'
        f"<s:Header><wsa:Action>{ns.WSNT}/Notify</wsa:Action>"
        f"<wsa:MessageID>urn:uuid:{uuid.uuid4()}</wsa:MessageID></s:Header>"
        f"<s:Body>{body}</s:Body></s:Envelope>"
    )
    return httpx.post(
        platform.endpoint,
        content=env.encode(),
        headers={"Content-Type": "text/xml; charset=utf-8"},
        auth=("publisher1", "hpwsn-demo"),
        timeout=30,
    )


def ids(r) -> set[str]:  # type: ignore[no-untyped-def]
    assert r.status_code == 200, r.text
    return {row["id"] for row in r.json()["results"]}


def test_a_publisher_registered_over_rest_may_publish_and_only_its_owner_ends_it(
    api, platform, gated
):  # type: ignore[no-untyped-def]
    assert b"PublisherRegistrationRejectedFault" in notify_from(platform, SENSOR).content

    r = api.call(
        "POST", "/registrations", "publisher1", json={"publisher": SENSOR, "topics": ["APIREG"]}
    )
    assert r.status_code == 201, r.text
    reg = r.json()
    assert reg["reference"] == f"{platform.base_url}/wsn/registrations/{reg['id']}"
    assert reg["consumer"] == platform.endpoint
    assert (reg["publisher"], reg["topics"], reg["demand"]) == (SENSOR, ["APIREG"], False)
    assert notify_from(platform, SENSOR).status_code == 202

    # The topic's publish ACL decides who may register, as for SOAP.
    refused = api.call(
        "POST", "/registrations", "subscriber1", json={"publisher": SENSOR, "topics": [GATED]}
    )
    _problem(refused, 403, "NotAuthorized")

    # Lists: the owner and the roles see it; others do not.
    assert reg["id"] in ids(api.call("GET", "/registrations", "publisher1"))
    # An analyst sees others' registrations by tag, without the address that ends them.
    assert tag_of(reg["id"]) in ids(api.call("GET", f"/registrations?topic={GATED}", "analyst1"))
    assert tag_of(reg["id"]) not in ids(api.call("GET", "/registrations?topic=ALL", "analyst1"))
    assert reg["id"] not in ids(api.call("GET", "/registrations", "subscriber1"))
    assert ids(api.call("GET", "/registrations", None)) == set()
    shown = api.call("GET", f"/registrations/{reg['id']}", "analyst1").json()
    assert shown == {**reg, "id": tag_of(reg["id"]), "reference": None}
    assert api.call("GET", f"/registrations/{reg['id']}", "operator1").json() == reg
    _problem(api.call("GET", f"/registrations/{reg['id']}", "subscriber1"), 403, "NotAuthorized")

    # Renew and destroy: its owner, operators and admins; not another principal, not an analyst.
    for user in ("subscriber1", "analyst1"):
        _problem(api.call("DELETE", f"/registrations/{reg['id']}", user), 403, "NotAuthorized")
        renew = api.call(
            "POST", f"/registrations/{reg['id']}:renew", user, json={"termination": "PT2H"}
        )
        _problem(renew, 403, "NotAuthorized")
    renewed = api.call(
        "POST", f"/registrations/{reg['id']}:renew", "publisher1", json={"termination": "PT2H"}
    )
    assert renewed.status_code == 200, renewed.text
    assert renewed.json()["termination_time"] is not None
    assert api.call("DELETE", f"/registrations/{reg['id']}", "publisher1").status_code == 204
    assert b"PublisherRegistrationRejectedFault" in notify_from(platform, SENSOR).content
    _problem(
        api.call("DELETE", f"/registrations/{reg['id']}", "publisher1"), 404, "ResourceUnknownFault"
    )
    assert tag_of(reg["id"]) not in ids(api.call("GET", "/registrations", "analyst1"))


def test_a_soap_registration_is_shown_over_rest_and_ended_by_an_operator(api, platform):  # type: ignore[no-untyped-def]
    res = soap_call(
        platform.endpoint,
        f"<wsnbr:RegisterPublisher {BR}><wsnbr:PublisherReference><wsa:Address>{SENSOR}"
        f'</wsa:Address></wsnbr:PublisherReference><wsnbr:Topic Dialect="{ns.DIALECT_SIMPLE}">'
        "ALL:ALARM</wsnbr:Topic></wsnbr:RegisterPublisher>",
    )
    assert res.status == 200, res.body
    address = res.findtext(f".//{{{ns.WSNBR}}}PublisherRegistrationReference/wsa:Address")
    reg_id = address.rsplit("/", 1)[1]
    shown = api.call("GET", f"/registrations/{reg_id}", "operator1").json()
    assert (shown["reference"], shown["topics"]) == (address, ["ALL:ALARM"])
    # An analyst reads it without the address that would end it.
    tagged = api.call("GET", f"/registrations/{reg_id}", "analyst1").json()
    assert (tagged["id"], tagged["reference"], tagged["topics"]) == (
        tag_of(reg_id),
        None,
        ["ALL:ALARM"],
    )
    # Made anonymously: anyone may end it, as a subscription made anonymously.
    assert api.call("DELETE", f"/registrations/{reg_id}", "operator1").status_code == 204
    again = soap_call(address, f"<wsnbr:DestroyRegistration {BR}/>")
    assert b"ResourceUnknownFault" in again.body


def test_bad_registrations_are_problems_in_the_soap_faults_words(api, platform):  # type: ignore[no-untyped-def]
    def create(body: dict[str, object]):  # type: ignore[no-untyped-def]
        return api.call("POST", "/registrations", "admin1", json=body)

    assert "publisher" in _problem(create({"topics": ["ALL"]}), 400, "validation")["errors"]
    not_uri = _problem(
        create({"publisher": "javascript:alert(1)", "topics": ["ALL"]}),
        403,  # the status every PublisherRegistrationRejectedFault gets
        "PublisherRegistrationRejectedFault",
    )
    assert "'javascript:'" in not_uri["detail"]
    unknown = _problem(
        create({"publisher": SENSOR, "topics": ["NOPE:NOWHERE"]}), 404, "TopicNotSupportedFault"
    )
    fault = soap_call(
        platform.endpoint,
        f"<wsnbr:RegisterPublisher {BR}><wsnbr:PublisherReference><wsa:Address>{SENSOR}"
        f'</wsa:Address></wsnbr:PublisherReference><wsnbr:Topic Dialect="{ns.DIALECT_SIMPLE}">'
        "NOPE:NOWHERE</wsnbr:Topic></wsnbr:RegisterPublisher>",
    )
    assert unknown["detail"] == fault.fault_text
    _problem(
        create({"publisher": SENSOR, "topics": ["ALL//*"], "dialect": "full"}),
        400,
        "InvalidTopicExpressionFault",
    )
    _problem(
        create({"publisher": SENSOR, "topics": ["ALL"], "dialect": "nonsense"}),
        400,
        "TopicExpressionDialectUnknownFault",
    )
    _problem(
        create({"publisher": SENSOR, "topics": ["ALL"], "termination": "yesterday"}),
        400,
        "UnacceptableInitialTerminationTimeFault",
    )
    _problem(
        create({"publisher": SENSOR, "demand": True}), 403, "PublisherRegistrationRejectedFault"
    )
    _problem(
        api.call("GET", f"/registrations/{uuid.uuid4()}", "admin1"), 404, "ResourceUnknownFault"
    )
