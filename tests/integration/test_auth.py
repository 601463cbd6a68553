"""SOAP authentication against the real slapd, and per-topic publish/subscribe rights.

The demo directory (directory/slapd/seed.ldif.in) has publisher1 in alarm-publishers,
subscriber1 in alarm-subscribers, admin1 in hpwsn-admins and analyst1 in hpwsn-analysts.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from lxml import etree
from zeep.wsse.username import UsernameToken

from hpwsn import ns
from hpwsn_site import state
from tests.support import CT, SOAP_NS, SoapResult, notify_xml, subscribe_xml

pytestmark = pytest.mark.integration

# Secured: members of alarm-publishers publish, of alarm-subscribers subscribe; nobody else.
SECURED = "AuthAlarms"
LEAF = f"{SECURED}:Site1:Door"  # no policy of its own: inherits SECURED's
OPEN = "AuthOpen"  # anonymous callers may publish and subscribe
CLOSED = "AuthClosed"  # no policy anywhere: the secure default (admins only)


@pytest.fixture
def topics(platform, committed):  # type: ignore[no-untyped-def]
    from django.db import transaction

    from topics.models import Topic
    from topics.services import topic_create

    def write() -> None:
        # One transaction, the tree's version moved on commit: no process sees the topics
        # without their policies.
        with transaction.atomic():
            for path in (LEAF, OPEN, CLOSED):
                topic_create(path=path)
            Topic.objects.filter(path=SECURED).update(
                publish_groups="alarm-publishers", subscribe_groups="alarm-subscribers"
            )
            Topic.objects.filter(path=OPEN).update(anonymous_publish=True, anonymous_subscribe=True)
            transaction.on_commit(lambda: state.bump(state.VERSION_TOPICS))

    committed(write)


@pytest.fixture
def password(ldap_directory):  # type: ignore[no-untyped-def]
    return ldap_directory.demo_password


def post(
    platform,  # type: ignore[no-untyped-def]
    body_xml: str,
    *,
    version: str = "1.1",
    token: UsernameToken | None = None,
    basic: tuple[str, str] | None = None,
    data: bytes | None = None,
) -> tuple[httpx.Response, SoapResult, bytes]:
    """POST an envelope, signed with a UsernameToken as zeep makes it, or with HTTP Basic."""
    if data is None:
        envelope = etree.fromstring(
            f'<s:Envelope xmlns:s="{SOAP_NS[version]}" xmlns:wsnt="{ns.WSNT}" '
            f'xmlns:wsa="{ns.WSA}"><s:Header><wsa:MessageID>urn:uuid:{uuid.uuid4()}'
            f"</wsa:MessageID></s:Header><s:Body>{body_xml}</s:Body></s:Envelope>"
        )
        if token is not None:
            envelope, _headers = token.apply(envelope, {})
        data = etree.tostring(envelope)
    headers = {"Content-Type": CT[version]}
    if basic is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(basic).encode()).decode()
    resp = httpx.post(platform.endpoint, content=data, headers=headers, timeout=30)
    root = etree.fromstring(resp.content) if resp.content.strip().startswith(b"<") else None
    return resp, SoapResult(resp.status_code, resp.content, root), data


def event(text: str) -> str:
    return f"<e:ev xmlns:e='urn:auth'>{text}</e:ev>"


def ws_security_code(res: SoapResult, version: str) -> str | None:
    """The wsse fault code: the faultcode in SOAP 1.1, the Subcode in SOAP 1.2."""
    assert res.root is not None, res.body
    if version == "1.1":
        el = res.root.find(".//faultcode")
    else:
        el = res.root.find(f".//{{{ns.SOAP12}}}Subcode/{{{ns.SOAP12}}}Value")
    if el is None:
        return None
    prefix, _, local = (el.text or "").partition(":")
    return local if el.nsmap.get(prefix) == ns.WSSE else None


def assert_not_authorized(res: SoapResult, *, principal: str | None, operation: str, topic: str):  # type: ignore[no-untyped-def]
    assert res.fault_name == "NotAuthorized", res.body
    assert res.root is not None
    detail = res.root.find(f".//{{{ns.HPWSN}}}NotAuthorized")
    assert detail is not None
    who = detail.find(f"{{{ns.HPWSN}}}Principal")
    assert who is not None
    if principal is None:
        assert who.get("anonymous") == "true"
    else:
        assert who.text == principal
    assert detail.findtext(f"{{{ns.HPWSN}}}Operation") == operation
    assert detail.findtext(f"{{{ns.HPWSN}}}Topic") == topic
    assert topic in res.fault_text


def subscribe(platform, consumer_url: str, topic: str, **auth) -> SoapResult:  # type: ignore[no-untyped-def]
    return post(platform, subscribe_xml(consumer_url, topic), **auth)[1]


def admin_watch(platform, consumer_factory, password, topic: str):  # type: ignore[no-untyped-def]
    """A consumer subscribed by admin1 to a topic, to see what publishing really stored."""
    consumer = consumer_factory()
    res = subscribe(
        platform, consumer.url, topic, token=UsernameToken("admin1", password("admin1"))
    )
    assert res.status == 200, res.body
    return consumer


# ----------------------------------------------------------------------------- anonymous


def test_an_anonymous_caller_may_publish_and_subscribe_where_the_topic_allows_it(
    platform, topics, consumer_factory
):
    consumer = consumer_factory()
    assert subscribe(platform, consumer.url, OPEN).status == 200

    resp, res, _ = post(platform, notify_xml((OPEN, event("open"))))

    assert resp.status_code == 202, res.body
    assert consumer.wait_for(1)
    assert consumer.payload_texts() == ["open"]


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_an_anonymous_notify_on_a_secured_topic_is_refused_and_stores_nothing(
    platform, topics, consumer_factory, password, version
):
    secured = admin_watch(platform, consumer_factory, password, SECURED)
    opened = consumer_factory()
    assert subscribe(platform, opened.url, OPEN).status == 200

    # One message it may publish and one it may not: the whole Notify is refused.
    _, res, _ = post(
        platform, notify_xml((OPEN, event("open")), (LEAF, event("leaf"))), version=version
    )

    assert res.status == (500 if version == "1.1" else 400)
    assert_not_authorized(res, principal=None, operation="publish", topic=LEAF)
    # Delivery is in order: once the later messages arrived, stored refused ones would have
    # arrived before them.
    token = UsernameToken("publisher1", password("publisher1"))
    later = notify_xml((OPEN, event("later open")), (LEAF, event("later leaf")))
    assert post(platform, later, token=token)[0].status_code == 202
    assert secured.wait_for(1)
    assert opened.wait_for(1)
    assert secured.payload_texts() == ["later leaf"]
    assert opened.payload_texts() == ["later open"]


def test_an_anonymous_subscribe_to_a_secured_topic_is_refused(platform, topics, consumer_factory):
    consumer = consumer_factory()

    res = subscribe(platform, consumer.url, SECURED)

    assert_not_authorized(res, principal=None, operation="subscribe", topic=SECURED)


# ----------------------------------------------------------------------------- credentials


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_a_publisher_with_a_text_token_publishes_on_a_topic_inheriting_its_parents_acl(
    platform, topics, consumer_factory, password, version
):
    consumer = admin_watch(platform, consumer_factory, password, LEAF)
    token = UsernameToken("publisher1", password("publisher1"))

    resp, res, _ = post(
        platform, notify_xml((LEAF, event("door open"))), token=token, version=version
    )

    assert resp.status_code == 202, res.body
    assert consumer.wait_for(1)
    assert consumer.payload_texts() == ["door open"]


def test_a_digest_token_is_accepted_once_and_its_replay_is_refused(
    platform, topics, consumer_factory, password
):
    consumer = admin_watch(platform, consumer_factory, password, SECURED)
    token = UsernameToken("publisher1", password("publisher1"), use_digest=True)

    first, res, data = post(platform, notify_xml((LEAF, event("digest"))), token=token)
    _, replayed, _ = post(platform, "", data=data)

    assert first.status_code == 202, res.body
    assert ws_security_code(replayed, "1.1") == "FailedAuthentication", replayed.body
    assert "nonce" in replayed.fault_text
    assert consumer.wait_for(1)
    assert consumer.payload_texts() == ["digest"]


@pytest.mark.parametrize("spelling", ["PUBLISHER1", "Publisher1"])
def test_a_digest_token_resent_under_another_spelling_of_the_user_name_is_a_replay(
    platform, topics, consumer_factory, password, spelling
):
    # The directory matches uids case-insensitively, so the resent token authenticates as the
    # same person: it is the same nonce of the same person, a replay.
    consumer = admin_watch(platform, consumer_factory, password, SECURED)
    token = UsernameToken("publisher1", password("publisher1"), use_digest=True)
    first, res, data = post(platform, notify_xml((LEAF, event("once"))), token=token)
    respelled = data.replace(b">publisher1</", f">{spelling}</".encode())
    assert respelled != data

    _, replayed, _ = post(platform, "", data=respelled)

    assert first.status_code == 202, res.body
    assert ws_security_code(replayed, "1.1") == "FailedAuthentication", replayed.body
    assert "nonce" in replayed.fault_text
    later = UsernameToken("publisher1", password("publisher1"), use_digest=True)
    assert post(platform, notify_xml((LEAF, event("later"))), token=later)[0].status_code == 202
    assert consumer.wait_for(2)
    assert consumer.payload_texts() == ["once", "later"]


def test_a_digest_token_created_too_long_ago_has_expired(platform, topics, password):
    created = datetime.now(UTC) - timedelta(minutes=10)
    token = UsernameToken("publisher1", password("publisher1"), use_digest=True, created=created)

    _, res, _ = post(platform, notify_xml((OPEN, event("x"))), token=token, version="1.2")

    assert res.status == 400, res.body
    assert ws_security_code(res, "1.2") == "MessageExpired", res.body


def test_a_digest_made_with_a_wrong_secret_fails_authentication(platform, topics):
    token = UsernameToken("publisher1", "not-the-secret", use_digest=True)

    _, res, _ = post(platform, notify_xml((OPEN, event("x"))), token=token)

    assert ws_security_code(res, "1.1") == "FailedAuthentication", res.body


def test_a_publisher_with_http_basic_publishes(platform, topics, consumer_factory, password):
    consumer = admin_watch(platform, consumer_factory, password, SECURED)

    resp, res, _ = post(
        platform,
        notify_xml((SECURED, event("basic"))),
        basic=("publisher1", password("publisher1")),
    )

    assert resp.status_code == 202, res.body
    assert consumer.wait_for(1)
    assert consumer.payload_texts() == ["basic"]


def test_a_username_token_wins_over_http_basic(platform, topics, consumer_factory, password):
    consumer = admin_watch(platform, consumer_factory, password, SECURED)
    publisher = ("publisher1", password("publisher1"))

    # The envelope names subscriber1, who may not publish; Basic names publisher1, who may.
    _, refused, _ = post(
        platform,
        notify_xml((SECURED, event("as subscriber1"))),
        token=UsernameToken("subscriber1", password("subscriber1")),
        basic=publisher,
    )
    _, wrong, _ = post(
        platform,
        notify_xml((SECURED, event("wrong token"))),
        token=UsernameToken("publisher1", "wrong-password"),
        basic=publisher,
    )
    resp, _, _ = post(platform, notify_xml((SECURED, event("basic alone"))), basic=publisher)

    assert_not_authorized(refused, principal="subscriber1", operation="publish", topic=SECURED)
    assert wrong.status == 500, wrong.body  # the token's fault, not Basic's 401
    assert ws_security_code(wrong, "1.1") == "FailedAuthentication", wrong.body
    assert resp.status_code == 202
    # Delivery is in order: had a refused message been stored, it would arrive first.
    assert consumer.wait_for(1)
    assert consumer.payload_texts() == ["basic alone"]


@pytest.mark.parametrize("version", ["1.1", "1.2"])
@pytest.mark.parametrize("user", ["publisher1", "nobody-such"])
def test_a_wrong_password_in_a_token_is_a_failed_authentication_fault(
    platform, topics, version, user
):
    token = UsernameToken(user, "wrong-password")

    _, res, _ = post(platform, notify_xml((OPEN, event("x"))), token=token, version=version)

    assert res.status == (500 if version == "1.1" else 400), res.body
    assert ws_security_code(res, version) == "FailedAuthentication", res.body


def test_a_wrong_basic_password_is_answered_401_with_a_basic_challenge(platform, topics):
    resp, res, _ = post(platform, notify_xml((OPEN, event("x"))), basic=("publisher1", "wrong"))

    assert resp.status_code == 401
    assert resp.headers["WWW-Authenticate"].startswith("Basic realm=")
    assert ws_security_code(res, "1.1") == "FailedAuthentication"


def test_credentials_that_fail_once_are_accepted_once_corrected(platform, topics, password):
    wrong = post(platform, notify_xml((OPEN, event("x"))), basic=("publisher1", "typo"))[0]
    right = post(
        platform, notify_xml((OPEN, event("x"))), basic=("publisher1", password("publisher1"))
    )[0]

    assert (wrong.status_code, right.status_code) == (401, 202)


# ----------------------------------------------------------------------------- groups


def test_someone_outside_the_publish_group_may_not_publish(platform, topics, password):
    token = UsernameToken("subscriber1", password("subscriber1"))

    _, res, _ = post(platform, notify_xml((LEAF, event("x"))), token=token)

    assert_not_authorized(res, principal="subscriber1", operation="publish", topic=LEAF)


def test_a_member_of_the_subscribe_group_subscribes_and_receives(
    platform, topics, consumer_factory, password
):
    consumer = consumer_factory()

    res = subscribe(
        platform,
        consumer.url,
        SECURED,
        token=UsernameToken("subscriber1", password("subscriber1"), use_digest=True),
    )
    post(
        platform,
        notify_xml((LEAF, event("to subscriber"))),
        basic=("publisher1", password("publisher1")),
    )

    assert res.status == 200, res.body
    assert consumer.wait_for(1)
    assert consumer.payload_texts() == ["to subscriber"]


@pytest.mark.parametrize("topic", [SECURED, LEAF])
def test_someone_outside_the_subscribe_group_may_not_subscribe(
    platform, topics, consumer_factory, password, topic
):
    consumer = consumer_factory()

    res = subscribe(platform, consumer.url, topic, basic=("publisher1", password("publisher1")))

    assert_not_authorized(res, principal="publisher1", operation="subscribe", topic=topic)


def test_a_wildcard_subscription_covering_a_secured_topic_is_refused(
    platform, topics, consumer_factory
):
    consumer = consumer_factory()
    body = subscribe_xml(consumer.url, f"{SECURED}//*", dialect=ns.DIALECT_FULL)

    res = post(platform, body)[1]

    assert_not_authorized(res, principal=None, operation="subscribe", topic=SECURED)


def test_get_current_message_needs_the_right_to_subscribe(platform, topics, password):
    token = UsernameToken("publisher1", password("publisher1"))
    assert post(platform, notify_xml((SECURED, event("last"))), token=token)[0].status_code == 202
    body = (
        f'<wsnt:GetCurrentMessage><wsnt:Topic Dialect="{ns.DIALECT_SIMPLE}">{SECURED}'
        "</wsnt:Topic></wsnt:GetCurrentMessage>"
    )

    refused = post(platform, body)[1]
    allowed = post(platform, body, token=UsernameToken("subscriber1", password("subscriber1")))[1]

    assert_not_authorized(refused, principal=None, operation="subscribe", topic=SECURED)
    assert allowed.status == 200, allowed.body
    assert b"last" in allowed.body


# ----------------------------------------------------------------------------- admins


def test_an_admin_may_publish_and_subscribe_where_nobody_else_may(
    platform, topics, consumer_factory, password
):
    consumer = consumer_factory()
    admin = ("admin1", password("admin1"))

    sub = subscribe(platform, consumer.url, CLOSED, basic=admin)
    published = post(platform, notify_xml((CLOSED, event("admin"))), basic=admin)[0]
    anonymous = post(platform, notify_xml((CLOSED, event("x"))))[1]
    analyst = post(
        platform, notify_xml((CLOSED, event("x"))), basic=("analyst1", password("analyst1"))
    )[1]

    assert sub.status == 200, sub.body
    assert published.status_code == 202
    assert consumer.wait_for(1)
    assert consumer.payload_texts() == ["admin"]
    assert_not_authorized(anonymous, principal=None, operation="publish", topic=CLOSED)
    assert_not_authorized(analyst, principal="analyst1", operation="publish", topic=CLOSED)


# ----------------------------------------------------------------------------- the cache


def authenticate_basic(user: str, password: str):  # type: ignore[no-untyped-def]
    from hpwsn_site.auth import authenticate

    header = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    return asyncio.run(authenticate(security=None, authorization=header, client="127.0.0.1"))


@pytest.fixture
def fresh_cache(ldap_directory):  # type: ignore[no-untyped-def]
    from hpwsn_site.auth import cache_clear

    cache_clear()
    yield
    cache_clear()


def unreachable_directory(settings) -> None:  # type: ignore[no-untyped-def]
    from tests.support import free_port

    settings.HPWSN_LDAP_URL = f"ldap://127.0.0.1:{free_port()}/"  # nothing listens there


def test_a_verified_caller_is_served_from_the_cache_without_the_directory(
    fresh_cache, password, settings
):
    first = authenticate_basic("publisher1", password("publisher1"))
    unreachable_directory(settings)

    again = authenticate_basic("publisher1", password("publisher1"))

    assert first.name == again.name == "publisher1"
    assert "alarm-publishers" in again.groups


def test_when_the_directory_is_down_recently_verified_callers_are_still_accepted(
    fresh_cache, password, settings
):
    from hpwsn.soap import SoapFault

    authenticate_basic("subscriber1", password("subscriber1"))
    settings.HPWSN_AUTH_CACHE_S = 0  # every call asks the directory
    unreachable_directory(settings)

    known = authenticate_basic("subscriber1", password("subscriber1"))
    with pytest.raises(SoapFault) as unknown:
        authenticate_basic("publisher1", password("publisher1"))

    assert known.name == "subscriber1"
    assert unknown.value.code == "Receiver"
    assert unknown.value.http_status == 503


def test_a_directory_that_did_not_answer_is_not_asked_again_by_every_request(
    fresh_cache, password, settings, monkeypatch
):
    from hpwsn.soap import SoapFault
    from hpwsn_site import auth

    authenticate_basic("subscriber1", password("subscriber1"))
    settings.HPWSN_AUTH_CACHE_S = 0  # every call would ask the directory
    unreachable_directory(settings)
    with pytest.raises(SoapFault):
        authenticate_basic("publisher1", password("publisher1"))
    asked = []
    verify = auth.directory_verify
    monkeypatch.setattr(auth, "directory_verify", lambda c: asked.append(c) or verify(c))

    with pytest.raises(SoapFault) as unknown:
        authenticate_basic("publisher1", password("publisher1"))
    known = authenticate_basic("subscriber1", password("subscriber1"))

    assert asked == []
    assert unknown.value.http_status == 503
    assert known.name == "subscriber1"


def test_without_a_directory_credentials_are_refused_and_anonymous_callers_served(
    fresh_cache, settings
):
    from hpwsn.soap import SoapFault
    from hpwsn_site.auth import authenticate

    settings.HPWSN_LDAP_URL = ""

    with pytest.raises(SoapFault) as refused:
        authenticate_basic("publisher1", "anything")
    anonymous = asyncio.run(authenticate(security=None, authorization=None, client="127.0.0.1"))

    assert refused.value.qname == (ns.WSSE, "FailedAuthentication")
    assert refused.value.http_status == 401
    assert anonymous.anonymous
