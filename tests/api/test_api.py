"""The REST API on the running platform: auth, roles, publish, subscribe, pull, errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable

import httpx
import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.formats.json import JSONFormat

from tests.api.conftest import PASSWORD, USERS, tag_of
from tests.support import (
    ANONYMOUS_ALLOWED,
    free_port,
    notify_xml,
    soap_call,
    subscribe_xml,
    topic_with_policy,
    wait_or_fail,
)

PROBLEM = "application/problem+json"
SECURE = "APISEC:DOORS"  # publish: alarm-publishers, subscribe: alarm-subscribers, no anonymous


@pytest.fixture
def secure_topic(platform, committed):  # type: ignore[no-untyped-def]
    committed(
        topic_with_policy,
        SECURE,
        root={
            "publish_groups": "alarm-publishers",
            "subscribe_groups": "alarm-subscribers",
            "anonymous_publish": False,
            "anonymous_subscribe": False,
        },
    )
    return SECURE


def _problem(r: httpx.Response, status: int, type_: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["type"] == f"urn:hpwsn:problem:{type_}"
    assert body["status"] == status
    return body


def test_it_creates_lists_and_revokes_tokens(api, platform):  # type: ignore[no-untyped-def]
    r = httpx.post(
        platform.base_url + "/api/v1/tokens", json={"name": "ci"}, auth=("subscriber1", PASSWORD)
    )
    assert r.status_code == 201
    new = r.json()
    assert new["token"].startswith(f"hpwsn_{new['prefix']}_")
    bearer = {"Authorization": f"Bearer {new['token']}"}
    listed = httpx.get(platform.base_url + "/api/v1/tokens", headers=bearer).json()
    mine = [t for t in listed if t["id"] == new["id"]]
    assert mine
    assert "token" not in mine[0]
    assert {t["principal"] for t in listed} == {"subscriber1"}
    # Another principal cannot revoke it; its owner can, and it stops working at once.
    other = api.call("DELETE", f"/tokens/{new['id']}", "publisher1")
    _problem(other, 404, "ResourceUnknownFault")
    assert (
        httpx.delete(platform.base_url + f"/api/v1/tokens/{new['id']}", headers=bearer).status_code
        == 204
    )
    _problem(
        httpx.get(platform.base_url + "/api/v1/tokens", headers=bearer),
        401,
        "authentication-failed",
    )
    # Wrong passwords and made-up tokens are refused the same way.
    bad = httpx.get(platform.base_url + "/api/v1/tokens", auth=("subscriber1", "wrong"))
    _problem(bad, 401, "authentication-failed")
    made_up = {"Authorization": "Bearer hpwsn_00000000_" + "x" * 32}
    _problem(
        httpx.get(platform.base_url + "/api/v1/tokens", headers=made_up),
        401,
        "authentication-failed",
    )


def test_a_revoked_token_no_longer_publishes(api, platform):  # type: ignore[no-untyped-def]
    made = httpx.post(
        platform.base_url + "/api/v1/tokens",
        json={"name": "revoked"},
        auth=("publisher1", PASSWORD),
    )
    assert made.status_code == 201, made.text
    bearer = {"Authorization": f"Bearer {made.json()['token']}"}

    def publish() -> httpx.Response:
        # A topic outside the tree: past authentication it is a 404, and nothing is stored.
        return httpx.post(
            platform.base_url + "/api/v1/topics/NOPE:REVOKED/messages",
            json={"json": 1},
            headers=bearer,
            timeout=30,
        )

    # Used once, the token is known to the publish route, which answers without Django.
    _problem(publish(), 404, "TopicNotSupportedFault")
    revoked = httpx.delete(
        platform.base_url + f"/api/v1/tokens/{made.json()['id']}", headers=bearer
    )
    assert revoked.status_code == 204

    wait_or_fail(lambda: publish().status_code == 401, 10, "the revoked token refused")
    for _ in range(3):
        _problem(publish(), 401, "authentication-failed")


def test_it_answers_every_role_as_the_console_and_soap_would(api, secure_topic):  # type: ignore[no-untyped-def]
    users = (None, *USERS)
    door = {"json": {"door": "open"}}
    limits = {"consumer": "http://127.0.0.1:7778/", "window": None, "rate": None}
    bad_run = {"since": "2026-11-21T00:00:00Z", "until": "2026-11-20T00:00:00Z"}  # starts nothing
    # (method, path, body, statuses of: anonymous, publisher1, subscriber1, analyst1, operator1,
    # admin1)
    expected = [
        ("GET", "/topics", None, (401, 403, 403, 200, 200, 200)),
        ("GET", "/deadletters", None, (401, 403, 403, 200, 200, 200)),
        ("GET", "/stats", None, (401, 403, 403, 200, 200, 200)),
        ("GET", "/nodes", None, (401, 403, 403, 200, 200, 200)),
        ("GET", "/audit", None, (401, 403, 403, 200, 200, 200)),
        ("GET", "/consumers", None, (401, 403, 403, 200, 200, 200)),
        ("GET", "/analytics", None, (401, 403, 403, 200, 200, 200)),
        ("POST", "/analytics", bad_run, (401, 403, 403, 403, 400, 400)),
        ("GET", "/registrations", None, (200, 200, 200, 200, 200, 200)),
        ("POST", "/deadletters:redrive", {"ids": [999999]}, (401, 403, 403, 403, 200, 200)),
        ("POST", f"/topics/{SECURE}/messages", door, (403, 202, 403, 403, 403, 202)),
        ("GET", f"/topics/{SECURE}", None, (401, 403, 403, 200, 200, 200)),
        ("GET", "/tokens", None, (401, 200, 200, 200, 200, 200)),
        ("GET", "/subscriptions", None, (200, 200, 200, 200, 200, 200)),
        ("GET", "/pullpoints", None, (200, 200, 200, 200, 200, 200)),
        ("POST", "/pullpoints", None, (201, 201, 201, 201, 201, 201)),
        ("PUT", "/consumers", limits, (401, 403, 403, 403, 200, 200)),
        ("PATCH", f"/topics/{SECURE}", {"description": "doors"}, (401, 403, 403, 403, 200, 200)),
        ("DELETE", "/topics/APISEC:NONE?subscriptions=keep", None, (401, 403, 403, 403, 404, 404)),
        ("DELETE", "/deadletters/999999", None, (401, 403, 403, 403, 404, 404)),
        ("GET", "/deadletters/999999", None, (401, 403, 403, 404, 404, 404)),
    ]
    for method, path, body, statuses in expected:
        for user, status in zip(users, statuses, strict=True):
            r = api.call(method, path, user, json=body) if body else api.call(method, path, user)
            assert r.status_code == status, (method, path, user, r.status_code, r.text)
            if status >= 400:
                assert r.headers["content-type"].startswith(PROBLEM)
    # Creating topics: operators and admins.
    for user, status in zip(users, (401, 403, 403, 403, 201, 201), strict=True):
        r = api.call("POST", "/topics", user, json={"path": f"APISEC:NEW{uuid.uuid4().hex[:6]}"})
        assert r.status_code == status, (user, r.text)
    # Subscribing: the topic's subscribe ACL, as for SOAP (alarm-subscribers, and admins).
    for user, status in zip(users, (403, 403, 201, 403, 403, 201), strict=True):
        r = api.call(
            "POST",
            "/subscriptions",
            user,
            json={"consumer": f"http://127.0.0.1:9/{user}", "topic": SECURE},
        )
        assert r.status_code == status, (user, r.text)
        if status == 201:  # nothing listens there: not left failing for the tests after this one
            assert api.call("DELETE", f"/subscriptions/{r.json()['id']}", user).status_code == 204
    refused = api.call("POST", f"/topics/{SECURE}/messages", "subscriber1", json={"json": 1})
    body = _problem(refused, 403, "NotAuthorized")
    assert body["detail"] == f"user 'subscriber1' may not publish on topic '{SECURE}'"


def test_a_topics_last_message_is_refused_however_its_path_is_spelled(api, secure_topic):  # type: ignore[no-untyped-def]
    # The subscribe rule of the topic the path resolves to applies. A path with a space or a tab
    # around it (which the topic expression's parse strips) once skipped the check, and anyone
    # read the closed topic's last message.
    secret = f"door {uuid.uuid4().hex}"
    r = api.call("POST", f"/topics/{SECURE}/messages", "publisher1", json={"json": secret})
    assert r.status_code == 202, r.text
    for spelling in (SECURE, f"%20{SECURE}", f"{SECURE}%09", f"{SECURE}%20", f"%09{SECURE}%20"):
        for user in (None, "publisher1", "analyst1"):
            r = api.call("GET", f"/topics/{spelling}/messages", user)
            _problem(r, 403, "NotAuthorized")
            assert secret not in r.text, (spelling, user)
    read = api.call("GET", f"/topics/%20{SECURE}/messages", "subscriber1")
    assert read.status_code == 200, read.text
    assert read.json()["data"] == secret


def test_it_delivers_a_rest_publication_to_a_soap_subscriber(api, platform, consumer_factory):  # type: ignore[no-untyped-def]
    consumer = consumer_factory()
    r = soap_call(platform.endpoint, subscribe_xml(consumer.url, "ALL:ALARM"))
    assert r.status == 200
    xml = '<alarm xmlns="urn:demo">rest fire</alarm>'
    published = api.call(
        "POST", "/topics/ALL:ALARM:ALARM1/messages", "publisher1", json={"xml": xml}
    )
    assert published.status_code == 202, published.text
    assert len(published.json()["ids"]) == 1
    # A bare XML body is one message too.
    bare = api.call(
        "POST",
        "/topics/ALL:ALARM:ALARM2/messages",
        "publisher1",
        content=b'<alarm xmlns="urn:demo">bare</alarm>',
        headers={"Content-Type": "application/xml"},
    )
    assert bare.status_code == 202, bare.text
    assert consumer.wait_for(2)
    got = sorted(zip((r.topic for r in consumer.received), consumer.payload_texts(), strict=True))
    assert got == [("ALL:ALARM:ALARM1", "rest fire"), ("ALL:ALARM:ALARM2", "bare")]
    current = api.call("GET", "/topics/ALL:ALARM:ALARM2/messages", "publisher1").json()
    assert current["datacontenttype"] == "application/xml"
    assert "bare" in current["data"]


def test_it_pushes_a_soap_notify_to_a_cloudevents_subscriber(api, platform, webhook):  # type: ignore[no-untyped-def]
    r = api.call(
        "POST",
        "/subscriptions",
        "subscriber1",
        json={
            "consumer": webhook.url,
            "topic": "Object:Food",
            "format": "cloudevents",
            "signing_secret": "s3cret",
            "termination": "PT1H",
        },
    )
    assert r.status_code == 201, r.text
    sub = r.json()
    assert sub["format"] == "cloudevents"
    assert sub["mode"] == "push"
    notify = notify_xml(
        ("Object:Food:Fruit:Apple", '<fruit xmlns="urn:demo">apple</fruit>'),
        ("Object:Food:Bread", '<bread xmlns="urn:demo">rye</bread>'),
    )
    assert soap_call(platform.endpoint, notify).status == 202
    api.call("POST", "/topics/Object:Tool/messages", "publisher1", json={"json": {"x": 1}})
    api.call(
        "POST", "/topics/Object:Food:Bread/messages", "publisher1", json={"json": {"n": [1, 2]}}
    )
    wait_or_fail(lambda: len(webhook.events()) >= 3, 20, "three CloudEvents")
    fmt = JSONFormat()
    events = []
    for headers, body in webhook.posts:
        assert "webhook-signature" in headers  # Standard Webhooks, as for SOAP pushes
        if headers["content-type"].startswith("application/cloudevents-batch+json"):
            events += [fmt.read(None, json.dumps(item)) for item in json.loads(body)]
        else:
            assert headers["content-type"].startswith("application/cloudevents+json")
            events.append(from_http(HTTPMessage(headers=headers, body=body), fmt))
    by_type = [(e.get_type(), e.get_data()) for e in events]
    assert ("Object:Food:Fruit:Apple", '<fruit xmlns="urn:demo">apple</fruit>') in by_type
    assert ("Object:Food:Bread", '<bread xmlns="urn:demo">rye</bread>') in by_type
    assert ("Object:Food:Bread", {"n": [1, 2]}) in by_type
    assert all(e.get_type() != "Object:Tool" for e in events)  # not subscribed
    for e in events:
        assert e.get_source().startswith(platform.base_url)
        assert len(e.get_id()) == 32
        assert e.get_time() is not None
        assert e.get_datacontenttype() in ("application/xml", "application/json")


def test_it_stores_a_repeated_idempotency_key_once(api, consumer_factory, platform, db_access):  # type: ignore[no-untyped-def]
    consumer = consumer_factory()
    soap_call(platform.endpoint, subscribe_xml(consumer.url, "ALL2"))
    key = {"Idempotency-Key": f"order-{uuid.uuid4()}"}
    batch = {"messages": [{"json": {"i": 1}}, {"json": {"i": 2}}]}
    first = api.call("POST", "/topics/ALL2/messages", "publisher1", json=batch, headers=key)
    again = api.call("POST", "/topics/ALL2/messages", "publisher1", json=batch, headers=key)
    assert first.status_code == again.status_code == 202
    assert first.json()["ids"] == again.json()["ids"]
    # ALL2 is reliable: both messages were committed to the log before the 202, under the key a
    # SOAP Notify with this Idempotency-Key would have had.
    from dispatch.models import StoredMessage

    stored = StoredMessage.objects.filter(
        idempotency_key__startswith=f"publisher1|{key['Idempotency-Key']}#"
    )
    assert sorted(stored.values_list("notification_id", flat=True)) == sorted(first.json()["ids"])
    # Another principal's same key is its own publication.
    other = api.call("POST", "/topics/ALL2/messages", "admin1", json=batch, headers=key)
    assert other.json()["ids"] != first.json()["ids"]
    assert consumer.wait_for(4)
    wait_or_fail(lambda: len(consumer.received) == 4, 2, "no fifth delivery")
    assert len(consumer.received) == 4


def test_errors_are_problems_in_the_soap_faults_words(api, platform):  # type: ignore[no-untyped-def]
    fault = soap_call(platform.endpoint, notify_xml(("NOPE:NOWHERE", "<a>1</a>")))
    rest = api.call("POST", "/topics/NOPE:NOWHERE/messages", "publisher1", json={"xml": "<a>1</a>"})
    body = _problem(rest, 404, "TopicNotSupportedFault")
    assert body["detail"] == fault.fault_text
    _problem(
        api.call("POST", "/topics/ALL1/messages", "publisher1", json={"xml": "<a>unclosed"}),
        400,
        "SoapClientFault",
    )
    _problem(
        api.call(
            "POST",
            "/topics/ALL1/messages",
            "publisher1",
            content=b"{",
            headers={"Content-Type": "application/json"},
        ),
        400,
        "malformed-request",
    )
    bad = api.call("POST", "/subscriptions", "subscriber1", json={"topic": "ALL"})
    assert "errors" in _problem(bad, 400, "validation")
    bad_xpath = api.call(
        "POST",
        "/subscriptions",
        "subscriber1",
        json={"consumer": "http://127.0.0.1:9/x", "topic": "ALL", "filter": {"xpath": "(("}},
    )
    _problem(bad_xpath, 400, "InvalidMessageContentExpressionFault")
    _problem(
        api.call("GET", f"/subscriptions/{uuid.uuid4()}", "subscriber1"),
        404,
        "ResourceUnknownFault",
    )
    _problem(api.call("DELETE", "/topics", "admin1"), 405, "method-not-allowed")
    _problem(
        api.call(
            "POST",
            "/topics/ALL1/messages",
            "publisher1",
            content=b"x",
            headers={"Content-Type": "text/plain"},
        ),
        415,
        "unsupported-media-type",
    )
    _problem(api.call("GET", "/no/such/thing", "publisher1"), 404, "not-found")
    # Bodies over HPWSN_MAX_REQUEST_BYTES (10 MiB): the publish route and the others alike.
    huge = b'{"json": "' + b"x" * (11 * 1024 * 1024) + b'"}'
    json_ct = {"Content-Type": "application/json"}
    for path in ("/topics/ALL1/messages", "/subscriptions"):
        _problem(
            api.call("POST", path, "publisher1", content=huge, headers=json_ct), 413, "too-large"
        )


def test_a_batch_with_one_bad_message_stores_none_of_them(
    api, platform, committed, consumer_factory
):  # type: ignore[no-untyped-def]
    topic = "APIBATCH:Tray"
    committed(topic_with_policy, topic, root=ANONYMOUS_ALLOWED)
    consumer = consumer_factory()
    assert soap_call(platform.endpoint, subscribe_xml(consumer.url, topic)).status == 200
    path = f"/topics/{topic}/messages"
    good = {"json": {"n": "refused"}}
    refused = [
        api.call("POST", path, "publisher1", json={"messages": [good, {"xml": "<unclosed"}]}),
        api.call("POST", path, "publisher1", json={"messages": [good, {"json": 1, "xml": "<a/>"}]}),
        api.call("POST", path, "publisher1", json={"messages": [good] * 1001}),
        api.call("POST", path, "publisher1", json={"messages": []}),
    ]
    for answer in refused:
        _problem(answer, 400, "SoapClientFault")
    assert "1 to 1000 messages" in refused[2].json()["detail"]

    after = api.call("POST", path, "publisher1", json={"messages": [{"json": {"n": "after"}}]})
    assert after.status_code == 202, after.text

    # Delivery is in order: had any refused message been stored, it would arrive first.
    assert consumer.wait_for(1)
    assert consumer.payload_texts() == ['{"n":"after"}']


def test_it_pulls_from_a_pull_point_and_manages_a_subscription(api):  # type: ignore[no-untyped-def]
    pp = api.call("POST", "/pullpoints", "subscriber1").json()
    sub = api.call(
        "POST", "/subscriptions", "subscriber1", json={"pullpoint": pp["id"], "topic": "ALL3"}
    ).json()
    assert sub["mode"] == "pull"
    for n in range(3):
        api.call("POST", "/topics/ALL3/messages", "publisher1", json={"json": {"n": n}})
    got: list[object] = []

    def pulled() -> bool:
        r = api.call(
            "POST", f"/pullpoints/{pp['id']}/messages:pull", "subscriber1", json={"maximum": 2}
        )
        got.extend(m["data"] for m in r.json())
        return len(got) >= 3

    wait_or_fail(pulled, 20, "three pulled messages")
    assert got == [{"n": 0}, {"n": 1}, {"n": 2}]
    sid = sub["id"]
    assert (
        api.call("POST", f"/subscriptions/{sid}:pause", "subscriber1").json()["state"] == "paused"
    )
    assert (
        api.call("POST", f"/subscriptions/{sid}:resume", "subscriber1").json()["state"] == "active"
    )
    renewed = api.call(
        "POST", f"/subscriptions/{sid}:renew", "subscriber1", json={"termination": "PT2H"}
    )
    assert renewed.json()["termination_time"] is not None
    detail = api.call("GET", f"/subscriptions/{sid}", "subscriber1").json()
    assert detail["queued"] == 0
    assert detail["attempts"] == []
    # An analyst lists it by its tag: its id is a capability it does not own.
    listed = api.call("GET", "/subscriptions?topic=ALL3", "analyst1").json()
    assert tag_of(sid) in [s["id"] for s in listed["results"]]
    # Its owner lists its own subscriptions; another principal neither lists nor acts on it.
    assert sid in [
        s["id"] for s in api.call("GET", "/subscriptions", "subscriber1").json()["results"]
    ]
    assert sid not in [
        s["id"] for s in api.call("GET", "/subscriptions", "publisher1").json()["results"]
    ]
    _problem(api.call("POST", f"/subscriptions/{sid}:pause", "publisher1"), 403, "NotAuthorized")
    audit = api.call("GET", f"/audit?object={sid}", "operator1").json()["results"]
    assert {"subscription.pause", "subscription.resume", "subscription.renew"} <= {
        a["action"] for a in audit
    }
    assert api.call("DELETE", f"/subscriptions/{sid}", "subscriber1").status_code == 204
    _problem(api.call("GET", f"/subscriptions/{sid}", "subscriber1"), 404, "ResourceUnknownFault")
    assert api.call("DELETE", f"/pullpoints/{pp['id']}", "subscriber1").status_code == 204
    _problem(
        api.call("DELETE", f"/pullpoints/{pp['id']}", "subscriber1"),
        409,
        "UnableToDestroyPullPointFault",
    )


def test_nobody_but_the_owner_or_staff_may_read_or_pull_a_pull_point(api, committed):  # type: ignore[no-untyped-def]
    topic = "APIPULL:Bin"
    committed(topic_with_policy, topic, root=ANONYMOUS_ALLOWED)
    pp = api.call("POST", "/pullpoints", "subscriber1").json()
    made = api.call(
        "POST", "/subscriptions", "subscriber1", json={"pullpoint": pp["id"], "topic": topic}
    )
    assert made.status_code == 201, made.text
    for n in range(2):
        assert (
            api.call("POST", f"/topics/{topic}/messages", None, json={"json": n}).status_code == 202
        )
    wait_or_fail(
        lambda: api.call("GET", f"/pullpoints/{pp['id']}", "subscriber1").json()["queued"] == 2,
        20,
        "two messages in the pull point",
    )

    for user in (None, "publisher1", "analyst1"):  # an analyst reads anything, but changes nothing
        pulled = api.call("POST", f"/pullpoints/{pp['id']}/messages:pull", user, json={})
        _problem(pulled, 403, "NotAuthorized")
        _problem(api.call("DELETE", f"/pullpoints/{pp['id']}", user), 403, "NotAuthorized")
    for user in (None, "publisher1"):
        _problem(api.call("GET", f"/pullpoints/{pp['id']}", user), 403, "NotAuthorized")
        listed = api.call("GET", "/pullpoints", user).json()["results"]
        assert pp["id"] not in [p["id"] for p in listed]
    assert api.call("GET", f"/pullpoints/{pp['id']}", "analyst1").json()["queued"] == 2

    # The refused calls took nothing: the owner gets both messages.
    got = api.call("POST", f"/pullpoints/{pp['id']}/messages:pull", "subscriber1", json={})
    assert [m["data"] for m in got.json()] == [0, 1]
    assert api.call("DELETE", f"/pullpoints/{pp['id']}", "subscriber1").status_code == 204


def test_it_manages_topics_like_the_console(api, platform, committed):  # type: ignore[no-untyped-def]
    name = f"APITREE{uuid.uuid4().hex[:6]}"
    made = api.call("POST", "/topics", "operator1", json={"path": f"{name}:A:B"})
    assert made.status_code == 201
    changed = api.call(
        "PATCH",
        f"/topics/{name}:A",
        "operator1",
        json={"name": "AA", "policy": {"reliability": "fast", "priority": 7}},
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["path"] == f"{name}:AA"
    child = api.call("GET", f"/topics/{name}:AA:B", "analyst1").json()
    assert child["policy"]["reliability"] == ""  # inherits
    assert child["effective_policy"]["reliability"] == "fast"
    assert child["effective_policy"]["priority"] == 7
    nested = api.call("GET", "/topics?nested=true", "analyst1").json()
    root = next(t for t in nested if t["path"] == name)
    assert root["children"][0]["children"][0]["path"] == f"{name}:AA:B"
    _problem(api.call("DELETE", f"/topics/{name}", "operator1"), 400, "validation")
    assert (
        api.call("DELETE", f"/topics/{name}?subscriptions=delete", "operator1").status_code == 204
    )
    _problem(api.call("GET", f"/topics/{name}", "operator1"), 404, "TopicNotSupportedFault")


def test_it_sets_consumer_limits(api):  # type: ignore[no-untyped-def]
    r = api.call(
        "PUT",
        "/consumers",
        "operator1",
        json={"consumer": "http://127.0.0.1:7777/x", "window": 5, "rate": 10},
    )
    assert r.status_code == 200
    assert r.json()["consumer"] == "http://127.0.0.1:7777"
    rows = api.call("GET", "/consumers", "analyst1").json()["consumers"]
    assert {"consumer": "http://127.0.0.1:7777", "window": 5, "rate": 10.0} in rows
    api.call(
        "PUT",
        "/consumers",
        "operator1",
        json={"consumer": "http://127.0.0.1:7777/", "window": None, "rate": None},
    )
    assert all(
        c["consumer"] != "http://127.0.0.1:7777"
        for c in api.call("GET", "/consumers", "analyst1").json()["consumers"]
    )


def test_it_throttles_with_429_and_retry_after(platform):  # type: ignore[no-untyped-def]
    # Token creation allows 20 a minute per principal: within 41 requests (two windows at most)
    # one is refused.
    statuses = []
    for _ in range(41):
        answer = httpx.post(
            platform.base_url + "/api/v1/tokens", json={}, auth=("publisher1", PASSWORD)
        )
        statuses.append(answer.status_code)
        if answer.status_code == 429:
            break
    assert statuses[0] == 201
    _problem(answer, 429, "throttled")
    assert int(answer.headers["Retry-After"]) >= 1
    assert answer.json()["retry_after"] == int(answer.headers["Retry-After"])


@pytest.fixture
def web_limited(request, django_db_setup, tmp_path):  # type: ignore[no-untyped-def]
    """A web process of its own whose anonymous callers may make two API calls and two publishes
    an hour, on the test database and Redis; HPWSN_API_PROXIES is the test's parameter (0, no
    reverse proxy, by default)."""
    from django.conf import settings

    from hpwsn_site.serve import command
    from tests.conftest import _database_url

    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "HPWSN_DATA_DIR": str(tmp_path),
        "HPWSN_SECRET_KEY": "test-secret-key-not-for-production",
        "HPWSN_API_THROTTLE_API": "2/hour",
        "HPWSN_API_THROTTLE_PUBLISH": "2/hour",
        "HPWSN_EVENTS": "0",
    }
    for name in ("HPWSN_API_PROXIES", "FORWARDED_ALLOW_IPS"):
        env.pop(name, None)
    env["HPWSN_API_PROXIES"] = str(getattr(request, "param", 0))
    log = open(tmp_path / "web.log", "wb")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(
        command(python=sys.executable, host="127.0.0.1", port=port),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(base + "/healthz", timeout=2).status_code in (200, 503)
        except httpx.HTTPError:
            return False

    try:
        wait_or_fail(up, 60, "the web process")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def _limited_calls(base: str) -> dict[str, Callable[[dict[str, str]], httpx.Response]]:
    """An anonymous API call and publish on the web process of `web_limited`, with headers."""
    return {
        "api": lambda headers: httpx.get(base + "/api/v1/subscriptions", headers=headers),
        "publish": lambda headers: httpx.post(
            base + "/api/v1/topics/NOPE:THROTTLED/messages", json={"json": 1}, headers=headers
        ),
    }


def test_an_anonymous_caller_cannot_escape_its_rate_limit_with_a_made_up_forwarded_for(
    web_limited,
):  # type: ignore[no-untyped-def]
    calls = _limited_calls(web_limited)
    for scope, call in calls.items():
        # Two calls an hour from this address (an earlier run in this hour may have spent them).
        statuses = [call({}).status_code for _ in range(3)]
        assert statuses[-1] == 429, (scope, statuses)
        # X-Forwarded-For is the client's own word: without proxies it names nobody.
        for n in range(3):
            forged = call({"X-Forwarded-For": f"198.51.100.{n + 1}"})
            _problem(forged, 429, "throttled")


@pytest.mark.parametrize("web_limited", [1], indirect=True)
def test_behind_a_proxy_each_client_has_its_own_limit_and_cannot_name_another(
    web_limited,
):  # type: ignore[no-untyped-def]
    # This test is the one proxy in front (HPWSN_API_PROXIES=1): the last address of
    # X-Forwarded-For is the client it saw; what the client wrote before that is its own word.
    calls = _limited_calls(web_limited)
    run = uuid.uuid4().int % 65536  # addresses no earlier run in this hour used
    client, another = f"198.18.{run >> 8}.{run & 255}", f"198.19.{run >> 8}.{run & 255}"
    for scope, call in calls.items():
        statuses = [call({"X-Forwarded-For": client}).status_code for _ in range(3)]
        assert statuses[0] != 429, (scope, statuses)
        assert statuses[-1] == 429, (scope, statuses)
        # The same client, prefixing addresses of its choice: still its own bucket.
        for n in range(3):
            forged = {"X-Forwarded-For": f"198.51.100.{n + 1}, {client}"}
            _problem(call(forged), 429, "throttled")
        # Another client behind the same proxy has its own limit.
        other = call({"X-Forwarded-For": another})
        assert other.status_code != 429, (scope, other.status_code, other.text)


def test_schema_and_docs_are_served_offline(platform):  # type: ignore[no-untyped-def]
    schema = httpx.get(platform.base_url + "/api/schema/?format=json").json()
    assert schema["openapi"].startswith("3.1")
    assert "/api/v1/topics/{path}/messages" in schema["paths"]
    index = httpx.get(platform.base_url + "/api/v1/").json()
    assert index["resources"]["topics"] == platform.base_url + "/api/v1/topics"
    page = httpx.get(platform.base_url + "/api/docs/")
    assert page.status_code == 200
    assert "/static/drf_spectacular_sidecar/" in page.text  # served by us, not a CDN
    assets = re.findall(r'(?:src|href)="(/static/drf_spectacular_sidecar/[^"]+)"', page.text)
    assert assets
    for asset in assets:
        got = httpx.get(platform.base_url + asset)
        assert got.status_code == 200, asset
        assert len(got.content) > 100
    redoc = httpx.get(platform.base_url + "/api/docs/redoc/")
    bundle = re.findall(r'src="(/static/drf_spectacular_sidecar/redoc/[^"]+)"', redoc.text)
    assert bundle
    assert httpx.get(platform.base_url + bundle[0]).status_code == 200


def _console_session(base: str, user: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=30)
    client.get("/console/login/")  # sets the CSRF cookie
    token = client.cookies["csrftoken"]
    r = client.post(
        "/console/login/",
        data={"username": user, "password": PASSWORD, "csrfmiddlewaretoken": token},
        headers={"Referer": base + "/console/login/"},
    )
    assert r.status_code in (200, 302)
    assert "sessionid" in client.cookies
    return client


def test_a_console_session_publishes_through_the_same_rules(api, platform, consumer_factory):  # type: ignore[no-untyped-def]
    consumer = consumer_factory()
    soap_call(platform.endpoint, subscribe_xml(consumer.url, "ALL1"))
    session = _console_session(platform.base_url, "admin1")
    try:
        csrf = {"X-CSRFToken": session.cookies["csrftoken"], "Referer": platform.base_url + "/"}
        # Without the CSRF token a session may not write.
        no_csrf = session.post("/api/v1/topics/ALL1/messages", json={"json": {"via": "x"}})
        _problem(no_csrf, 403, "forbidden")
        ok = session.post(
            "/api/v1/topics/ALL1/messages", json={"json": {"via": "session"}}, headers=csrf
        )
        assert ok.status_code == 202, ok.text
        # The session (DRF view) and a token (fast path) are answered in the same words.
        by_session = session.post(
            "/api/v1/topics/NOPE:X/messages", json={"json": 1}, headers=csrf
        ).json()
        by_token = api.call("POST", "/topics/NOPE:X/messages", "admin1", json={"json": 1}).json()
        assert by_session == by_token
        tokens = session.get("/api/v1/tokens")
        assert tokens.status_code == 200
    finally:
        session.close()
    assert consumer.wait_for(1)
    assert consumer.payload_texts() == ['{"via":"session"}']


def test_a_soap_subscriber_may_ask_for_cloudevents(platform, webhook):  # type: ignore[no-untyped-def]
    def subscribe(value: str) -> object:
        policy = (
            '<wsnt:SubscriptionPolicy><hpwsn:Format xmlns:hpwsn="urn:hpwsn:2026">'
            f"{value}</hpwsn:Format></wsnt:SubscriptionPolicy></wsnt:Subscribe>"
        )
        body = subscribe_xml(webhook.url, "Object:Tool").replace("</wsnt:Subscribe>", policy)
        return soap_call(platform.endpoint, body)

    refused = subscribe("yaml")
    assert refused.fault_name == "UnsupportedPolicyRequestFault"
    assert "push format 'yaml' is not supported" in refused.fault_text
    assert subscribe("cloudevents").status == 200
    notify = notify_xml(("Object:Tool", '<tool xmlns="urn:demo">saw</tool>'))
    assert soap_call(platform.endpoint, notify).status == 202
    wait_or_fail(lambda: len(webhook.events()) >= 1, 20, "a CloudEvent")
    headers, body = webhook.posts[0]
    event = from_http(HTTPMessage(headers=headers, body=body), JSONFormat())
    assert event.get_type() == "Object:Tool"
    assert event.get_data() == '<tool xmlns="urn:demo">saw</tool>'


def test_the_console_creates_and_revokes_api_tokens(platform):  # type: ignore[no-untyped-def]
    session = _console_session(platform.base_url, "operator1")
    try:
        csrf = {"csrfmiddlewaretoken": session.cookies["csrftoken"]}
        page = session.post("/console/tokens/", data={**csrf, "name": "from-the-console"})
        assert page.status_code == 200
        assert page.headers["cache-control"] == "no-store"
        token = page.text.split('<code id="new-token">', 1)[1].split("</code>", 1)[0]
        bearer = {"Authorization": f"Bearer {token}"}
        mine = httpx.get(platform.base_url + "/api/v1/tokens", headers=bearer).json()
        row = next(t for t in mine if t["name"] == "from-the-console")
        assert row["principal"] == "operator1"
        again = session.get("/console/tokens/")
        assert token not in again.text  # shown once
        assert "from-the-console" in again.text
        revoked = session.post(f"/console/tokens/{row['id']}/revoke/", data=csrf)
        assert revoked.status_code == 302
        after = httpx.get(platform.base_url + "/api/v1/tokens", headers=bearer)
        _problem(after, 401, "authentication-failed")
    finally:
        session.close()
