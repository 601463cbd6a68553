"""Live monitoring against the real platform: the WebSocket stream, /metrics, /healthz, nodes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import httpx
import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from prometheus_client.parser import text_string_to_metric_families

from monitoring.selectors import nodes_list
from tests.conftest import ROOT, VENV_BIN
from tests.support import in_own_thread, notify_xml, soap_call, subscribe_xml, wait_until

pytestmark = pytest.mark.integration


def _subscribe(platform, consumer_url: str, topic: str) -> None:  # type: ignore[no-untyped-def]
    res = soap_call(platform.endpoint, subscribe_xml(consumer_url, topic))
    assert res.status == 200, res.body


def _publish(platform, topic: str, count: int) -> None:  # type: ignore[no-untyped-def]
    for i in range(count):
        res = soap_call(platform.endpoint, notify_xml((topic, f"<e:m xmlns:e='urn:t'>{i}</e:m>")))
        assert res.status == 202, res.body


# ----------------------------------------------------------------------------- WebSocket


def _session_cookie(username: str, *, staff: bool = True) -> bytes:
    """Log `username` in (committed, in the calling thread's connection); its session cookie."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(username=username)
    if user.is_staff != staff:
        user.is_staff = staff
        user.save(update_fields=["is_staff"])
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def _communicator(cookie: bytes | None) -> WebsocketCommunicator:
    from hpwsn_site.asgi import application

    headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, "/ws/monitoring/", headers=headers)


def _topic_row(stats: dict, topic: str) -> dict:  # type: ignore[type-arg]
    return next((row for row in stats["topics"] if row["topic"] == topic), {})


def _consumer_row(stats: dict, label: str) -> dict:  # type: ignore[type-arg]
    return next((row for row in stats["consumers"] if row["consumer"] == label), {})


def test_the_socket_streams_stats_whose_counts_match_the_traffic(platform, consumer_factory, staff):
    topic, sent = "Monitoring:WS", 12
    consumer = consumer_factory()
    _subscribe(platform, consumer.url, topic)
    label = f"127.0.0.1:{consumer.port}"

    async def scenario(cookie: bytes) -> tuple[dict, dict, int]:  # type: ignore[type-arg]
        comm = _communicator(cookie)
        connected, _ = await comm.connect(timeout=10)
        assert connected
        try:
            first = await comm.receive_json_from(timeout=10)
            assert first["type"] == "history"
            assert isinstance(first["points"], list)
            frame = await comm.receive_json_from(timeout=10)
            assert frame["type"] == "stats"
            base = frame["stats"]
            await asyncio.to_thread(_publish, platform, topic, sent)
            assert await asyncio.to_thread(consumer.wait_for, sent), platform.logs()
            frames = 0
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                frame = await comm.receive_json_from(timeout=10)
                frames += 1
                stats = frame["stats"]
                if (
                    stats["totals"]["delivered"] - base["totals"]["delivered"] >= sent
                    and _topic_row(stats, topic).get("per_minute", 0) >= sent
                ):
                    return base, stats, frames
            raise AssertionError(f"no frame counted the traffic; last: {frame}")
        finally:
            await comm.disconnect()

    base, stats, frames = in_own_thread(
        lambda: async_to_sync(scenario)(_session_cookie(staff.username))
    )
    assert frames >= 1
    assert stats["t"] > base["t"]
    assert stats["totals"]["accepted"] - base["totals"]["accepted"] == sent
    assert _topic_row(stats, topic)["total"] - _topic_row(base, topic).get("total", 0) == sent
    assert _topic_row(stats, topic)["per_minute"] == sent
    # Other tests' consumers may still be retried meanwhile: at least ours were delivered. The
    # consumers table ranks by failures, so a healthy consumer is there only while few fail.
    assert stats["totals"]["delivered"] - base["totals"]["delivered"] >= sent
    row = _consumer_row(stats, label)
    assert row.get("delivered", sent) == sent
    assert row.get("failed", 0) == 0
    assert stats["latency_ms"]["p50"] is not None
    roles = {n["role"] for n in stats["nodes"] if n["state"] == "alive"}
    assert {"web", "worker", "beat"} <= roles


def test_the_socket_refuses_anonymous_and_non_staff_users(django_db_setup, django_db_blocker):
    async def refused(cookie: bytes | None) -> tuple[bool, object]:
        comm = _communicator(cookie)
        result = await comm.connect(timeout=10)
        await comm.wait()
        return result

    with django_db_blocker.unblock():
        assert in_own_thread(lambda: async_to_sync(refused)(None)) == (False, 4401)
        cookie = in_own_thread(lambda: _session_cookie("plain-user", staff=False))
        assert in_own_thread(lambda: async_to_sync(refused)(cookie)) == (False, 4403)


def test_the_dashboard_page_wants_a_staff_login(platform):
    resp = httpx.get(platform.base_url + "/monitoring/", timeout=10)
    assert resp.status_code == 302
    assert resp.headers["location"].startswith("/admin/login/?next=/monitoring/")


# ----------------------------------------------------------------------------- /metrics


def _scrape(platform) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:  # type: ignore[no-untyped-def]
    resp = httpx.get(platform.base_url + "/metrics", timeout=10)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_metrics_counters_rise_by_exactly_the_traffic_sent(platform, consumer_factory, staff):
    topic, sent = "Monitoring:Metrics", 15
    consumer = consumer_factory()
    _subscribe(platform, consumer.url, topic)
    label = f"127.0.0.1:{consumer.port}"
    before = _scrape(platform)

    _publish(platform, topic, sent)
    assert consumer.wait_for(sent), platform.logs()

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    after = _scrape(platform)
    deadline = time.monotonic() + 5
    while delta("hpwsn_consumer_deliveries_total", consumer=label) < sent:
        assert time.monotonic() < deadline, "the deliveries were never counted"
        time.sleep(0.2)
        after = _scrape(platform)
    time.sleep(0.5)  # anything counted twice would show by now
    after = _scrape(platform)
    assert delta("hpwsn_notifications_accepted_total") == sent
    assert delta("hpwsn_topic_notifications_accepted_total", topic=topic) == sent
    assert delta("hpwsn_deliveries_total") == sent
    assert delta("hpwsn_consumer_deliveries_total", consumer=label) == sent
    assert delta("hpwsn_delivery_latency_seconds_count") == sent
    assert 0 < delta("hpwsn_delivery_latency_seconds_sum") < sent * 30
    assert after[("hpwsn_delivery_latency_quantile_seconds", (("quantile", "0.99"),))] > 0
    assert after[("hpwsn_nodes", (("role", "worker"), ("state", "alive")))] >= 1
    assert ("hpwsn_queue_length", (("queue", "celery"),)) in after
    # No unbounded label: nothing that looks like a message id.
    assert not [k for k in after if any(len(v) == 32 and v.isalnum() for _n, v in k[1])]


@pytest.mark.django_db
def test_metrics_with_a_token_set_are_refused_without_that_bearer_token(client, settings):
    settings.HPWSN_METRICS_TOKEN = "scrape-8c1f"
    refused = [
        client.get("/metrics"),
        client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong"),
        client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-8c1"),  # a prefix of it
        client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-8c1f0"),
        client.get("/metrics", HTTP_AUTHORIZATION="Basic c2NyYXBlLTtjMWY="),
    ]

    allowed = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-8c1f")

    assert [r.status_code for r in refused] == [401] * len(refused)
    assert all(b"hpwsn_" not in r.content for r in refused)
    assert allowed.status_code == 200
    names = {f.name for f in text_string_to_metric_families(allowed.content.decode())}
    assert "hpwsn_notifications_accepted" in names


# ----------------------------------------------------------------------------- /healthz


def test_healthz_checks_database_redis_workers_and_directory(platform):
    wait_until(lambda: httpx.get(platform.base_url + "/healthz").json()["status"] == "ok", 10)
    resp = httpx.get(platform.base_url + "/healthz", timeout=10)
    body = resp.json()
    assert resp.status_code == 200
    assert body["status"] == "ok"
    assert body["checks"]["database"]["status"] == "ok"
    assert body["checks"]["redis"]["status"] == "ok"
    assert body["checks"]["workers"]["status"] == "ok"
    assert body["checks"]["workers"]["alive"] >= 1
    assert body["checks"]["beat"]["status"] == "ok"
    assert body["checks"]["directory"]["status"] == "ok"  # the test slapd (ldap_directory)


def test_healthz_is_down_with_503_when_redis_is_unreachable(db, client, monkeypatch):
    import redis.asyncio as aioredis

    from hpwsn_site import state

    monkeypatch.setattr(
        state, "get_async_redis", lambda: aioredis.Redis.from_url("redis://127.0.0.1:1/0")
    )
    resp = client.get("/healthz")
    body = resp.json()
    assert resp.status_code == 503
    assert body["status"] == "down"
    assert body["checks"]["redis"]["status"] == "fail"
    assert "error" in body["checks"]["redis"]
    assert body["checks"]["database"]["status"] == "ok"
    assert body["checks"]["workers"]["status"] == "unknown"


def test_healthz_tells_a_caller_elsewhere_the_statuses_only(db, client, monkeypatch, settings):
    # The errors name the site's servers and accounts (a database refusing "user hpwsn", a
    # Redis at host:port), the directory's check its URL: for whoever may scrape /metrics.
    import redis.asyncio as aioredis

    from hpwsn_site import state

    monkeypatch.setattr(
        state, "get_async_redis", lambda: aioredis.Redis.from_url("redis://127.0.0.1:1/0")
    )
    settings.HPWSN_METRICS_TOKEN = "scrape-token"
    outside = {"REMOTE_ADDR": "198.51.100.7"}

    told = client.get("/healthz", **outside)
    trusted = client.get("/healthz", HTTP_AUTHORIZATION="Bearer scrape-token", **outside)

    assert told.status_code == trusted.status_code == 503
    assert told.json()["status"] == "down"
    assert told.json()["checks"]["redis"] == {"status": "fail"}
    assert "127.0.0.1:1" not in told.content.decode()
    assert "error" in trusted.json()["checks"]["redis"]


def test_healthz_is_degraded_but_200_without_a_live_worker(db, client, monkeypatch):
    from monitoring import keys

    monkeypatch.setattr(keys, "NODES", "hpwsn:mon:nodes:none-registered")
    resp = client.get("/healthz")
    assert resp.status_code == 200
    assert resp.json()["status"] == "degraded"
    assert resp.json()["checks"]["workers"] == {"status": "fail", "alive": 0}


# ----------------------------------------------------------------------------- node registry


def _start_worker(platform, name: str) -> subprocess.Popen[bytes]:  # type: ignore[no-untyped-def]
    log = open(platform.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
    # Its own queue: a task it held when killed would wait for the visibility timeout.
    cmd = [
        str(VENV_BIN / "celery"), "-A", "hpwsn_site", "worker", "-c", "1", "-Q", "hpwsn-test-idle",
        "--without-mingle", "--without-gossip", "-l", "INFO", "-n", f"{name}@%h",
    ]  # fmt: skip
    out = {"stdout": log, "stderr": subprocess.STDOUT}
    return subprocess.Popen(cmd, cwd=ROOT, env=platform.env, start_new_session=True, **out)


def _node(pid: int) -> dict | None:  # type: ignore[type-arg]
    return next((n for n in nodes_list(now=time.time()) if n["pid"] == pid), None)


def _state(pid: int) -> str | None:
    node = _node(pid)
    return None if node is None else node["state"]


def test_a_killed_worker_is_marked_dead_and_its_restart_is_a_new_live_node(platform):
    dead_after = float(platform.env["HPWSN_NODE_DEAD_AFTER_S"])
    first = _start_worker(platform, "hb1")
    second = None
    try:
        assert wait_until(lambda: _state(first.pid) == "alive", 40), platform.logs()
        node = _node(first.pid)
        assert node is not None
        assert node["role"] == "worker"
        assert node["pool"] == 1
        assert node["name"].startswith("hb1@")
        assert node["rss"] > 0
        assert node["threads"] >= 1
        assert node["fds"] > 0

        os.killpg(first.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        assert wait_until(lambda: _state(first.pid) == "dead", dead_after + 5, interval=0.1)
        assert time.monotonic() - killed_at <= dead_after + 1.0
        first.wait(10)

        second = _start_worker(platform, "hb2")
        assert wait_until(lambda: _state(second.pid) == "alive", 40), platform.logs()
        assert _state(first.pid) == "dead"  # shown, not hidden
        resp = httpx.get(platform.base_url + "/metrics", timeout=10).text
        up = 'hpwsn_node_up{{host="{}",pid="{}",role="worker"}} {}'
        assert up.format(node["host"], first.pid, "0.0") in resp
        assert up.format(node["host"], second.pid, "1.0") in resp
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
    assert wait_until(lambda: _state(second.pid) == "stopped", 5)


@pytest.mark.django_db
def test_metrics_without_a_token_are_for_a_scraper_on_this_machine_only(client, settings):
    """Topic names and consumer hosts are not shown to anyone who reaches a web server listening
    beyond loopback; a scraper elsewhere needs the token."""
    settings.HPWSN_METRICS_TOKEN = ""
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
    for elsewhere in ("10.0.0.7", "192.0.2.1", "2001:db8::1"):
        refused = client.get("/metrics", REMOTE_ADDR=elsewhere)
        assert refused.status_code == 403
        assert b"HPWSN_METRICS_TOKEN" in refused.content
        assert b"hpwsn_" not in refused.content
    settings.HPWSN_METRICS_TOKEN = "scrape-2b7"
    allowed = client.get("/metrics", REMOTE_ADDR="10.0.0.7", HTTP_AUTHORIZATION="Bearer scrape-2b7")
    assert allowed.status_code == 200
