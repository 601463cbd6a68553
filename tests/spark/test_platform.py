"""The event log records what a real run through the platform did: web, worker and beat write it."""

from __future__ import annotations

import gzip
import json
import time
import uuid
from pathlib import Path
from typing import Any

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
