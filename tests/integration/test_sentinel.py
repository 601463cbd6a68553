"""Redis Sentinel: the master is killed mid-stream, a replica takes over, nothing is lost.

A real primary and replica (redis-server) and three redis-sentinel processes on 127.0.0.1; a
platform of the test's own (web, worker, beat on a new PostgreSQL database) finds its Redis only
through the sentinels (REDIS_SENTINELS, REDIS_SENTINEL_MASTER). Halfway through a reliable
ordered stream the primary is SIGKILLed. The sentinels promote the replica; the platform keeps
accepting and every consumer gets every notification in order.

HPWSN_TEST_SENTINEL_TOTAL sets the number of notifications (default 2,000).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import redis

from hpwsn_site.redisconn import RedisTarget
from tests.integration.test_kill import PER_NOTIFY, TOPIC, _notify, _numbers, private_platform
from tests.support import free_port, soap_call, subscribe_xml, wait_until

pytestmark = pytest.mark.integration

TOTAL = int(os.environ.get("HPWSN_TEST_SENTINEL_TOTAL", "2000"))
MASTER = "mymaster"


class SentinelSet:
    """A primary, a replica and three sentinels, each its own process on a free port."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.primary_port = free_port()
        self.replica_port = free_port()
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def sentinels(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
        self.procs[name] = subprocess.Popen(
            argv, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def start(self) -> None:
        for name, port in (("primary", self.primary_port), ("replica", self.replica_port)):
            d = self.workdir / name
            d.mkdir()
            argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
                    "--save", "", "--appendonly", "no"]  # fmt: skip
            if name == "replica":
                argv += ["--replicaof", "127.0.0.1", str(self.primary_port)]
            self._start(name, argv)
        for k, port in enumerate(self.sentinel_ports):
            # A sentinel rewrites its configuration file: each gets its own, writable.
            conf = self.workdir / f"sentinel{k}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {self.primary_port} 2\n"
                f"sentinel down-after-milliseconds {MASTER} 1000\n"
                f"sentinel failover-timeout {MASTER} 10000\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
            )
            self._start(f"sentinel{k}", [_sentinel_binary(), str(conf)])
        assert wait_until(self.ready, timeout=30, interval=0.2), self.logs()

    def ready(self) -> bool:
        """Every sentinel knows the master, its replica online and the two other sentinels."""
        try:
            for port in self.sentinel_ports:
                s = redis.Redis(port=port, decode_responses=True, socket_timeout=1)
                master = s.sentinel_master(MASTER)
                replicas = s.sentinel_slaves(MASTER)
                if int(master["num-other-sentinels"]) != 2 or not any(
                    r["port"] == self.replica_port and not r["is_odown"] and not r["is_sdown"]
                    for r in replicas
                ):
                    return False
            return True
        except (redis.RedisError, KeyError):
            return False

    def master_port(self) -> int | None:
        """The master's port as the sentinels' majority sees it."""
        seen = []
        for port in self.sentinel_ports:
            try:
                s = redis.Redis(port=port, socket_timeout=1)
                seen.append(int(s.sentinel_get_master_addr_by_name(MASTER)[1]))
            except (redis.RedisError, TypeError):
                continue
        return max(set(seen), key=seen.count) if seen else None

    def kill(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait(timeout=10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
            for p in self.workdir.glob("*.log")
        )


def _sentinel_binary() -> str:
    found = shutil.which("redis-sentinel")
    if not found:
        pytest.skip("Debian's redis-sentinel is not installed (make test installs it)")
    return found


@pytest.fixture
def sentinel_set(tmp_path):  # type: ignore[no-untyped-def]
    (tmp_path / "redis").mkdir()
    s = SentinelSet(tmp_path / "redis")
    try:
        s.start()
        yield s
    finally:
        s.stop()


def _layer_round_trip(target: RedisTarget) -> str:
    """Send a message through the Channels layer configured for the target, and receive it."""
    from channels_redis.core import RedisChannelLayer

    async def go() -> str:
        layer = RedisChannelLayer(hosts=[target.channel_layer_host()], prefix="hpwsn:test")
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "test.ping", "n": "pong"})
        message = await asyncio.wait_for(layer.receive(channel), timeout=10)
        await layer.flush()
        return str(message["n"])

    return asyncio.run(go())


def test_a_failover_of_the_redis_master_mid_stream_loses_nothing(
    tmp_path, sentinel_set, consumer_factory
):
    s = sentinel_set
    target = RedisTarget(url="redis://127.0.0.1/0", sentinels=tuple(
        ("127.0.0.1", p) for p in s.sentinel_ports
    ), master=MASTER)  # fmt: skip
    assert _layer_round_trip(target) == "pong"
    (tmp_path / "platform").mkdir()
    overrides = {"REDIS_SENTINELS": s.sentinels, "REDIS_SENTINEL_MASTER": MASTER}
    # INFO: should delivery stop, the logs' tails say whether beat still sends and the worker
    # still runs tasks after the failover.
    with private_platform(tmp_path / "platform", loglevel="INFO", **overrides) as p:
        consumers = [consumer_factory(), consumer_factory()]
        for c in consumers:
            res = soap_call(p.endpoint, subscribe_xml(c.url, TOPIC))
            assert res.status == 200, res.body

        published = 0
        refused: list[str] = []
        done = threading.Event()

        def publish() -> None:
            nonlocal published
            for start in range(0, TOTAL, PER_NOTIFY):
                message_id = f"urn:uuid:{uuid.uuid4()}"
                while True:
                    try:
                        res = soap_call(p.endpoint, _notify(start), message_id=message_id)
                        if res.status == 202:
                            break
                        refused.append(f"{res.status} {res.fault_text}")
                    except httpx.HTTPError as exc:
                        refused.append(repr(exc))
                    time.sleep(0.05)
                published = start + PER_NOTIFY
            done.set()

        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        assert wait_until(lambda: published >= TOTAL // 2 or done.is_set(), timeout=600)
        s.kill("primary")
        killed_at = published
        promoted = wait_until(lambda: s.master_port() == s.replica_port, timeout=60, interval=0.2)
        assert promoted, s.logs()
        publisher.join(timeout=600)
        assert done.is_set(), "the publisher did not finish:\n" + p.logs()
        assert killed_at < TOTAL, "the master was killed after the stream had ended"

        complete = wait_until(
            lambda: all(len(set(_numbers(c))) >= TOTAL for c in consumers),
            timeout=300,
            interval=0.5,
        )
        assert complete, f"{[len(set(_numbers(c))) for c in consumers]}\n{p.logs()}\n{s.logs()}"
        for c in consumers:
            assert list(dict.fromkeys(_numbers(c))) == list(range(TOTAL))
        # The platform's Channels layer finds the new master too.
        assert _layer_round_trip(target) == "pong"
        # The publisher was never refused for good: a refusal would show as a retry here only
        # if Redis being away made a reliable Notify fail (it must not).
        assert not refused, refused
