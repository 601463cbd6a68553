"""Throughput and latency across one federated hop, against the same run's single-site figures.

Starts two sites on this machine (each its own PostgreSQL database, Redis, web, worker and beat,
with the command lines of hpwsn_site/processes.py), peered with each other. A consumer on
127.0.0.1 is subscribed at site a to ALL1 (single site: published at a, delivered by a) and at
site b to ALL2 (one hop: published at a, forwarded to b, delivered by b). Then, for each path:

- throughput: N notifications published as fast as the publishers go, divided by the time from
  the first publish to the last delivery;
- latency: notifications paced at --rate per second; p50 / p99 of delivery time minus publish
  time (one clock: everything runs here).

    DATABASE_URL=postgres://hpwsn:hpwsn@127.0.0.1:5432/hpwsn .venv/bin/python -m bench.federation

The goal (issue 12): one hop keeps at least 0.8 x the single-site throughput and adds less than
20 ms at p99 at 1,000/s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg

from bench.common import BIN, ROOT
from hpwsn_site import processes

WSNT = "http://docs.oasis-open.org/wsn/b-2"
WSA = "http://www.w3.org/2005/08/addressing"
SOAP11 = "http://schemas.xmlsoap.org/soap/envelope/"
COLON = "urn:hpwsn:topic-dialect:colon-path"
_MARK = re.compile(rb"<n>([^<]+)</n>")


def log(msg: str) -> None:
    print(f"[federation bench] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def envelope(body: str) -> bytes:
    return (
        f'<s:Envelope xmlns:s="{SOAP11}" xmlns:wsnt="{WSNT}" xmlns:wsa="{WSA}"><s:Header>'
        f"<wsa:MessageID>urn:uuid:{uuid.uuid4()}</wsa:MessageID></s:Header>"
        f"<s:Body>{body}</s:Body></s:Envelope>"
    ).encode()


class Consumer:
    """Records when each marked notification (`<n>label:seq:sent</n>`) arrives."""

    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                now = time.time()
                with outer.lock:
                    for mark in _MARK.findall(body):
                        outer.arrivals.setdefault(mark.decode(), now)
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/consumer"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, label: str) -> int:
        with self.lock:
            return sum(1 for k in self.arrivals if k.startswith(label + ":"))


class Site:
    def __init__(self, name: str, workdir: Path, admin_dsn: dict[str, object]) -> None:
        self.name = name
        self.workdir = workdir
        self.admin_dsn = admin_dsn
        self.http_port = free_port()
        self.redis_port = free_port()
        self.db = f"hpwsn_bench_fed_{name}_{uuid.uuid4().hex[:6]}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env: dict[str, str] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
        self.procs.append(
            subprocess.Popen(
                argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )  # fmt: skip

    def start(self, peers: dict[str, str], args: argparse.Namespace) -> None:
        with psycopg.connect(dbname="postgres", autocommit=True, **self.admin_dsn) as conn:  # type: ignore[arg-type]
            conn.execute(f'CREATE DATABASE "{self.db}"')
        d = self.admin_dsn
        password = f":{d['password']}" if d.get("password") else ""
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("HPWSN_", "LDAP_"))}
        self.env = {
            **keep,
            "DATABASE_URL": f"postgres://{d['user']}{password}@{d['host']}:{d['port']}/{self.db}",
            "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "HPWSN_DATA_DIR": str(self.workdir),
            "HPWSN_SECRET_KEY": f"bench-{self.name}-not-for-production",
            "HPWSN_SITE_NAME": self.name,
            "HPWSN_FEDERATION_PEERS": ",".join(f"{n}={u}" for n, u in peers.items()),
            "HPWSN_FEDERATION_URL": self.url,
            "HPWSN_FEDERATION_SYNC_S": "1",
            "HPWSN_EVENTS": "0",
        }
        self._spawn("redis", [*processes.redis_server(), "--port", str(self.redis_port), "--bind",
                              "127.0.0.1", "--save", "", "--appendonly", "no"])  # fmt: skip
        for cmd in (["migrate", "--noinput"], ["topics_load_demo"]):
            subprocess.run(
                [str(BIN / "python"), "manage.py", *cmd], cwd=ROOT, env=self.env, check=True,
                capture_output=True,
            )  # fmt: skip
        opts = processes.Options(
            bin_dir=BIN,
            port=self.http_port,
            web_workers=args.web_workers,
            concurrency=args.worker_concurrency,
            node_name=f"bench-{self.name}",
            data_dir=self.workdir,
            loglevel="WARNING",
        )
        for role in ("web", "worker", "beat"):
            self._spawn(role, processes.command(role, opts))
        deadline = time.time() + 90
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            if time.time() > deadline:
                raise RuntimeError(f"site {self.name} did not start; see {self.workdir}")
            time.sleep(0.3)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        with psycopg.connect(dbname="postgres", autocommit=True, **self.admin_dsn) as conn:  # type: ignore[arg-type]
            conn.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')


def subscribe(site: Site, consumer: str, topic: str) -> None:
    body = (
        f"<wsnt:Subscribe><wsnt:ConsumerReference><wsa:Address>{consumer}</wsa:Address>"
        f'</wsnt:ConsumerReference><wsnt:Filter><wsnt:TopicExpression Dialect="{COLON}">{topic}'
        f"</wsnt:TopicExpression></wsnt:Filter></wsnt:Subscribe>"
    )
    res = httpx.post(site.url + "/wsn/", content=envelope(body),
                     headers={"Content-Type": "text/xml"}, timeout=10)  # fmt: skip
    res.raise_for_status()


def publish_notify(client: httpx.Client, site: Site, topic: str, marks: list[str]) -> None:
    parts = "".join(
        f'<wsnt:NotificationMessage><wsnt:Topic Dialect="{COLON}">{topic}</wsnt:Topic>'
        f"<wsnt:Message><n>{m}</n></wsnt:Message></wsnt:NotificationMessage>"
        for m in marks
    )
    res = client.post(site.url + "/wsn/", content=envelope(f"<wsnt:Notify>{parts}</wsnt:Notify>"),
                      headers={"Content-Type": "text/xml"})  # fmt: skip
    if res.status_code != 202:
        raise RuntimeError(f"publish answered {res.status_code}: {res.text[:300]}")


def wait_count(consumer: Consumer, label: str, n: int, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if consumer.count(label) >= n:
            return True
        time.sleep(0.05)
    return consumer.count(label) >= n


def throughput(
    consumer: Consumer, site: Site, topic: str, label: str, args: argparse.Namespace
) -> float:
    """Notifications per second from the first publish to the last delivery."""
    per = args.per_notify
    batches = [list(range(i, min(i + per, args.count))) for i in range(0, args.count, per)]
    start = time.time()

    def worker(part: list[list[int]]) -> None:
        with httpx.Client(timeout=30) as client:
            for batch in part:
                publish_notify(client, site, topic, [f"{label}:{i}:0" for i in batch])

    threads = [threading.Thread(target=worker, args=(batches[k :: args.publishers],))
               for k in range(args.publishers)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not wait_count(consumer, label, args.count, timeout=300):
        raise RuntimeError(f"{label}: {consumer.count(label)} of {args.count} delivered")
    with consumer.lock:
        last = max(v for k, v in consumer.arrivals.items() if k.startswith(label + ":"))
    return args.count / (last - start)


def latency(
    consumer: Consumer, site: Site, topic: str, label: str, args: argparse.Namespace
) -> list[float]:
    """Delivery minus publish times (ms) of notifications paced at args.rate per second."""
    per = args.per_notify
    total = int(args.rate * args.seconds)
    sent: dict[str, float] = {}
    interval = per / args.rate
    with httpx.Client(timeout=30) as client:
        t0 = time.time()
        for k, i in enumerate(range(0, total, per)):
            due = t0 + k * interval
            pause = due - time.time()
            if pause > 0:
                time.sleep(pause)
            marks = [f"{label}:{j}:x" for j in range(i, min(i + per, total))]
            now = time.time()
            publish_notify(client, site, topic, marks)
            for m in marks:
                sent[m] = now
    if not wait_count(consumer, label, total, timeout=300):
        raise RuntimeError(f"{label}: {consumer.count(label)} of {total} delivered")
    with consumer.lock:
        return sorted((consumer.arrivals[m] - t) * 1000 for m, t in sent.items())


def pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--count", type=int, default=10_000, help="notifications per throughput run"
    )
    parser.add_argument(
        "--per-notify", type=int, default=10, help="NotificationMessages per Notify"
    )
    parser.add_argument("--publishers", type=int, default=4, help="publishing threads")
    parser.add_argument("--rate", type=float, default=1000.0, help="latency run: notifications/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency run: duration")
    parser.add_argument("--web-workers", type=int, default=1)
    parser.add_argument("--worker-concurrency", type=int, default=2)
    args = parser.parse_args()
    if not shutil.which("redis-server"):
        sys.exit("redis-server is needed (apt-get install redis-server)")
    url = urlsplit(os.environ.get("DATABASE_URL", "postgres://hpwsn:hpwsn@127.0.0.1:5432/hpwsn"))
    admin = {"host": url.hostname or "127.0.0.1", "port": url.port or 5432,
             "user": url.username or "postgres", "password": url.password}  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="hpwsn-bench-federation-"))
    (workdir / "a").mkdir()
    (workdir / "b").mkdir()
    a, b = Site("a", workdir / "a", admin), Site("b", workdir / "b", admin)
    with contextlib.ExitStack() as stack:
        for site, peer in ((a, b), (b, a)):
            stack.callback(site.stop)
            site.start({peer.name: peer.url}, args)
        log(f"sites up: a {a.url}, b {b.url} (logs in {workdir})")
        consumer = Consumer()
        subscribe(a, consumer.url, "ALL1")  # single site
        subscribe(b, consumer.url, "ALL2")  # one hop: published at a, delivered by b
        # The link b holds at a for ALL2 exists once a notification published at a gets there.
        deadline = time.time() + 60
        k = 0
        while consumer.count("warm") < 1:
            if time.time() > deadline:
                raise RuntimeError(f"the link a -> b never carried anything; see {workdir}")
            with httpx.Client(timeout=10) as client:
                publish_notify(client, a, "ALL2", [f"warm:{k}:0"])
            k += 1
            time.sleep(0.5)
        log("link a -> b carries; warming up both paths")
        for label, topic in (("w1", "ALL1"), ("w2", "ALL2")):
            args_w = argparse.Namespace(**{**vars(args), "count": 1000})
            throughput(consumer, a, topic, label, args_w)
        results = {}
        for name, topic in (("single site", "ALL1"), ("one hop", "ALL2")):
            label = name.replace(" ", "")
            tput = throughput(consumer, a, topic, "t" + label, args)
            lat = latency(consumer, a, topic, "l" + label, args)
            results[name] = (tput, pct(lat, 50), pct(lat, 99), statistics.fmean(lat))
            log(f"{name}: {tput:,.0f}/s, p50 {pct(lat, 50):.1f} ms, p99 {pct(lat, 99):.1f} ms")
    single, hop = results["single site"], results["one hop"]
    print()
    print(f"{'':24}{'single site':>14}{'one hop':>14}{'ratio / added':>16}")
    print(f"{'throughput (/s)':24}{single[0]:>14,.0f}{hop[0]:>14,.0f}{hop[0] / single[0]:>15.2f}x")
    for k, name in ((1, "latency p50 (ms)"), (2, "latency p99 (ms)"), (3, "latency mean (ms)")):
        print(f"{name:24}{single[k]:>14.1f}{hop[k]:>14.1f}{hop[k] - single[k]:>+15.1f} ms")
    print(
        f"\ngoal: throughput ratio >= 0.80 ({'met' if hop[0] / single[0] >= 0.8 else 'NOT met'}), "
        f"added p99 < 20 ms at {args.rate:.0f}/s "
        f"({'met' if hop[2] - single[2] < 20 else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
