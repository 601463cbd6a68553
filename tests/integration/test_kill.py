"""Reliable delivery under fault injection: real processes killed with SIGKILL, Redis lost.

Its own platform (web, worker, beat, a private Redis without persistence) on its own PostgreSQL
database, so killing and restarting never disturbs the shared test platform.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from django.conf import settings

from hpwsn_site import processes
from tests.support import RecordingConsumer, free_port, soap_call, subscribe_xml, wait_until

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
TOTAL = 10_000
PER_NOTIFY = 10
TOPIC = "ALL:ALARM:ALARM2"


class KillPlatform:
    def __init__(
        self,
        workdir: Path,
        database_url: str,
        *,
        redis_port: int | None = None,
        http_port: int | None = None,
        node_name: str = "",
        loglevel: str = "WARNING",
        **overrides: str,
    ) -> None:
        self.workdir = workdir
        self.loglevel = loglevel
        self.redis_port = redis_port or free_port()
        self.http_port = http_port or free_port()
        self.node_name = node_name or f"kill{self.http_port}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: Counter[str] = Counter()
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("HPWSN_", "LDAP_"))}
        self.env = {
            **keep,
            "DATABASE_URL": database_url,
            "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "HPWSN_DATA_DIR": str(workdir),
            "HPWSN_SECRET_KEY": "test-secret-key-not-for-production",
            "HPWSN_LEASE_S": "3",
            "HPWSN_PUSH_TIMEOUT_S": "3",
            "HPWSN_RETRY_SCHEDULE_S": "0.2,0.5,1,1,1,1,1,1,1,1",
            "HPWSN_RETRY_JITTER": "0",
            "HPWSN_RETRY_THROTTLED_MIN_S": "0.5",
            "HPWSN_HEARTBEAT_S": "0.5",
            "HPWSN_NODE_NAME": self.node_name,
            "PYTHONUNBUFFERED": "1",
            **overrides,
        }

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/wsn/"

    def command(self, name: str) -> list[str]:
        if name == "redis":
            return [
                "redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
            ]  # fmt: skip
        opts = processes.Options(
            bin_dir=VENV_BIN,
            port=self.http_port,
            node_name=self.node_name,
            data_dir=self.workdir,
            loglevel=self.loglevel,
            # A restarted worker is a new one: its own name (the broker addresses workers by it).
            worker_name=f"{self.node_name}-{self.starts['worker']}@%h",
        )
        return processes.command(name, opts)

    def start(self, name: str) -> None:
        self.starts[name] += 1
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
        self.procs[name] = subprocess.Popen(
            self.command(name),
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if name == "redis":
            import redis

            client = redis.Redis(port=self.redis_port)
            assert wait_until(lambda: _pings(client), timeout=10)
        if name == "web":
            assert wait_until(self.web_up, timeout=30), self.logs()

    def web_up(self) -> bool:
        try:
            return httpx.get(self.endpoint, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self, name: str) -> None:
        """SIGKILL the whole process group: the main process and every child, no clean-up."""
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in self.workdir.glob("*.log")
        )


def _pings(client) -> bool:  # type: ignore[no-untyped-def]
    try:
        return bool(client.ping())
    except Exception:
        return False


@pytest.fixture
def kill_platform(tmp_path):  # type: ignore[no-untyped-def]
    with private_platform(tmp_path) as platform:
        yield platform


@contextlib.contextmanager
def private_platform(
    tmp_path: Path,
    *,
    node_name: str = "",
    http_port: int | None = None,
    loglevel: str = "WARNING",
    **overrides: str,
) -> Iterator[KillPlatform]:
    """A platform of the test's own (web, worker, beat, Redis) on a new PostgreSQL database."""
    db = settings.DATABASES["default"]
    if not db["ENGINE"].endswith("postgresql"):
        pytest.skip("the kill test runs against PostgreSQL")
    name = f"hpwsn_kill_{uuid.uuid4().hex[:8]}"
    dsn = dict(
        host=db.get("HOST") or "127.0.0.1",
        port=int(db.get("PORT") or 5432),
        user=db.get("USER") or "postgres",
        password=db.get("PASSWORD") or None,
    )
    with psycopg.connect(dbname="postgres", autocommit=True, **dsn) as conn:  # type: ignore[arg-type]
        conn.execute(f'CREATE DATABASE "{name}"')
    password = f":{dsn['password']}" if dsn["password"] else ""
    url = f"postgres://{dsn['user']}{password}@{dsn['host']}:{dsn['port']}/{name}"
    platform = KillPlatform(
        tmp_path, url, node_name=node_name, http_port=http_port, loglevel=loglevel, **overrides
    )
    try:
        if "REDIS_SENTINELS" not in overrides:  # else the test runs Redis and its sentinels
            platform.start("redis")
        for args in (["migrate", "--noinput"], ["topics_load_demo"]):
            done = subprocess.run(
                [sys.executable, "manage.py", *args],
                cwd=ROOT,
                env=platform.env,
                capture_output=True,
            )
            assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
        for proc in ("web", "worker", "beat"):
            platform.start(proc)
        yield platform
    finally:
        platform.stop_all()
        with psycopg.connect(dbname="postgres", autocommit=True, **dsn) as conn:  # type: ignore[arg-type]
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _numbers(consumer: RecordingConsumer) -> list[int]:
    return [int(t) for t in consumer.payload_texts()]


def _notify(start: int) -> str:
    parts = "".join(
        f'<wsnt:NotificationMessage><wsnt:Topic Dialect="{_SIMPLE}">{TOPIC}</wsnt:Topic>'
        f"<wsnt:Message><n>{i}</n></wsnt:Message></wsnt:NotificationMessage>"
        for i in range(start, start + PER_NOTIFY)
    )
    return f"<wsnt:Notify>{parts}</wsnt:Notify>"


_SIMPLE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"


def test_a_reliable_topic_delivers_every_notification_in_order_through_kills_and_a_redis_loss(
    kill_platform, consumer_factory
):
    p = kill_platform
    consumers = [consumer_factory() for _ in range(3)]
    for c in consumers:
        res = soap_call(p.endpoint, subscribe_xml(c.url, TOPIC))
        assert res.status == 200, res.body
    # A pull point too: read only at the end, so it holds everything through the Redis loss.
    res = soap_call(p.endpoint, "<wsnt:CreatePullPoint/>")
    pull_point = res.findtext(".//wsnt:PullPoint/wsa:Address")
    assert pull_point, res.body
    assert soap_call(p.endpoint, subscribe_xml(pull_point, TOPIC)).status == 200

    published = 0
    retries = 0
    done = threading.Event()

    def publish() -> None:
        nonlocal published, retries
        for start in range(0, TOTAL, PER_NOTIFY):
            # A publisher that gets no answer sends the same Notify again, with the same
            # wsa:MessageID: the broker stores it once.
            message_id = f"urn:uuid:{uuid.uuid4()}"
            while True:
                try:
                    res = soap_call(p.endpoint, _notify(start), message_id=message_id)
                    if res.status == 202:
                        break
                except httpx.HTTPError:
                    pass
                retries += 1
                time.sleep(0.1)
            published = start + PER_NOTIFY
        done.set()

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    faults = [
        (1_500, "worker"),
        (3_000, "web"),
        (4_500, "worker"),
        (6_000, "redis"),
        (7_500, "worker"),
    ]
    injected = []
    for at, name in faults:
        assert wait_until(lambda at=at: published >= at or done.is_set(), timeout=300)
        p.kill(name)
        injected.append({"at": published, "killed": name})
        time.sleep(0.5)
        p.start(name)
    publisher.join(timeout=300)
    assert done.is_set(), "the publisher did not finish:\n" + p.logs()

    complete = wait_until(
        lambda: all(len(set(_numbers(c))) >= TOTAL for c in consumers), timeout=300, interval=0.5
    )
    report = {"published": TOTAL, "publisher_retries": retries, "faults": injected}
    for k, c in enumerate(consumers):
        numbers = _numbers(c)
        first_seen = list(dict.fromkeys(numbers))
        report[f"consumer{k}"] = {
            "received": len(numbers),
            "distinct": len(set(numbers)),
            "duplicates": len(numbers) - len(set(numbers)),
            "in_order": first_seen == sorted(first_seen),
        }
    pulled = _pull_all(p.endpoint, pull_point)
    report["pull_point"] = {
        "received": len(pulled),
        "distinct": len(set(pulled)),
        "duplicates": len(pulled) - len(set(pulled)),
    }
    out = ROOT / "test-output"
    out.mkdir(exist_ok=True)
    (out / "kill-test.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    assert complete, json.dumps(report) + "\n" + p.logs()
    for c in consumers:
        numbers = _numbers(c)
        # Every id, and in publication order once redeliveries are set aside.
        assert list(dict.fromkeys(numbers)) == list(range(TOTAL))
    assert list(dict.fromkeys(pulled)) == list(range(TOTAL))


def _pull_all(endpoint: str, pull_point: str) -> list[int]:
    numbers: list[int] = []
    while True:
        body = "<wsnt:GetMessages><wsnt:MaximumNumber>5000</wsnt:MaximumNumber></wsnt:GetMessages>"
        res = soap_call(endpoint, body, to=pull_point)
        assert res.status == 200, res.body
        batch = [int(n.text or "") for n in res.root.iter("n")] if res.root is not None else []
        if not batch:
            return numbers
        numbers += batch
