"""A Celery worker keeps consuming after an acknowledgement failed because Redis was away
(hpwsn_site/brokerqos.py): the broker's QoS forgets the delivery whatever Redis said."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue

from tests.support import free_port, wait_until


@pytest.fixture
def redis_server(tmp_path) -> Iterator[subprocess.Popen[bytes]]:  # type: ignore[no-untyped-def]
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--appendonly", "no", "--dir", str(tmp_path)]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server.port = port  # type: ignore[attr-defined]
    client = redis.Redis(port=port)
    assert wait_until(lambda: _pings(client), timeout=10)
    yield server
    server.kill()
    server.wait()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


@pytest.mark.parametrize(
    "settle",
    [
        pytest.param(lambda message: message.ack(), id="acknowledgement"),
        # A task put back after its worker process was lost (reject, requeue).
        pytest.param(lambda message: message.reject(requeue=True), id="rejection"),
    ],
)
def test_a_failed_settlement_does_not_stop_the_consumer(redis_server, settle):  # type: ignore[no-untyped-def]
    import hpwsn_site.celery  # noqa: F401  (installs the QoS, as every HPwsn process does)

    queue = Queue("brokerqos", Exchange("brokerqos"), "brokerqos")
    with Connection(f"redis://127.0.0.1:{redis_server.port}/0") as conn:
        channel = conn.channel()
        Producer(channel).publish({"n": 1}, exchange=queue.exchange, routing_key="brokerqos",
                                  declare=[queue])  # fmt: skip
        received = []
        consumer = Consumer(channel, [queue], callbacks=[lambda _b, m: received.append(m)])
        consumer.qos(prefetch_count=1)  # as a worker process with a prefetch multiplier of 1
        consumer.consume()
        conn.drain_events(timeout=5)
        assert len(received) == 1
        assert not channel.qos.can_consume(), "one delivery in flight fills a prefetch of one"

        redis_server.kill()  # the master dies before the task is settled
        redis_server.wait()
        with pytest.raises(redis.ConnectionError):
            settle(received[0])

        # The delivery no longer counts as in flight: the worker asks for the next task (before,
        # it waited for ever), and the unacked entry left in Redis brings this one back later.
        assert channel.qos.can_consume()
