"""A subscription stored before Subscribe refused the broker's own address never loops."""

from __future__ import annotations

import socket

import psutil
import pytest

from dispatch import push
from hpwsn import errors
from hpwsn.wsn import TopicRef
from subscriptions import services as subs
from tests.support import RecordingConsumer
from topics import services as topics
from topics.acl import Principal


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    consumer = RecordingConsumer().start()
    yield consumer
    consumer.stop()


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(push, "_own", None, raising=False)
    monkeypatch.setattr(push, "_resolved", {})
    monkeypatch.setattr(push, "_interfaces", (0.0, []), raising=False)
    monkeypatch.setattr(push, "_policy", None)


def test_a_push_to_the_brokers_own_listening_address_fails_for_good(server, settings):
    settings.HPWSN_HTTP_HOST = "0.0.0.0"  # bound everywhere: any loopback spelling reaches it
    settings.HPWSN_HTTP_PORT = server.port

    for url in (server.url, f"http://localhost:{server.port}/wsn/pullpoints/x"):
        outcome = push.post(url, b"<x/>", soap_version="1.1")

        assert not outcome.ok
        assert outcome.permanent
        assert "own endpoint" in outcome.detail
    assert server.posts == []


def test_a_push_to_another_port_of_the_same_host_is_sent(server, settings):
    settings.HPWSN_HTTP_HOST = "127.0.0.1"
    settings.HPWSN_HTTP_PORT = server.port + 1 if server.port < 65535 else server.port - 1

    assert push.post(server.url, b"<x/>", soap_version="1.1").ok
    assert len(server.posts) == 1


def _network_address() -> str:
    """An IPv4 address of this host's interfaces other than the loopback."""
    for nic in psutil.net_if_addrs().values():
        for a in nic:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return str(a.address)
    pytest.skip("this host has no network address besides the loopback")


@pytest.fixture
def bound_everywhere(settings):  # type: ignore[no-untyped-def]
    """The web server on 0.0.0.0, pushes allowed anywhere (as a federation's sites widen
    HPWSN_PUSH_ALLOW, docs/deployment.md): the broker is reached at its network address too."""
    settings.HPWSN_HTTP_HOST = "0.0.0.0"
    settings.HPWSN_HTTP_PORT = 8000
    settings.HPWSN_PUSH_ALLOW = ["*"]
    return f"http://{_network_address()}:8000/wsn/"


def test_a_push_to_this_hosts_network_address_fails_for_good_when_bound_everywhere(
    bound_everywhere,
):  # type: ignore[no-untyped-def]
    # Before, only the loopback spellings were the broker's own: a push to its network address
    # was a valid Notify, published again and pushed again, for ever.
    outcome = push.post(bound_everywhere, b"<x/>", soap_version="1.1")

    assert not outcome.ok
    assert outcome.permanent
    assert "own endpoint" in outcome.detail


@pytest.mark.django_db(transaction=True)
def test_subscribe_refuses_this_hosts_network_address_when_bound_everywhere(bound_everywhere):  # type: ignore[no-untyped-def]
    topics.topic_create(path="Plant:Loop")
    with pytest.raises(errors.SubscribeCreationFailed, match="this broker's own endpoint"):
        subs.subscription_create(
            consumer_address=bound_everywhere,
            topic=TopicRef(text="Plant:Loop", dialect=None, nsmap={}),
            content=None,
            initial_termination_time=None,
            soap_version="1.1",
            use_raw=False,
            base_url="http://testserver",
            principal=Principal(name="admin1", groups=frozenset({"hpwsn-admins"})),
        )
