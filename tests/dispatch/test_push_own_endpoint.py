"""A subscription stored before Subscribe refused the broker's own address never loops."""

from __future__ import annotations

import pytest

from dispatch import push
from tests.support import RecordingConsumer


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    consumer = RecordingConsumer().start()
    yield consumer
    consumer.stop()


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(push, "_own", None, raising=False)
    monkeypatch.setattr(push, "_resolved", {})


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
