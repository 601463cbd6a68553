"""Two nodes on one site: one killed with SIGKILL mid-stream, the other delivers everything.

Node A is the test's own process set (hpwsn_site/processes.py); node B is `make run` itself
(scripts/run.sh) with the role switch, its own node name and port, and no Redis or slapd of its
own: both share one PostgreSQL database and one Redis. A publisher spreads a reliable ordered
stream over both web processes; halfway, every process of node B (run.sh and all it started) is
killed with SIGKILL. Every notification must reach every consumer, in order, and the node
registry must show node B dead and node A alive.

HPWSN_TEST_NODES_TOTAL sets the number of notifications (default 2,000; the issue's figure is
10,000: `HPWSN_TEST_NODES_TOTAL=10000 make test ARGS=tests/integration/test_nodes.py`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import redis

from monitoring.selectors import nodes_from_records
from monitoring.stats import ALIVE, DEAD, LATE
from tests.integration.test_kill import PER_NOTIFY, TOPIC, _notify, _numbers, private_platform
from tests.integration.test_run_stop import _alive, _descendants
from tests.support import free_port, soap_call, subscribe_xml, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOTAL = int(os.environ.get("HPWSN_TEST_NODES_TOTAL", "2000"))
NODE_REGISTRY = "hpwsn:mon:nodes"  # monitoring/keys.py


def _healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _nodes(redis_port: int) -> list[dict]:  # type: ignore[type-arg]
    raw = redis.Redis(port=redis_port).hgetall(NODE_REGISTRY)
    return nodes_from_records(raw, now=time.time())


def test_a_site_loses_a_node_mid_stream_and_delivers_everything_in_order(
    tmp_path, consumer_factory
):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    settings = {"HPWSN_NODE_DEAD_AFTER_S": "3"}
    with private_platform(tmp_path / "a", node_name="node-a", **settings) as a:
        b_port = free_port()
        b_env = {
            **a.env,
            "HPWSN_NODE_NAME": "node-b",
            "HPWSN_ROLES": "web,worker,beat",
            "HPWSN_LOCAL_SERVICES": "none",
            "HPWSN_MIGRATE": "0",
            "HPWSN_HTTP_PORT": str(b_port),
            "HPWSN_DATA_DIR": str(tmp_path / "b"),
        }
        log = open(tmp_path / "b" / "run.log", "wb")  # noqa: SIM115 - closed below
        run = subprocess.Popen(
            ["bash", "scripts/run.sh"], cwd=ROOT, env=b_env, stdout=log, stderr=subprocess.STDOUT
        )
        b_base = f"http://127.0.0.1:{b_port}"
        try:
            up = wait_until(lambda: run.poll() is None and _healthy(b_base), 180, 0.5)
            assert up, (tmp_path / "b" / "run.log").read_text(errors="replace")[-4000:]
            _run_stream(a, run, endpoints=[a.endpoint, b_base + "/wsn/"], consumers=[
                consumer_factory(), consumer_factory()
            ])  # fmt: skip
        finally:
            for pid in [run.pid, *_descendants(run.pid)]:
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
            run.wait(10)
            log.close()


def _run_stream(a, run: subprocess.Popen[bytes], *, endpoints: list[str], consumers) -> None:  # type: ignore[no-untyped-def]
    for c in consumers:
        res = soap_call(a.endpoint, subscribe_xml(c.url, TOPIC))
        assert res.status == 200, res.body

    published = 0
    accepted_by = [0, 0]
    done = threading.Event()

    def publish() -> None:
        # Each Notify goes to the next node in turn; one that does not answer 202 is sent again,
        # with the same wsa:MessageID, to the other node (a load balancer's failover).
        nonlocal published
        turn = 0
        for start in range(0, TOTAL, PER_NOTIFY):
            message_id = f"urn:uuid:{uuid.uuid4()}"
            while True:
                turn = (turn + 1) % len(endpoints)
                try:
                    res = soap_call(endpoints[turn], _notify(start), message_id=message_id)
                    if res.status == 202:
                        accepted_by[turn] += 1
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
            published = start + PER_NOTIFY
        done.set()

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    assert wait_until(lambda: published >= TOTAL // 2 or done.is_set(), timeout=600)
    # SIGKILL every process of node B at once: run.sh, its web, worker (and pool), beat.
    # Freeze them all first: run.sh's children get SIGTERM when it dies (setpriv --pdeathsig), and
    # one of them could shut down cleanly before its own SIGKILL arrived (a lost machine does not).
    victims = [run.pid, *_descendants(run.pid)]
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in victims:
            os.kill(pid, sig)
    killed_at = published
    assert wait_until(lambda: not any(_alive(p) for p in victims), timeout=10)
    publisher.join(timeout=900)
    assert done.is_set(), "the publisher did not finish:\n" + a.logs()
    assert killed_at < TOTAL, "node B was killed after the stream had ended"
    assert accepted_by[1] > 0, "node B accepted nothing before it was killed"

    complete = wait_until(
        lambda: all(len(set(_numbers(c))) >= TOTAL for c in consumers), timeout=600, interval=0.5
    )
    assert complete, [len(set(_numbers(c))) for c in consumers]
    for c in consumers:
        # Every notification, in publication order once redeliveries are set aside.
        assert list(dict.fromkeys(_numbers(c))) == list(range(TOTAL))

    # The node registry (what /metrics and the dashboard show): node B's processes are dead,
    # node A's alive.
    def registry_settled() -> bool:
        nodes = _nodes(a.redis_port)
        b = [n for n in nodes if n.get("node") == "node-b"]
        # Alive or late (a heartbeat of a busy process on a loaded machine may come late).
        a_alive = {
            n["role"] for n in nodes if n.get("node") == "node-a" and n["state"] in (ALIVE, LATE)
        }
        return (
            {n["role"] for n in b} == {"web", "worker", "beat"}
            and all(n["state"] == DEAD for n in b)
            and a_alive == {"web", "worker", "beat"}
        )

    assert wait_until(registry_settled, timeout=30, interval=0.5), [
        (n.get("node"), n["role"], n["pid"], n["state"]) for n in _nodes(a.redis_port)
    ]
