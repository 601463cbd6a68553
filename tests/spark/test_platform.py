"""The event log records what a real run through the platform did: web, worker and beat write it."""

from __future__ import annotations

import gzip
import json
import time
import uuid
from pathlib import Path
from typing import Any

from hpwsn import ns
from tests.support import (
    ANONYMOUS_ALLOWED,
    notify_xml,
    soap_call,
    subscribe_xml,
    topic_with_policy,
    wait_or_fail,
)

TOPIC = "Analytics:Events"


def read_log(root: Path) -> list[dict[str, Any]]:
    """Every event under the log's root, from open hour files and compressed ones alike."""
    out: list[dict[str, Any]] = []
    for path in sorted(root.glob("date=*/hour=*/*.jsonl*")):
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
            out.extend(json.loads(line) for line in f if line.strip())
    return out


def test_the_event_log_records_publish_delivery_failure_and_dead_letters(
    platform, consumer_factory, committed
):  # type: ignore[no-untyped-def]
    committed(topic_with_policy, TOPIC, root=ANONYMOUS_ALLOWED)
    good = consumer_factory()
    bad = consumer_factory(fail_first=10_000, fail_status=500)
    for c in (good, bad):
        res = soap_call(platform.endpoint, subscribe_xml(c.url, TOPIC))
        assert res.status == 200, res.body
    sent = 5
    body = notify_xml(*[(TOPIC, f"<e:m xmlns:e='urn:t'>{i}</e:m>") for i in range(sent)])
    assert soap_call(platform.endpoint, body).status == 202
    assert good.wait_for(sent), platform.logs()
    root = Path(platform.env["HPWSN_DATA_DIR"]) / "events"
    good_label, bad_label = f"127.0.0.1:{good.port}", f"127.0.0.1:{bad.port}"

    def of(kind: str, **match: Any) -> list[dict[str, Any]]:
        return [
            e
            for e in read_log(root)
            if e["type"] == kind and all(e.get(k) == v for k, v in match.items())
        ]

    # The retry schedule of the tests is 0.5, 1, 2 s: the bad consumer's batch is dead-lettered
    # after four attempts; each process writes its buffer within a second.
    wait_or_fail(lambda: len(of("dead_lettered", consumer=bad_label)) == sent, 30, "dead letters")
    wait_or_fail(lambda: len(of("delivered", consumer=good_label)) == sent, 10, "deliveries")

    accepted = of("accepted", topic=TOPIC)
    assert len(accepted) == sent
    assert {e["policy"] for e in accepted} == {"reliable"}  # the default policy
    assert all(e["v"] == 1 and e["bytes"] > 0 for e in accepted)
    nids = {e["nid"] for e in accepted}
    delivered = of("delivered", consumer=good_label)
    assert {e["nid"] for e in delivered} == nids
    assert all(e["latency_ms"] >= 0 for e in delivered)
    assert {e["nid"] for e in of("dead_lettered", consumer=bad_label)} == nids
    failed = of("attempt", consumer=bad_label)
    assert len(failed) >= 4
    assert {(e["status"], e["error"]) for e in failed} == {(500, "http_5xx")}
    ok = of("attempt", consumer=good_label)
    assert sum(e["messages"] for e in ok) == sent
    assert {e["error"] for e in ok} == {"ok"}
    created = of("subscription", action="created", topic=TOPIC)
    assert {e["consumer"] for e in created} >= {good_label, bad_label}
    # Web and worker processes each wrote their own files.
    writers = {e["node"] for e in accepted} | {e["node"] for e in delivered}
    assert len(writers) >= 2


def test_a_refused_publish_is_logged_with_its_fault(platform):  # type: ignore[no-untyped-def]
    started = time.time()
    body = notify_xml((f"NoSuchRoot{uuid.uuid4().hex[:8]}:Deeper", "<e:m xmlns:e='urn:t'>x</e:m>"))
    res = soap_call(platform.endpoint, body)
    assert res.status >= 400
    assert b"TopicNotSupportedFault" in res.body
    root = Path(platform.env["HPWSN_DATA_DIR"]) / "events"

    def refused() -> list[dict[str, Any]]:
        # Other tests' events share the log (the browser test adds a generated one): this one's
        # refusal is the only one written since it started.
        return [
            e
            for e in read_log(root)
            if e["type"] == "refused" and e["action"] == "Notify" and e["ts"] >= started
        ]

    wait_or_fail(lambda: len(refused()) >= 1, 10, "the refusal in the log")
    assert [(e["reason"], e["publisher"]) for e in refused()] == [("TopicNotSupportedFault", "")]


def _since(root: Path, started: float, kind: str, **match: Any) -> list[dict[str, Any]]:
    """Events of `kind` written since `started` whose fields equal `match`."""
    return [
        e
        for e in read_log(root)
        if e["type"] == kind and e["ts"] >= started and all(e.get(k) == v for k, v in match.items())
    ]


def _subscribe(platform, consumer: str, topic: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """Subscribe `consumer` to `topic`: (subscription address, subscription id)."""
    res = soap_call(platform.endpoint, subscribe_xml(consumer, topic))
    assert res.status == 200, res.body
    address = res.findtext(".//wsnt:SubscriptionReference/wsa:Address")
    assert address
    return address, address.rstrip("/").rsplit("/", 1)[-1]


def test_pause_and_resume_are_logged_as_subscription_events(platform, consumer_factory, committed):  # type: ignore[no-untyped-def]
    committed(topic_with_policy, TOPIC, root=ANONYMOUS_ALLOWED)
    started = time.time()
    root = Path(platform.env["HPWSN_DATA_DIR"]) / "events"
    consumer = consumer_factory()
    address, sub = _subscribe(platform, consumer.url, TOPIC)
    for op in ("PauseSubscription", "ResumeSubscription"):
        res = soap_call(address, f"<wsnt:{op}/>", to=address)
        assert res.status == 200, res.body

    def actions() -> list[str]:
        return [
            e["action"]
            for e in sorted(_since(root, started, "subscription", sub=sub), key=lambda e: e["ts"])
        ]

    wait_or_fail(lambda: len(actions()) >= 3, 10, "the lifecycle in the log")
    assert actions() == ["created", "paused", "resumed"]


def test_get_messages_is_logged_with_the_number_of_messages_pulled(
    platform, consumer_factory, committed
):  # type: ignore[no-untyped-def]
    committed(topic_with_policy, TOPIC, root=ANONYMOUS_ALLOWED)
    started = time.time()
    root = Path(platform.env["HPWSN_DATA_DIR"]) / "events"
    res = soap_call(platform.endpoint, "<wsnt:CreatePullPoint/>")
    assert res.status == 200, res.body
    pull_point = res.findtext(".//wsnt:PullPoint/wsa:Address")
    assert pull_point
    _subscribe(platform, pull_point, TOPIC)
    witness = consumer_factory()  # tells when the fan-out has filled the pull point
    _subscribe(platform, witness.url, TOPIC)
    body = notify_xml(*[(TOPIC, f"<e:m xmlns:e='urn:t'>pull {i}</e:m>") for i in range(3)])
    assert soap_call(platform.endpoint, body).status == 202
    assert witness.wait_for(3), platform.logs()
    get = "<wsnt:GetMessages><wsnt:MaximumNumber>2</wsnt:MaximumNumber></wsnt:GetMessages>"
    for _ in range(3):  # 2, then 1, then none
        assert soap_call(pull_point, get, to=pull_point).status == 200

    pp = pull_point.rstrip("/").rsplit("/", 1)[-1]
    wait_or_fail(lambda: len(_since(root, started, "pull", pullpoint=pp)) >= 2, 10, "the pulls")
    pulls = sorted(_since(root, started, "pull", pullpoint=pp), key=lambda e: e["ts"])
    assert [e["messages"] for e in pulls] == [2, 1]  # an empty answer pulled nothing


def test_incoming_fragments_are_logged_with_their_package_fields(platform, committed):  # type: ignore[no-untyped-def]
    from hpwsn import fragment

    committed(topic_with_policy, TOPIC, root=ANONYMOUS_ALLOWED)
    started = time.time()
    root = Path(platform.env["HPWSN_DATA_DIR"]) / "events"
    ident = f"frag-{uuid.uuid4().hex}"
    payload = b"<e:doc xmlns:e='urn:t'>" + b"x" * 1500 + b"</e:doc>"
    parts = fragment.split(payload, fragment_size=512, identification=ident, partial_allowed=False)
    assert len(parts) >= 3
    body = "".join(
        f"<wsnt:NotificationMessage>"
        f'<wsnt:Topic Dialect="{ns.DIALECT_SIMPLE}">{TOPIC}</wsnt:Topic>'
        f"{f.package_xml()}{f.message_xml()}</wsnt:NotificationMessage>"
        for f in parts
    )
    res = soap_call(platform.endpoint, f"<wsnt:Notify>{body}</wsnt:Notify>")
    assert res.status == 202, res.body

    def logged() -> list[dict[str, Any]]:
        return _since(root, started, "fragment", ident=ident)

    wait_or_fail(lambda: len(logged()) == len(parts), 10, "the fragments in the log")
    got = sorted(logged(), key=lambda e: e["offset"])
    assert [e["offset"] for e in got] == list(range(len(parts)))
    assert [e["more"] for e in got] == [True] * (len(parts) - 1) + [False]
    assert {e["topic"] for e in got} == {TOPIC}
    assert all(e["bytes"] > 0 for e in got)
    # Reassembled, the message is accepted once, on the same topic.
    wait_or_fail(
        lambda: len(_since(root, started, "accepted", topic=TOPIC)) >= 1, 10, "the whole message"
    )


def test_messages_dropped_at_a_pull_points_depth_are_logged(settings, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    import redis

    from dispatch.fanout import pulls_bound
    from hpwsn_site import state
    from monitoring import events
    from spark.eventlog import EventLog

    monkeypatch.setattr(events, "_log", EventLog(tmp_path, flush_s=3600))
    monkeypatch.setattr(events, "_enabled", True)
    r = redis.Redis.from_url(settings.REDIS_URL)
    settings.HPWSN_PULLPOINT_MAX_DEPTH = 2
    for policy in ("drop_oldest", "refuse"):
        settings.HPWSN_PULLPOINT_OVERFLOW = policy
        key = state.pullpoint_key(f"events-{policy}")
        r.delete(key)
        r.rpush(key, b"1", b"2", b"3", b"4", b"5")
        pulls_bound(r, {f"events-{policy}": 5})
        assert r.llen(key) == 2
        r.delete(key)
    events.flush()

    dropped = [e for e in read_log(tmp_path) if e["type"] == "dropped"]
    assert [(e["pullpoint"], e["messages"], e["reason"]) for e in dropped] == [
        ("events-drop_oldest", 3, "oldest"),
        ("events-refuse", 3, "refused"),
    ]
