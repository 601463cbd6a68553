#!/usr/bin/env python3
"""End-to-end benchmark of HPwsn: SOAP Notify in, wsnt:Notify push out, against a ceiling.

Starts a private platform the way `make run` does (redis-server, uvicorn web, Celery worker
and beat) in a temporary data dir with its own SQLite database and Redis, then measures in
one run:

  ceiling     SOAP Notify requests/s against /bench/echo/ (parse only, 202) on the same server
  end-to-end  notifications/s from SOAP Notify on /wsn/ to receipt at one subscribed consumer,
              with publish-to-receipt latency and an exactly-once check by sequence number

and prints them side by side with their ratio. See bench/README.md.

    .venv/bin/python -m bench.e2e [--duration 20] [--publishers-concurrency 32] [--json out.json]
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import itertools
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    BIN,
    ROOT,
    cpu_seconds,
    free_port,
    group_pids,
    http,
    install_uvloop,
    log,
    machine,
    percentile,
    redis_ping,
)
from hpwsn_site import processes  # no Django in it, cheap to import

SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
WSA = "http://www.w3.org/2005/08/addressing"
WSNT = "http://docs.oasis-open.org/wsn/b-2"
SIMPLE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
ACTION_NOTIFY = "http://docs.oasis-open.org/wsn/bw-2/NotificationConsumer/Notify"
ACTION_SUBSCRIBE = "http://docs.oasis-open.org/wsn/bw-2/NotificationProducer/SubscribeRequest"
TOPIC = "ALL:ALARM:ALARM1"
SUBSCRIBE_TOPIC = "ALL"

PHASE_PROBE, PHASE_WARMUP, PHASE_MEASURE = 9, 0, 1

# One NotificationMessage per request by default; %-formatting is the cheapest way to fill it.
NOTIFY_HEAD = (
    '<?xml version="1.0" encoding="utf-8"?>'
    f'<s:Envelope xmlns:s="{SOAP12}" xmlns:wsa="{WSA}" xmlns:wsnt="{WSNT}">'
    f"<s:Header><wsa:Action>{ACTION_NOTIFY}</wsa:Action><wsa:To>%s</wsa:To>"
    "<wsa:MessageID>urn:hpwsn-bench:%d:%d</wsa:MessageID></s:Header>"
    "<s:Body><wsnt:Notify>"
)
NOTIFY_ITEM = (
    "<wsnt:NotificationMessage>"
    f'<wsnt:Topic Dialect="{SIMPLE}">{TOPIC}</wsnt:Topic>'
    '<wsnt:Message><m xmlns="urn:bench"><p>%d</p><seq>%d</seq><t>%.6f</t>%s</m></wsnt:Message>'
    "</wsnt:NotificationMessage>"
)
NOTIFY_TAIL = "</wsnt:Notify></s:Body></s:Envelope>"


def notify_body(to: str, phase: int, seqs: range, t_send: float, pad: str = "") -> bytes:
    """A Notify envelope carrying one NotificationMessage per seq (`pad`: XML after <t>)."""
    items = "".join(NOTIFY_ITEM % (phase, seq, t_send, pad) for seq in seqs)
    return (NOTIFY_HEAD % (to, phase, seqs[0]) + items + NOTIFY_TAIL).encode()


# REST publish (--rest): the same payload as a JSON body, one message or a batch.
REST_PATH = f"/api/v1/topics/{TOPIC}/messages"
REST_ITEM = '{"xml":"<m xmlns=\\"urn:bench\\"><p>%d</p><seq>%d</seq><t>%.6f</t></m>"}'


def payload_pad(size: int) -> str:
    """An element that brings the benchmark's <m> payload to about `size` bytes (0: none)."""
    fill = size - len('<m xmlns="urn:bench"><p>1</p><seq>1000000</seq><t>1732170000.123456</t></m>')
    return f"<x>{'x' * (fill - 7)}</x>" if fill > 7 else ""


def rest_body(phase: int, seqs: range, t_send: float) -> bytes:
    """POST /api/v1/topics/{TOPIC}/messages: {"xml": ...} or {"messages": [...]}."""
    items = [REST_ITEM % (phase, seq, t_send) for seq in seqs]
    return (items[0] if len(items) == 1 else '{"messages":[' + ",".join(items) + "]}").encode()


NOTIFY_CT = f'application/soap+xml; charset=utf-8; action="{ACTION_NOTIFY}"'

SUBSCRIBE_TEMPLATE = (
    '<?xml version="1.0" encoding="utf-8"?>'
    f'<s:Envelope xmlns:s="{SOAP12}" xmlns:wsa="{WSA}" xmlns:wsnt="{WSNT}">'
    f"<s:Header><wsa:Action>{ACTION_SUBSCRIBE}</wsa:Action><wsa:To>%s</wsa:To>"
    "<wsa:MessageID>urn:hpwsn-bench:subscribe</wsa:MessageID></s:Header>"
    "<s:Body><wsnt:Subscribe><wsnt:ConsumerReference><wsa:Address>%s</wsa:Address>"
    f'</wsnt:ConsumerReference><wsnt:Filter><wsnt:TopicExpression Dialect="{SIMPLE}">'
    f"{SUBSCRIBE_TOPIC}</wsnt:TopicExpression></wsnt:Filter></wsnt:Subscribe></s:Body>"
    "</s:Envelope>"
)
SUBSCRIBE_CT = f'application/soap+xml; charset=utf-8; action="{ACTION_SUBSCRIBE}"'

# What the consumer looks for in each pushed NotificationMessage (prefix/whitespace tolerant).
_TAG = rb"<(?:[\w.-]+:)?%s>\s*([0-9.eE+-]+)\s*</(?:[\w.-]+:)?%s>\s*"
RECORD_RE = re.compile(_TAG % (b"p", b"p") + _TAG % (b"seq", b"seq") + _TAG % (b"t", b"t"))
NOTIFICATION_RE = re.compile(rb"<(?:[\w.-]+:)?NotificationMessage[\s>]")


# ============================================================================ consumer process


class _Recv:
    __slots__ = ("dups", "recv", "seen", "sent", "seqs")

    def __init__(self) -> None:
        self.seqs = array.array("q")
        self.sent = array.array("d")
        self.recv = array.array("d")
        self.seen: set[int] = set()
        self.dups = 0


def consumer_main(conn: Any) -> None:
    """An aiohttp NotificationConsumer; talks to the parent over `conn` (a Pipe end)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    install_uvloop()
    asyncio.run(_consumer(conn))


async def _consumer(conn: Any) -> None:
    from aiohttp import web

    phases: dict[int, _Recv] = {}
    totals = {"posts": 0, "notifications": 0, "unparsed": 0, "bytes": 0, "max_batch": 0}

    async def notify(request: web.Request) -> web.Response:
        body = await request.read()
        now = time.time()
        totals["posts"] += 1
        totals["bytes"] += len(body)
        n_msgs = len(NOTIFICATION_RE.findall(body))
        totals["notifications"] += n_msgs
        totals["max_batch"] = max(totals["max_batch"], n_msgs)
        parsed = 0
        for m in RECORD_RE.finditer(body):
            parsed += 1
            phase, seq = int(m.group(1)), int(m.group(2))
            rec = phases.get(phase)
            if rec is None:
                rec = phases[phase] = _Recv()
            if seq in rec.seen:
                rec.dups += 1
            else:
                rec.seen.add(seq)
            rec.seqs.append(seq)
            rec.sent.append(float(m.group(3)))
            rec.recv.append(now)
        totals["unparsed"] += max(0, n_msgs - parsed)
        return web.Response(status=202)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/consumer", notify)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock, backlog=1024)
    await site.start()

    def reply(cmd: str, args: list[Any]) -> bool:
        """Answer one command from the parent; False to stop."""
        if cmd == "count":
            rec = phases.get(args[0])
            conn.send((len(rec.seen) if rec else 0, len(rec.seqs) if rec else 0))
        elif cmd == "collect":
            rec = phases.pop(args[0], None) or _Recv()
            conn.send(
                {
                    "seqs": rec.seqs.tobytes(),
                    "sent": rec.sent.tobytes(),
                    "recv": rec.recv.tobytes(),
                    "totals": dict(totals),
                }
            )
        elif cmd == "stop":
            conn.send("bye")
            return False
        return True

    conn.send(("port", sock.getsockname()[1]))
    # Commands are read in a thread: an event-loop reader would make the pipe non-blocking and
    # a large "collect" reply would then fail with EAGAIN. Replies are sent from the loop thread.
    loop = asyncio.get_running_loop()
    while True:
        try:
            cmd, *args = await loop.run_in_executor(None, conn.recv)
        except (EOFError, OSError):
            break
        if not reply(cmd, args):
            break
    await runner.cleanup()


# ============================================================================ publisher process


def publisher_main(conn: Any, cfg: dict[str, Any]) -> None:
    """Post SOAP Notify requests with `concurrency` in flight until the deadline."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    install_uvloop()
    conn.send(asyncio.run(_publish(conn, cfg)))


async def _publish(conn: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    url: str = cfg["url"]
    phase: int = cfg["phase"]
    concurrency: int = cfg["concurrency"]
    nprocs: int = cfg["nprocs"]
    index: int = cfg["index"]
    per_request: int = cfg["per_request"]
    pad: str = cfg.get("pad", "")
    limit: int = cfg.get("limit", 0)  # notifications in all (0: until the deadline)
    # --rate counts notifications; requests carry `per_request` of them each.
    rate: float = cfg["rate"] / nprocs / per_request if cfg["rate"] else 0.0
    headers = {"Content-Type": NOTIFY_CT}
    to = url
    rest = REST_PATH in url
    if rest:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {cfg['token']}"}

    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    ok_seqs = array.array("q")
    latencies = array.array("d")
    statuses: Counter[str] = Counter()
    error_samples: list[str] = []
    sends = itertools.count()
    first_send = [0.0]
    last_done = [0.0]

    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, skip_auto_headers=("User-Agent",)
    ) as session:
        # Open the connections before the clock starts (not counted).
        async def touch() -> None:
            async with session.get(cfg["health_url"]) as resp:
                await resp.read()

        await asyncio.gather(*(touch() for _ in range(concurrency)), return_exceptions=True)
        conn.send("ready")
        start_at = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        start = time.time()
        deadline = start + cfg["duration"]
        first_send[0] = start

        async def sender() -> None:
            while True:
                i = next(sends)
                if rate:
                    due = start + i / rate
                    now = time.time()
                    if due > now:
                        await asyncio.sleep(due - now)
                t_send = time.time()
                if t_send >= deadline:
                    return
                first = (index + i * nprocs) * per_request
                if limit and first >= limit:
                    return
                seqs = range(first, first + per_request)
                body = (
                    rest_body(phase, seqs, t_send)
                    if rest
                    else notify_body(to, phase, seqs, t_send, pad)
                )
                t0 = time.perf_counter()
                try:
                    async with session.post(url, data=body, headers=headers) as resp:
                        payload = await resp.read()
                        status = resp.status
                except Exception as exc:  # counted and reported
                    statuses[type(exc).__name__] += 1
                    if len(error_samples) < 5:
                        error_samples.append(f"{type(exc).__name__}: {exc}")
                    continue
                elapsed = time.perf_counter() - t0
                last_done[0] = time.time()
                if 200 <= status < 300:
                    ok_seqs.extend(seqs)
                    latencies.append(elapsed)
                else:
                    statuses[str(status)] += 1
                    if len(error_samples) < 5:
                        error_samples.append(f"HTTP {status}: {payload[:300]!r}")

        await asyncio.gather(*(sender() for _ in range(concurrency)))
    return {
        "ok_seqs": ok_seqs.tobytes(),
        "latencies": latencies.tobytes(),
        "errors": dict(statuses),
        "error_samples": error_samples,
        "first_send": first_send[0],
        "last_done": last_done[0] or time.time(),
        "end": time.time(),
    }


@dataclass
class PublishResult:
    ok_seqs: array.array
    latencies: list[float]
    errors: Counter[str]
    error_samples: list[str]
    first_send: float
    last_done: float

    @property
    def ok(self) -> int:
        return len(self.ok_seqs)


def publish(
    url: str, *, phase: int, duration: float, args: argparse.Namespace, base_url: str
) -> PublishResult:
    """Run the publisher processes for `duration` seconds and merge their results."""
    ctx = mp.get_context("fork")
    procs, pipes = [], []
    for i in range(args.publisher_procs):
        parent_end, child_end = ctx.Pipe()
        cfg = {
            "url": url,
            "health_url": base_url + "/healthz",
            "phase": phase,
            "duration": duration,
            "concurrency": args.publishers_concurrency,
            "nprocs": args.publisher_procs,
            "index": i,
            "rate": args.rate,
            "per_request": args.messages_per_notify,
            "token": getattr(args, "rest_token", ""),
            # bench.peers: a larger payload and a number of notifications instead of a duration
            "pad": payload_pad(getattr(args, "payload_bytes", 0)),
            "limit": getattr(args, "messages", 0),
        }
        p = ctx.Process(
            target=publisher_main, args=(child_end, cfg), name=f"publisher-{i}", daemon=True
        )
        p.start()
        procs.append(p)
        pipes.append(parent_end)
        RUNNING.mp_children.append(p)
    try:
        for pipe in pipes:
            if not pipe.poll(60) or pipe.recv() != "ready":
                raise RuntimeError("a publisher process did not start")
        start_at = time.time() + 0.1
        for pipe in pipes:
            pipe.send(start_at)
        results = []
        for pipe in pipes:
            if not pipe.poll(duration + 120):
                raise RuntimeError("a publisher process did not finish")
            results.append(pipe.recv())
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
            RUNNING.mp_children.remove(p)
    ok_seqs = array.array("q")
    lat = array.array("d")
    errors: Counter[str] = Counter()
    samples: list[str] = []
    for r in results:
        ok_seqs.frombytes(r["ok_seqs"])
        lat.frombytes(r["latencies"])
        errors.update(r["errors"])
        samples += r["error_samples"]
    return PublishResult(
        ok_seqs=ok_seqs,
        latencies=sorted(lat),
        errors=errors,
        error_samples=samples[:5],
        first_send=min(r["first_send"] for r in results),
        last_done=max(r["last_done"] for r in results),
    )


# ============================================================================ platform


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Running:
    """Everything this run started, so that cleanup can stop it whatever happened."""

    children: list[Child] = field(default_factory=list)
    mp_children: list[Any] = field(default_factory=list)
    consumer: Any = None
    consumer_pipe: Any = None
    profilers: list[subprocess.Popen[bytes]] = field(default_factory=list)


RUNNING = Running()


def start_child(name: str, cmd: list[str], env: dict[str, str], logdir: Path) -> Child:
    log_path = logdir / f"{name}.log"
    fh = open(log_path, "ab")  # noqa: SIM115 - kept open by the child
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=fh,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # own process group: stopped as a whole, spared terminal ^C
    )
    fh.close()
    child = Child(name, proc, log_path)
    RUNNING.children.append(child)
    return child


def _wait_groups(pgids: list[int], seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if not any(group_pids(g) for g in pgids):
            return True
        time.sleep(0.1)
    return not any(group_pids(g) for g in pgids)


def stop_children(children: list[Child]) -> None:
    """SIGTERM the leaders (warm shutdown), then the groups, then SIGKILL - like run.sh."""
    if not children:
        return
    for c in children:
        with contextlib.suppress(ProcessLookupError):
            c.proc.send_signal(signal.SIGTERM)
    pgids = [c.pid for c in children]
    if not _wait_groups(pgids, 20):
        for g in pgids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(g, signal.SIGTERM)
        if not _wait_groups(pgids, 3):
            for g in pgids:
                if group_pids(g):
                    log(f"process group {g} did not stop in time; killing it")
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(g, signal.SIGKILL)
            _wait_groups(pgids, 3)
    for c in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.proc.wait(1)


def cleanup() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # no second interruption of the shutdown
    for p in RUNNING.profilers:
        if p.poll() is None:
            p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
    if RUNNING.consumer_pipe is not None:
        with contextlib.suppress(Exception):
            RUNNING.consumer_pipe.send(("stop",))
    for p in [*RUNNING.mp_children, *([RUNNING.consumer] if RUNNING.consumer else [])]:
        p.join(3)
        if p.is_alive():
            p.kill()
            p.join(2)
    apps = [c for c in RUNNING.children if c.name != "redis"]
    infra = [c for c in RUNNING.children if c.name == "redis"]
    stop_children(apps)
    stop_children(infra)  # Redis last: the worker talks to it while it shuts down
    RUNNING.children.clear()


def ensure_database(url: str) -> None:
    """A dedicated, empty bench database: (re)created so old subscriptions do not interfere."""
    parts = urllib.parse.urlsplit(url)
    name = parts.path.lstrip("/")
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise SystemExit(f"--database-url: only PostgreSQL URLs are supported, not {url!r}")
    if "bench" not in name:
        raise SystemExit(
            f"--database-url: refusing to reset database {name!r}; use a dedicated database "
            "whose name contains 'bench' (it is dropped and recreated on every run)"
        )
    host = parts.hostname or "127.0.0.1"
    port = str(parts.port or 5432)
    owner = parts.username or "postgres"
    admin = ["-h", host, "-p", port, "-U", "postgres"]
    log(f"recreating PostgreSQL database {name} on {host}:{port} (owner {owner})")
    subprocess.run(["dropdb", *admin, "--if-exists", "--force", name], check=True)
    subprocess.run(["createdb", *admin, "-O", owner, name], check=True)


@dataclass
class Platform:
    data_dir: Path
    base_url: str
    redis_port: int
    web: Child
    worker: Child
    beat: Child
    redis: Child
    env: dict[str, str]


def start_platform(args: argparse.Namespace, data_dir: Path) -> Platform:
    logdir = data_dir / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    redis_port = free_port()
    http_port = free_port()
    env = dict(os.environ)
    for var in ("DATABASE_URL", "REDIS_URL", "HPWSN_PUBLIC_URL"):
        env.pop(var, None)
    env.update(
        HPWSN_DATA_DIR=str(data_dir),
        REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
        HPWSN_BENCH_ENDPOINTS="1",
        PYTHONUNBUFFERED="1",
        DJANGO_SETTINGS_MODULE="hpwsn_site.settings",
    )
    if args.monitoring_compare:
        env["HPWSN_MONITORING"] = "1"
    if args.events_compare:
        env["HPWSN_EVENTS"] = "1"
    if args.database_url:
        ensure_database(args.database_url)
        env["DATABASE_URL"] = args.database_url

    (data_dir / "redis").mkdir(exist_ok=True)
    log(f"starting redis-server on 127.0.0.1:{redis_port}")
    redis = start_child(
        "redis",
        [
            *processes.redis_server(),
            *("--port", str(redis_port), "--bind", "127.0.0.1"),
            *("--dir", str(data_dir / "redis"), "--save", "", "--appendonly", "no"),
            *("--daemonize", "no", "--logfile", ""),
        ],
        env,
        logdir,
    )
    deadline = time.time() + 30
    while not redis_ping(redis_port):
        if redis.proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"redis-server did not start; see {redis.log_path}")
        time.sleep(0.1)

    py = str(BIN / "python")
    for step in (["migrate", "--noinput"], ["topics_load_demo"]):
        log(f"manage.py {' '.join(step)}")
        with open(logdir / "manage.log", "ab") as fh:
            rc = subprocess.run(
                [py, "manage.py", *step], cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT
            ).returncode
        if rc:
            raise RuntimeError(f"manage.py {step[0]} failed; see {logdir / 'manage.log'}")

    set_reliability(env, args.reliability)
    web, worker, beat = start_apps(args, env, logdir, http_port, data_dir)
    base_url = f"http://127.0.0.1:{http_port}"
    return Platform(data_dir, base_url, redis_port, web, worker, beat, redis, env)


def set_reliability(env: dict[str, str], reliability: str) -> None:
    """Set the policy of the benchmark's topic tree (the root `ALL`): `reliable` or `fast`."""
    code = (
        "from topics.models import Topic; from hpwsn_site import state; "
        f"Topic.objects.filter(path='ALL').update(reliability='{reliability}'); "
        "state.bump(state.VERSION_TOPICS)"
    )
    subprocess.run(
        [str(BIN / "python"), "manage.py", "shell", "-c", code], cwd=ROOT, env=env, check=True
    )
    log(f"topic ALL: reliability={reliability}")


def start_apps(
    args: argparse.Namespace, env: dict[str, str], logdir: Path, http_port: int, data_dir: Path
) -> tuple[Child, Child, Child]:
    """uvicorn, the Celery worker and beat, as make run starts them; waits for /healthz."""
    log(
        f"starting web (uvicorn, {args.web_workers} worker(s)) on 127.0.0.1:{http_port}, "
        f"celery worker (-c {args.worker_concurrency}) and beat"
        + ("" if env.get("HPWSN_MONITORING", "1") != "0" else ", monitoring off")
    )
    # The node's command lines as make run spells them (hpwsn_site/processes.py).
    opts = processes.Options(
        bin_dir=BIN,
        port=http_port,
        web_workers=args.web_workers,
        concurrency=args.worker_concurrency,
        node_name="bench",
        data_dir=data_dir,
        worker_name="bench-worker1@%h",
    )
    web, worker, beat = (
        start_child(role, processes.command(role, opts), env, logdir)
        for role in ("web", "worker", "beat")
    )
    base_url = f"http://127.0.0.1:{http_port}"
    deadline = time.time() + 60
    while True:
        for c in (web, worker, beat):
            if c.proc.poll() is not None:
                raise RuntimeError(f"{c.name} exited with {c.proc.returncode}; see {c.log_path}")
        with contextlib.suppress(OSError):
            if http(base_url + "/healthz", timeout=2)[0] == 200:
                break
        if time.time() > deadline:
            raise RuntimeError(f"{base_url}/healthz did not answer within 60 s")
        time.sleep(0.25)
    return web, worker, beat


def restart_apps(
    plat: Platform, args: argparse.Namespace, *, monitoring: bool, events: bool = True
) -> None:
    """Stop web, worker and beat (Redis, the database and the consumer stay) and start them
    again with HPWSN_MONITORING and HPWSN_EVENTS (the analytics event log) on or off."""
    old = [plat.web, plat.worker, plat.beat]
    stop_children(old)
    for c in old:
        RUNNING.children.remove(c)
    plat.env["HPWSN_MONITORING"] = "1" if monitoring else "0"
    plat.env["HPWSN_EVENTS"] = "1" if events else "0"
    port = int(plat.base_url.rsplit(":", 1)[1])
    plat.web, plat.worker, plat.beat = start_apps(
        args, plat.env, plat.data_dir / "logs", port, plat.data_dir
    )


def web_connections(plat: Platform) -> dict[int, int]:
    """Established client connections held by each web process (how uvicorn spread them)."""
    port = int(plat.base_url.rsplit(":", 1)[1])
    inodes = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "01":  # ESTABLISHED
                inodes.add(f[9])
    out = {}
    for pid in group_pids(plat.web.pid):
        n = 0
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        n += 1
        out[pid] = n
    return out


_SETTINGS = (
    "HPWSN_PUSH_BATCH",
    "HPWSN_PUSH_TIMEOUT_S",
    "HPWSN_FANOUT_BATCH",
    "HPWSN_FANOUT_TICK_S",
    "CELERY_WORKER_PREFETCH_MULTIPLIER",
    "DEBUG",
)


def server_settings(plat: Platform) -> dict[str, Any]:
    """The effective settings that shape the hot path, as the server processes see them."""
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        f"print(json.dumps({{k: getattr(s, k, None) for k in {_SETTINGS!r}}}, default=str))"
    )
    out = subprocess.run(
        [str(BIN / "python"), "-c", code], cwd=ROOT, env=plat.env, capture_output=True, text=True
    )
    try:
        values: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": out.stderr.strip()[-300:]}
    return {k.removeprefix("HPWSN_").lower(): v for k, v in values.items()}


def check_alive(plat: Platform) -> None:
    for c in (plat.web, plat.worker, plat.beat, plat.redis):
        if c.proc.poll() is not None:
            raise RuntimeError(f"{c.name} died (exit {c.proc.returncode}); see {c.log_path}")


# ============================================================================ consumer control


def start_consumer() -> tuple[Any, int]:
    ctx = mp.get_context("fork")
    parent_end, child_end = ctx.Pipe()
    p = ctx.Process(target=consumer_main, args=(child_end,), name="consumer", daemon=True)
    p.start()
    RUNNING.consumer, RUNNING.consumer_pipe = p, parent_end
    if not parent_end.poll(30):
        raise RuntimeError("the consumer process did not start")
    tag, port = parent_end.recv()
    assert tag == "port"
    return parent_end, int(port)


def consumer_count(pipe: Any, phase: int) -> tuple[int, int]:
    """(distinct, total) notifications of `phase` received so far."""
    pipe.send(("count", phase))
    result: tuple[int, int] = pipe.recv()
    return result


def wait_received(
    pipe: Any, phase: int, expected: int, *, first_timeout: float, idle: float, limit: float
) -> tuple[int, float]:
    """Wait until `expected` distinct messages of `phase` arrived or progress stops."""
    start = last_change = time.time()
    last_seen = -1
    while True:
        unique, _total = consumer_count(pipe, phase)
        now = time.time()
        if unique != last_seen:
            last_seen, last_change = unique, now
        if unique >= expected:
            return unique, now - start
        quiet = now - last_change
        if (unique == 0 and quiet > first_timeout) or (unique > 0 and quiet > idle):
            return unique, now - start
        if now - start > limit:
            return unique, now - start
        time.sleep(0.1)


def subscribe(plat: Platform, consumer_url: str) -> str:
    url = plat.base_url + "/wsn/"
    status, body = http(url, (SUBSCRIBE_TEMPLATE % (url, consumer_url)).encode(), SUBSCRIBE_CT)
    m = re.search(rb"<wsa:Address>([^<]+)</wsa:Address>", body)
    if status != 200 or not m:
        raise RuntimeError(f"Subscribe failed: HTTP {status} {body[:500]!r}")
    return m.group(1).decode()


# ============================================================================ profiling


def start_profilers(
    children: list[Child], out: Path, duration: float, tag: str
) -> list[tuple[str, Path]]:
    """py-spy record (raw collapsed stacks) of each child's process tree for `duration` s."""
    pyspy = BIN / "py-spy"
    if not pyspy.exists():
        found = shutil.which("py-spy")
        if not found:
            log("py-spy not found (.venv/bin/pip install py-spy); no profile")
            return []
        pyspy = Path(found)
    out.mkdir(parents=True, exist_ok=True)
    targets = []
    for c in children:
        raw = out / f"{c.name}-{tag}.txt"
        cmd = [str(pyspy), "record", "--nonblocking", "--subprocesses", "-r", "97"]
        cmd += ["-d", str(int(duration)), "-f", "raw", "-o", str(raw), "--pid", str(c.pid)]
        with open(out / f"{c.name}-{tag}.py-spy.log", "wb") as err:
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        RUNNING.profilers.append(p)
        targets.append((f"{c.name} during {tag}", raw))
    return targets


def wait_profilers() -> None:
    for p in RUNNING.profilers:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.terminate()
            p.wait(5)
    RUNNING.profilers.clear()


_FRAME_RE = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")
# Leaves where a thread is blocked rather than running Python (py-spy's idle detection misses
# some of them). The event loop blocked in Thread.start is a real cost: it serialises requests.
_WAITS = (
    "_worker (concurrent/futures/thread.py)",  # an executor thread waiting for work
    "Condition.wait (threading.py)",
    "Thread._wait_for_tstate_lock (threading.py)",
    "_epoll.poll (kombu/utils/eventio.py)",
    "Connection._recv (billiard/connection.py)",
    "SyncStream.read (httpcore/_backends/sync.py)",
    "_HiredisParser.read_from_socket (redis/_parsers/hiredis.py)",
)
_LIBS = (
    "django/", "asgiref/", "redis/", "kombu/", "celery/", "billiard/", "httpx/", "httpcore/",
    "uvicorn/protocols", "hpwsn/", "hpwsn_site/", "dispatch/", "subscriptions/", "topics/",
)  # fmt: skip
_BOOT = (  # process start-up frames at the root of every stack: no information
    "celery/bin/", "celery/bootsteps", "celery/__main__", "celery/worker/worker.py",
    "celery/concurrency/", "billiard/process.py", "billiard/popen_fork.py", "billiard/context.py",
    "billiard/pool.py",
)  # fmt: skip


def _frame_name(frame: str) -> tuple[str, str]:
    """("func (file)", file) of a py-spy frame."""
    m = _FRAME_RE.match(frame.strip())
    if not m:
        return frame.strip(), ""
    path = m.group("file")
    for marker in ("site-packages/", "lib/python3.11/", "lib/python3/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{m.group('func')} ({path})", path


def _package(path: str) -> str:
    if not path:
        return "?"
    head = path.split("/", 1)[0]
    return head if "/" in path else f"{head} (stdlib/other)"


def summarise_profile(raw: Path, top: int = 15) -> dict[str, Any]:
    """Where the samples of a py-spy raw (collapsed) profile go: self, inclusive, by package."""
    self_t: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    by_pkg: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    if not raw.exists():
        return {"samples": 0, "self": [], "inclusive": [], "packages": [], "threads": {}}
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        parts = stack.split(";")
        pid = parts[0].split(":", 1)[0] if parts[0].startswith("process ") else "process ?"
        frames = [_frame_name(f) for f in parts if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        leaf, leaf_path = frames[-1]
        self_t[leaf] += count
        by_pkg[_package(leaf_path)] += count
        root = frames[0][0]
        kind = "helper threads" if root.startswith("Thread._bootstrap") else "main thread"
        threads[f"{pid} {kind}"] += count
        for name in {n for n, p in frames if p.startswith(_LIBS) and not p.startswith(_BOOT)}:
            incl[name] += count

    def rows(c: Counter[str], n: int = top) -> list[tuple[str, int, float]]:
        return [(name, k, round(100.0 * k / total, 1)) for name, k in c.most_common(n)]

    return {
        "samples": total,
        "threads": {k: round(100.0 * v / total, 1) for k, v in threads.items()},
        "self": [(f"{n} [wait]" if n in _WAITS else n, k, pct) for n, k, pct in rows(self_t)],
        "inclusive": rows(incl, 25),
        "packages": rows(by_pkg, 12),
    }


def print_profile(name: str, raw: Path, summary: dict[str, Any]) -> None:
    print(f"\nprofile of {name}: {summary['samples']} samples ({raw})")
    print("  samples by process/thread: ", end="")
    print(", ".join(f"{k} {v}%" for k, v in sorted(summary["threads"].items())))
    print("  self time by package: " + ", ".join(f"{n} {p}%" for n, _k, p in summary["packages"]))
    print("  self (leaf functions):")
    for fn, _n, pct in summary["self"][:12]:
        print(f"    {pct:5.1f}%  {fn}")
    print("  inclusive (project, django, asgiref, redis, celery/kombu/billiard, httpx frames):")
    for fn, _n, pct in summary["inclusive"][:22]:
        print(f"    {pct:5.1f}%  {fn}")


# ============================================================================ measurement


@dataclass
class Row:
    phase: str
    msgs: int
    secs: float
    latencies_ms: list[float]

    @property
    def rate(self) -> float:
        return self.msgs / self.secs if self.secs > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        lat = self.latencies_ms
        return {
            "phase": self.phase,
            "msgs": self.msgs,
            "secs": round(self.secs, 3),
            "msgs_per_s": round(self.rate, 1),
            "p50_ms": _r(percentile(lat, 50)),
            "p95_ms": _r(percentile(lat, 95)),
            "p99_ms": _r(percentile(lat, 99)),
            "max_ms": _r(lat[-1] if lat else None),
        }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


class CpuMeter:
    """CPU seconds used by each component between start() and stop()."""

    def __init__(self, plat: Platform) -> None:
        self.plat = plat
        self.before: dict[str, float] = {}
        self.t0 = 0.0

    def _sample(self) -> dict[str, float]:
        p = self.plat
        out = {c.name: cpu_seconds(group_pids(c.pid)) for c in (p.web, p.worker, p.beat, p.redis)}
        pubs = [m.pid for m in RUNNING.mp_children if m.pid]
        out["publisher"] = cpu_seconds(pubs)
        if RUNNING.consumer is not None:
            out["consumer"] = cpu_seconds([RUNNING.consumer.pid])
        # The whole machine (/proc/stat): busy and stolen time, in CPU seconds.
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
            tck = os.sysconf("SC_CLK_TCK")
            # user nice system idle iowait irq softirq steal
            out["_busy"] = (sum(fields[:3]) + fields[5] + fields[6]) / tck
            out["_steal"] = fields[7] / tck
        return out

    def start(self) -> None:
        self.before, self.t0 = self._sample(), time.time()

    def stop(self) -> dict[str, float]:
        after, wall = self._sample(), time.time() - self.t0
        pct = {k: round(100 * (after[k] - self.before.get(k, 0.0)) / wall, 1) for k in after}
        busy, steal = pct.pop("_busy", None), pct.pop("_steal", None)
        if busy is not None:
            # Busy time of processes this run did not start (other programs, the kernel, ...).
            pct["other"] = round(max(0.0, busy - sum(pct.values())), 1)
        if steal:
            pct["steal"] = steal
        return pct


def run_publish_with_cpu(
    plat: Platform, url: str, phase: int, duration: float, args: argparse.Namespace
) -> tuple[PublishResult, dict[str, float]]:
    """Publish; CPU is sampled from shortly after the start to shortly before the end."""
    meter = CpuMeter(plat)
    result: dict[str, Any] = {}

    import threading

    def sample() -> None:
        time.sleep(min(1.0, duration / 4) + 0.5)  # publishers forked, connected and running
        meter.start()
        result["connections"] = web_connections(plat)
        time.sleep(max(0.5, duration - min(1.0, duration / 4) - 1.0))
        result["cpu"] = meter.stop()

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    res = publish(url, phase=phase, duration=duration, args=args, base_url=plat.base_url)
    t.join()
    cpu = result.get("cpu", {})
    conns = result.get("connections", {})
    if len(conns) > 1:  # uvicorn --workers: a supervisor and its workers
        cpu["_connections"] = sorted((n for n in conns.values() if n), reverse=True)
    return res, cpu


def _commands_per_notification(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], notifications: int
) -> dict[str, tuple[float, float]]:
    """Redis's commands in a phase by name (commands run by scripts included): calls and µs of
    Redis's time a notification, most calls first."""
    rows = {}
    for name, (calls, usec) in after.items():
        calls0, usec0 = before.get(name, (0, 0))
        if calls > calls0:
            n = max(notifications, 1)
            rows[name] = (round((calls - calls0) / n, 2), round((usec - usec0) / n, 2))
    return dict(sorted(rows.items(), key=lambda kv: -kv[1][0]))


def redis_info(plat: Platform) -> dict[str, Any]:
    import redis

    r = redis.Redis(port=plat.redis_port)
    try:
        stats = {k.decode(): int(v) for k, v in r.hgetall("hpwsn:stats").items()}
        queues = {k.decode(): r.llen(k) for k in r.scan_iter(match="hpwsn:q:*")}
        info = r.info("clients") | r.info("stats")
        by_command = {
            name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for name, v in r.info("commandstats").items()
        }
        return {
            "commands": by_command,
            "stats": stats,
            "connected_clients": info.get("connected_clients"),
            "total_connections_received": info.get("total_connections_received"),
            "total_commands_processed": info.get("total_commands_processed"),
            "ingest_backlog": r.llen("hpwsn:ingest"),
            "subscription_queues": queues,
            "retry_zset": r.zcard("hpwsn:retry"),
            "celery_queue": r.llen("celery"),
        }
    finally:
        r.close()


def scan_logs(plat: Platform) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pat = re.compile(r"\b(ERROR|CRITICAL|Traceback|WARNING)\b")
    for c in (plat.web, plat.worker, plat.beat):
        text = c.log_path.read_text(errors="replace") if c.log_path.exists() else ""
        lines = text.splitlines()
        hits = [ln for ln in lines if pat.search(ln)]
        kinds = Counter(m.group(1) for ln in hits if (m := pat.search(ln)))
        out[c.name] = {"lines": len(lines), "problems": dict(kinds), "first": hits[:8]}
    return out


def print_table(rows: list[Row], ratio: float | None) -> None:
    print()
    print(f"{'phase':<28}{'msgs':>9}{'secs':>9}{'msgs/s':>10}{'p50 ms':>9}{'p95 ms':>9}", end="")
    print(f"{'p99 ms':>9}{'max ms':>9}")
    for row in rows:
        d = row.as_dict()

        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"

        print(
            f"{row.phase:<28}{row.msgs:>9}{row.secs:>9.2f}{row.rate:>10.1f}"
            f"{f(d['p50_ms']):>9}{f(d['p95_ms']):>9}{f(d['p99_ms']):>9}{f(d['max_ms']):>9}"
        )
    print(f"{'ratio e2e/ceiling':<28}{'-' if ratio is None else f'{ratio:.2f}':>9}")


def measure(plat: Platform, args: argparse.Namespace, report: dict[str, Any]) -> None:
    wsn_url = plat.base_url + "/wsn/"
    echo_url = plat.base_url + "/bench/echo/"

    # ------------------------------------------------------------- checks and pipeline probe
    status, body = http(
        echo_url, notify_body(echo_url, PHASE_PROBE, range(1), time.time()), NOTIFY_CT
    )
    if status == 404:
        raise RuntimeError(
            "/bench/echo/ is not served: the server must route it when HPWSN_BENCH_ENDPOINTS=1 "
            "(hpwsn_site/fastpath.py)"
        )
    if status != 202:
        raise RuntimeError(f"/bench/echo/ answered {status}: {body[:300]!r}")

    pipe, cport = start_consumer()
    consumer_url = f"http://127.0.0.1:{cport}/consumer"
    sub_ref = subscribe(plat, consumer_url)
    log(f"consumer on {consumer_url}, subscribed to '{SUBSCRIBE_TOPIC}': {sub_ref}")
    log("probing the pipeline (the worker may still be starting)")
    for seq in range(10):
        status, body = http(
            wsn_url,
            notify_body(wsn_url, PHASE_PROBE, range(seq, seq + 1), time.time()),
            NOTIFY_CT,
        )
        if status != 202:
            raise RuntimeError(f"Notify on /wsn/ answered {status}: {body[:500]!r}")
    got, secs = wait_received(pipe, PHASE_PROBE, 10, first_timeout=90, idle=30, limit=120)
    if got < 10:
        raise RuntimeError(f"the pipeline delivered {got}/10 probe notifications in {secs:.0f} s")
    log(f"pipeline up (probe delivered in {secs:.1f} s)")
    time.sleep(1.0)

    # ------------------------------------------------------------- (a) ceiling
    log(f"ceiling: warm-up {args.warmup:g} s")
    publish(echo_url, phase=PHASE_WARMUP, duration=args.warmup, args=args, base_url=plat.base_url)
    log(f"ceiling: {args.duration:g} s against /bench/echo/")
    check_alive(plat)
    profiles: list[tuple[str, Path]] = []
    if args.profile:
        profiles += start_profilers([plat.web], Path(args.profile), args.duration, "ceiling")
    ceil, ceil_cpu = run_publish_with_cpu(plat, echo_url, PHASE_MEASURE, args.duration, args)
    ceiling = Row(
        "ceiling (echo)",
        ceil.ok,
        ceil.last_done - ceil.first_send,
        [x * 1000 for x in ceil.latencies],
    )
    report["ceiling"] = {
        **ceiling.as_dict(),
        "errors": dict(ceil.errors),
        "error_samples": ceil.error_samples,
        "cpu_percent": ceil_cpu,
    }
    log(f"ceiling: {ceiling.rate:.0f} msgs/s, errors {dict(ceil.errors) or 0}")
    wait_profilers()

    # ------------------------------------------------------------- (b) end to end
    log(f"end-to-end: warm-up {args.warmup:g} s")
    warm = publish(
        wsn_url, phase=PHASE_WARMUP, duration=args.warmup, args=args, base_url=plat.base_url
    )
    got, secs = wait_received(
        pipe,
        PHASE_WARMUP,
        warm.ok,
        first_timeout=60,
        idle=args.drain_idle,
        limit=args.drain_timeout,
    )
    log(f"end-to-end: warm-up {warm.ok} sent, {got} received (drained in {secs:.1f} s)")
    time.sleep(1.0)
    check_alive(plat)
    redis_before = redis_info(plat)

    if args.profile:
        profiles += start_profilers(
            [plat.web, plat.worker], Path(args.profile), args.duration, "end-to-end"
        )
    log(f"end-to-end: {args.duration:g} s against /wsn/")
    pub, e2e_cpu = run_publish_with_cpu(plat, wsn_url, PHASE_MEASURE, args.duration, args)
    at_pub_end, _total = consumer_count(pipe, PHASE_MEASURE)
    backlog = redis_info(plat)
    log(f"end-to-end: {pub.ok} accepted, {at_pub_end} received by the end of publishing; draining")
    got, drain_secs = wait_received(
        pipe,
        PHASE_MEASURE,
        pub.ok,
        first_timeout=60,
        idle=args.drain_idle,
        limit=args.drain_timeout,
    )
    time.sleep(args.grace)  # late duplicates
    redis_after = redis_info(plat)
    pipe.send(("collect", PHASE_MEASURE))
    data = pipe.recv()
    wait_profilers()

    seqs, sent, recv = array.array("q"), array.array("d"), array.array("d")
    seqs.frombytes(data["seqs"])
    sent.frombytes(data["sent"])
    recv.frombytes(data["recv"])
    accepted = set(pub.ok_seqs)
    counts = Counter(seqs)
    unique = len(counts)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    missing = sorted(accepted.difference(counts))
    unexpected = sorted(set(counts).difference(accepted))  # e.g. answered with an error/timeout
    last_recv = max(recv) if recv else pub.first_send
    e2e_lat = sorted((r - s) * 1000 for r, s in zip(recv, sent, strict=True))
    label = "end-to-end" if not missing else "end-to-end (INCOMPLETE)"
    e2e = Row(label, unique, last_recv - pub.first_send, e2e_lat)
    accept = Row(
        "  publish accept (/wsn/)",
        pub.ok,
        pub.last_done - pub.first_send,
        [x * 1000 for x in pub.latencies],
    )
    ratio = e2e.rate / ceiling.rate if ceiling.rate else None
    in_window = sum(1 for r in recv if r <= pub.last_done)
    report["end_to_end"] = {
        **e2e.as_dict(),
        "accepted": pub.ok,
        "received_unique": unique,
        "received_total": len(seqs),
        "missing": len(missing),
        "missing_sample": missing[:20],
        "duplicates": duplicates,
        "unexpected": len(unexpected),
        "received_by_publish_end": at_pub_end,
        "delivered_rate_while_publishing": round(in_window / max(accept.secs, 1e-9), 1),
        "drain_secs": round(drain_secs, 2),
        "publish_errors": dict(pub.errors),
        "publish_error_samples": pub.error_samples,
        "cpu_percent": e2e_cpu,
        "redis_at_publish_end": backlog,
        "consumer": data["totals"],
        "redis_commands_per_notification": round(
            (redis_after["total_commands_processed"] - redis_before["total_commands_processed"])
            / max(pub.ok, 1),
            1,
        ),
    }
    report["end_to_end"]["redis_commands_by_name"] = _commands_per_notification(
        redis_before["commands"], redis_after["commands"], pub.ok
    )
    report["publish_accept"] = accept.as_dict()
    report["ratio_e2e_ceiling"] = None if ratio is None else round(ratio, 3)
    report["redis_at_end"] = redis_after
    report["logs"] = scan_logs(plat)
    check_alive(plat)
    comparison = None
    if args.monitoring_compare:
        server_cpu = sum(v for k, v in e2e_cpu.items() if k in ("web", "worker", "beat", "redis"))
        first_on = {
            "monitoring": True,
            "rate": e2e.rate,
            "row": e2e,
            "missing": len(missing),
            "cpu_ms_per_msg": 10 * server_cpu / accept.rate if accept.rate else None,
        }
        comparison = compare_monitoring(plat, pipe, args, first_on)
        report["monitoring_overhead"] = {
            k: v for k, v in comparison.items() if k not in ("runs",)
        } | {"runs": [{k: v for k, v in r.items() if k != "row"} for r in comparison["runs"]]}

    events_cost = None
    if args.events_compare:
        server_cpu = sum(v for k, v in e2e_cpu.items() if k in ("web", "worker", "beat", "redis"))
        events_cost = compare_events(
            plat,
            pipe,
            args,
            {
                "events": True,
                "rate": e2e.rate,
                "row": e2e,
                "missing": len(missing),
                "cpu_ms_per_msg": 10 * server_cpu / accept.rate if accept.rate else None,
            },
        )
        report["events_overhead"] = {k: v for k, v in events_cost.items() if k != "runs"}

    other_row = None
    if args.compare_reliability:
        other = "fast" if args.reliability == "reliable" else "reliable"
        set_reliability(plat.env, other)
        time.sleep(2.0)  # every process reloads the tree within a second
        log(f"end-to-end, {other}: {args.duration:g} s against /wsn/")
        result = e2e_round(plat, pipe, args, warm_phase=200, phase=201)
        set_reliability(plat.env, args.reliability)
        other_row = result["row"]
        other_row.phase = f"end-to-end ({other})"
        report["end_to_end_" + other] = {
            **other_row.as_dict(),
            "missing": result["missing"],
            "duplicates": result["duplicates"],
            "cpu_ms_per_msg": result["cpu_ms_per_msg"],
        }

    rest_rows: list[Row] = []
    if args.rest:
        rest_rows = rest_rounds(plat, pipe, args, report, soap_rate=e2e.rate)

    # ------------------------------------------------------------- report
    e2e.phase = f"{e2e.phase} ({args.reliability})"
    print_table([ceiling, e2e, accept] + ([other_row] if other_row else []) + rest_rows, ratio)
    if args.rest:
        rest = report["rest"]
        print(
            f"REST / SOAP end to end, same run: {rest['ratio_rest_soap']} (SOAP {e2e.rate:.0f}/s, "
            f"then REST {rest['msgs_per_s']:.0f}/s, "
            f"then SOAP again {rest['soap_again_rate']:.0f}/s)"
        )
    print(
        f"missing {len(missing)}, duplicates {duplicates}"
        + (f", unexpected {len(unexpected)}" if unexpected else "")
        + f"  (accepted {pub.ok}, received {unique} distinct / {len(seqs)} total)"
    )
    if pub.errors or ceil.errors:
        print(f"publish errors: ceiling {dict(ceil.errors)}, e2e {dict(pub.errors)}")
        for s in (ceil.error_samples + pub.error_samples)[:5]:
            print(f"  {s}")
    totals = data["totals"]
    print(
        f"delivery: {at_pub_end} received by the end of publishing "
        f"({report['end_to_end']['delivered_rate_while_publishing']:.0f}/s while publishing), "
        f"drain {drain_secs:.1f} s; consumer got {totals['posts']} POSTs, "
        f"{totals['notifications'] / max(totals['posts'], 1):.1f} msgs/POST "
        f"(max {totals['max_batch']})"
    )
    print(f"redis at the end of publishing: ingest backlog {backlog['ingest_backlog']}, ", end="")
    print(f"subscription queue(s) {sum(backlog['subscription_queues'].values())}, ", end="")
    print(f"celery queue {backlog['celery_queue']}")
    end = report["redis_at_end"]
    print(f"broker counters at the end: {end['stats']}")
    print(
        f"redis: {end['connected_clients']} clients connected at the end, "
        f"{end['total_connections_received']} connections and "
        f"{end['total_commands_processed']} commands since start; "
        f"{report['end_to_end']['redis_commands_per_notification']} commands per notification "
        "in the end-to-end phase (web + worker + beat)"
    )
    top = list(report["end_to_end"]["redis_commands_by_name"].items())[:10]
    print(
        "  by name (calls / µs of Redis a notification, scripts' commands included): "
        + ", ".join(f"{name} {calls:g} / {usec:g}" for name, (calls, usec) in top)
    )
    for name, cpu, rate in (
        ("ceiling", ceil_cpu, ceiling.rate),
        ("end-to-end", e2e_cpu, accept.rate),
    ):
        conns = cpu.pop("_connections", None)
        parts = ", ".join(f"{k} {v:.0f}%" for k, v in cpu.items())
        used = sum(v for k, v in cpu.items() if k != "steal")
        print(f"CPU during {name}: {parts}  (busy {used:.0f}% of {os.cpu_count()}00%)")
        if rate:
            per = {k: round(10 * v / rate, 2) for k, v in cpu.items() if k not in ("steal",)}
            report["ceiling" if name == "ceiling" else "end_to_end"]["cpu_ms_per_msg"] = per
            print(
                "  CPU ms per notification: "
                + ", ".join(f"{k} {v:.2f}" for k, v in per.items() if v >= 0.01)
            )
        if conns:
            report["ceiling" if name == "ceiling" else "end_to_end"]["web_connections"] = conns
            print(f"  publisher connections per web worker process: {conns}")
    pub_cpu = ceil_cpu.get("publisher", 0.0) / max(args.publisher_procs, 1)
    if pub_cpu >= 90:
        print(
            f"note: each publisher process used {pub_cpu:.0f}% CPU during the ceiling: the ceiling "
            "is bounded by the client (compare the web's CPU ms per notification instead)"
        )
    for name, info in report["logs"].items():
        if info["problems"]:
            print(f"{name} log: {info['problems']}")
            for ln in info["first"][:4]:
                print(f"  {ln[:200]}")
    if comparison is not None:
        print_comparison(comparison)
    if events_cost is not None:
        print_events_cost(events_cost)
    if profiles:
        for name, raw in profiles:
            summary = summarise_profile(raw)
            report.setdefault("profile", {})[name] = summary
            print_profile(name, raw, summary)


def e2e_round(
    plat: Platform,
    pipe: Any,
    args: argparse.Namespace,
    *,
    warm_phase: int,
    phase: int,
    path: str = "/wsn/",
    profile_tag: str = "",
) -> dict[str, Any]:
    """One warmed-up end-to-end phase on the running platform: rate, latency, exactly-once, CPU.

    With --profile and a `profile_tag`, py-spy records the web and the worker during the phase."""
    wsn_url = plat.base_url + path
    warm = publish(
        wsn_url, phase=warm_phase, duration=args.warmup, args=args, base_url=plat.base_url
    )
    wait_received(
        pipe, warm_phase, warm.ok, first_timeout=60, idle=args.drain_idle, limit=args.drain_timeout
    )
    pipe.send(("collect", warm_phase))
    pipe.recv()
    time.sleep(1.0)
    check_alive(plat)
    profiles: list[tuple[str, Path]] = []
    if args.profile and profile_tag:
        profiles = start_profilers(
            [plat.web, plat.worker], Path(args.profile), args.duration, profile_tag
        )
    pub, cpu = run_publish_with_cpu(plat, wsn_url, phase, args.duration, args)
    wait_received(
        pipe, phase, pub.ok, first_timeout=60, idle=args.drain_idle, limit=args.drain_timeout
    )
    wait_profilers()
    time.sleep(args.grace)
    pipe.send(("collect", phase))
    data = pipe.recv()
    seqs, sent, recv = array.array("q"), array.array("d"), array.array("d")
    seqs.frombytes(data["seqs"])
    sent.frombytes(data["sent"])
    recv.frombytes(data["recv"])
    counts = Counter(seqs)
    missing = len(set(pub.ok_seqs).difference(counts))
    last_recv = max(recv) if recv else pub.first_send
    lat = sorted((r - s) * 1000 for r, s in zip(recv, sent, strict=True))
    row = Row("end-to-end", len(counts), last_recv - pub.first_send, lat)
    accept_rate = pub.ok / max(pub.last_done - pub.first_send, 1e-9)
    cpu.pop("_connections", None)
    server_cpu = sum(v for k, v in cpu.items() if k in ("web", "worker", "beat", "redis"))
    return {
        "rate": row.rate,
        "row": row,
        "missing": missing,
        "duplicates": sum(n - 1 for n in counts.values() if n > 1),
        "cpu_percent": cpu,
        "cpu_ms_per_msg": 10 * server_cpu / accept_rate if accept_rate else None,
        "profiles": profiles,
    }


def rest_token(plat: Platform) -> str:
    """An API token of a local account (the benchmark runs without a directory)."""
    code = (
        "from django.contrib.auth import get_user_model; "
        "from hpwsn_site.api.services import api_token_create; "
        "get_user_model().objects.get_or_create(username='bench-publisher'); "
        "print(api_token_create(principal='bench-publisher', name='bench').token)"
    )
    out = subprocess.run(
        [str(BIN / "python"), "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=plat.env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.strip().splitlines()[-1]


def rest_rounds(
    plat: Platform, pipe: Any, args: argparse.Namespace, report: dict[str, Any], *, soap_rate: float
) -> list[Row]:
    """End to end with REST publishes (token auth), then SOAP again: SOAP, REST, SOAP in one run,
    so that a drift of the machine shows instead of passing for a difference."""
    args.rest_token = rest_token(plat)
    log(f"end-to-end, REST: {args.duration:g} s against {REST_PATH}")
    rest = e2e_round(
        plat, pipe, args, warm_phase=300, phase=301, path=REST_PATH, profile_tag="rest"
    )
    log(f"end-to-end, SOAP again: {args.duration:g} s against /wsn/")
    again = e2e_round(plat, pipe, args, warm_phase=302, phase=303)
    soap_mean = (soap_rate + again["rate"]) / 2
    row = rest["row"]
    row.phase = f"end-to-end REST ({args.reliability})"
    again["row"].phase = f"end-to-end SOAP again ({args.reliability})"
    report["rest"] = {
        **row.as_dict(),
        "missing": rest["missing"],
        "duplicates": rest["duplicates"],
        "cpu_ms_per_msg": rest["cpu_ms_per_msg"],
        "soap_again_rate": round(again["rate"], 1),
        "ratio_rest_soap": round(rest["rate"] / soap_mean, 3) if soap_mean else None,
    }
    for name, raw in rest["profiles"]:
        summary = summarise_profile(raw)
        report.setdefault("profile", {})[name] = summary
        print_profile(name, raw, summary)
    return [row, again["row"]]


def compare_monitoring(
    plat: Platform, pipe: Any, args: argparse.Namespace, first_on: dict[str, Any]
) -> dict[str, Any]:
    """End to end with monitoring off next to on, in the same run: ABBA order over
    --monitoring-rounds pairs (on off | off on | ...), so a drift of the machine cancels out."""
    runs = [first_on]
    order = [False]
    for i in range(1, args.monitoring_rounds):
        order += [False, True] if i % 2 else [True, False]
    current = True
    for n, monitoring in enumerate(order):
        if monitoring != current:
            log(f"restarting web, worker and beat with HPWSN_MONITORING={int(monitoring)}")
            restart_apps(plat, args, monitoring=monitoring)
            current = monitoring
        label = "on" if monitoring else "off"
        log(f"end-to-end, monitoring {label}: {args.duration:g} s against /wsn/")
        result = e2e_round(plat, pipe, args, warm_phase=100 + 2 * n, phase=101 + 2 * n)
        result["monitoring"] = monitoring
        log(f"end-to-end, monitoring {label}: {result['rate']:.0f} msgs/s")
        runs.append(result)
    if not current:
        restart_apps(plat, args, monitoring=True)  # leave the platform as it started

    def mean(key: str, on: bool) -> float | None:
        values = [r[key] for r in runs if r["monitoring"] == on and r.get(key) is not None]
        return sum(values) / len(values) if values else None

    rate_on, rate_off = mean("rate", True), mean("rate", False)
    cpu_on, cpu_off = mean("cpu_ms_per_msg", True), mean("cpu_ms_per_msg", False)
    return {
        "runs": runs,
        "rate_on": rate_on,
        "rate_off": rate_off,
        "throughput_overhead_percent": (
            round(100 * (rate_off - rate_on) / rate_off, 2) if rate_on and rate_off else None
        ),
        "cpu_ms_per_msg_on": cpu_on,
        "cpu_ms_per_msg_off": cpu_off,
        "cpu_overhead_percent": (
            round(100 * (cpu_on - cpu_off) / cpu_off, 2) if cpu_on and cpu_off else None
        ),
        "missing": sum(r["missing"] for r in runs),
    }


def compare_events(
    plat: Platform, pipe: Any, args: argparse.Namespace, first_on: dict[str, Any]
) -> dict[str, Any]:
    """End to end with the analytics event log off, next to the first run (on), in the same run;
    the platform is left with it on again."""
    log("restarting web, worker and beat with HPWSN_EVENTS=0")
    restart_apps(plat, args, monitoring=True, events=False)
    log(f"end-to-end, event log off: {args.duration:g} s against /wsn/")
    off = e2e_round(plat, pipe, args, warm_phase=300, phase=301)
    off["events"] = False
    log(f"end-to-end, event log off: {off['rate']:.0f} msgs/s")
    restart_apps(plat, args, monitoring=True, events=True)
    on_rate, off_rate = first_on["rate"], off["rate"]
    on_cpu, off_cpu = first_on.get("cpu_ms_per_msg"), off.get("cpu_ms_per_msg")
    return {
        "runs": [first_on, off],
        "rate_on": on_rate,
        "rate_off": off_rate,
        "throughput_overhead_percent": (
            round(100 * (off_rate - on_rate) / off_rate, 2) if on_rate and off_rate else None
        ),
        "cpu_ms_per_msg_on": on_cpu,
        "cpu_ms_per_msg_off": off_cpu,
        "cpu_overhead_percent": (
            round(100 * (on_cpu - off_cpu) / off_cpu, 2) if on_cpu and off_cpu else None
        ),
        "missing": first_on["missing"] + off["missing"],
    }


def print_events_cost(c: dict[str, Any]) -> None:
    print("\nevent log cost (end to end, same run, web/worker/beat restarted between modes):")
    for r in c["runs"]:
        d = r["row"].as_dict()
        cpu = "-" if r.get("cpu_ms_per_msg") is None else f"{r['cpu_ms_per_msg']:.3f}"
        label = f"event log {'on' if r['events'] else 'off'}" + (
            " INCOMPLETE" if r["missing"] else ""
        )
        print(
            f"{label:<26}{d['msgs']:>9}{d['msgs_per_s']:>10.1f}{d['p50_ms'] or 0:>9.1f}"
            f"{d['p99_ms'] or 0:>9.1f}{cpu:>16}"
        )
    if c["throughput_overhead_percent"] is not None:
        print(
            f"rate: on {c['rate_on']:.1f}/s, off {c['rate_off']:.1f}/s: "
            f"throughput overhead {c['throughput_overhead_percent']:+.2f}% (goal < 3%)"
        )


def print_comparison(c: dict[str, Any]) -> None:
    print("\nmonitoring overhead (end to end, same run, web/worker/beat restarted between modes):")
    print(f"{'run':<26}{'msgs':>9}{'msgs/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'srv CPU ms/msg':>16}")
    for i, r in enumerate(c["runs"]):
        d = r["row"].as_dict()
        cpu = "-" if r.get("cpu_ms_per_msg") is None else f"{r['cpu_ms_per_msg']:.3f}"
        label = f"{i + 1}. monitoring {'on' if r['monitoring'] else 'off'}"
        if r["missing"]:
            label += " INCOMPLETE"
        print(
            f"{label:<26}{d['msgs']:>9}{d['msgs_per_s']:>10.1f}{d['p50_ms'] or 0:>9.1f}"
            f"{d['p99_ms'] or 0:>9.1f}{cpu:>16}"
        )
    if c["throughput_overhead_percent"] is not None:
        print(
            f"mean rate: on {c['rate_on']:.1f}/s, off {c['rate_off']:.1f}/s: "
            f"throughput overhead {c['throughput_overhead_percent']:+.2f}% (goal < 5%)"
        )
    if c["cpu_overhead_percent"] is not None:
        print(
            f"server CPU per notification (web+worker+beat+redis): on {c['cpu_ms_per_msg_on']:.3f}"
            f" ms, off {c['cpu_ms_per_msg_off']:.3f} ms: {c['cpu_overhead_percent']:+.2f}%"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=20.0, help="seconds per measured phase")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per phase")
    p.add_argument("--publishers-concurrency", type=int, default=32, help="in-flight requests")
    p.add_argument("--publisher-procs", type=int, default=1, help="publisher processes")
    p.add_argument(
        "--rate", type=float, default=0.0, help="open loop: total Notify/s (0: as fast as possible)"
    )
    p.add_argument(
        "--web-workers", type=int, default=int(env.get("HPWSN_WEB_WORKERS") or 1), help="uvicorn"
    )
    p.add_argument(
        "--worker-concurrency",
        type=int,
        default=int(env.get("HPWSN_WORKER_CONCURRENCY") or 2),
        help="celery worker -c",
    )
    p.add_argument(
        "--messages-per-notify",
        type=int,
        default=1,
        help="NotificationMessages per Notify request (1: the standard case)",
    )
    p.add_argument("--database-url", default="", help="PostgreSQL instead of SQLite (recreated)")
    p.add_argument(
        "--reliability",
        choices=("reliable", "fast"),
        default="reliable",
        help="policy of the published topic (reliable: committed to the database before 202)",
    )
    p.add_argument(
        "--compare-reliability",
        action="store_true",
        help="also run end to end with the other reliability, in the same run",
    )
    p.add_argument(
        "--rest",
        action="store_true",
        help="also run end to end publishing over REST (POST /api/v1/topics/.../messages, an "
        "API token), then SOAP again, in the same run",
    )
    p.add_argument("--json", default="", help="write the figures to this file")
    p.add_argument("--profile", default="", help="py-spy the web and worker into this directory")
    p.add_argument("--drain-idle", type=float, default=15.0, help="give up after s w/o progress")
    p.add_argument("--drain-timeout", type=float, default=300.0, help="give up draining after s")
    p.add_argument("--grace", type=float, default=2.0, help="wait for late duplicates (s)")
    p.add_argument("--keep", action="store_true", help="keep the temporary data dir and logs")
    p.add_argument(
        "--no-monitoring-compare",
        dest="monitoring_compare",
        action="store_false",
        help="skip the end-to-end run with HPWSN_MONITORING=0",
    )
    p.add_argument(
        "--no-events-compare",
        dest="events_compare",
        action="store_false",
        help="skip the end-to-end run with the analytics event log off (HPWSN_EVENTS=0)",
    )
    p.add_argument(
        "--monitoring-rounds",
        type=int,
        default=1,
        help="on/off pairs for the monitoring overhead (ABBA order; 1: on, off)",
    )
    return p.parse_args(argv)


def run_benchmark(
    args: argparse.Namespace,
    config: dict[str, Any],
    measure_fn: Callable[[Platform, argparse.Namespace, dict[str, Any]], None],
    *,
    prefix: str,
) -> int:
    """Start a private platform, measure, stop everything and write the JSON: shared by every
    benchmark here. Returns the exit status."""

    def on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    # Even when started in the background by a shell that ignores SIGINT, ^C/kill -INT stops us.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)

    mach = machine()
    print(
        f"machine: nproc {mach['nproc']} ({mach['cpus_usable']} usable), {mach['cpu_model']}, "
        f"Python {mach['python']}, redis-server {mach['redis_server']}; "
        f"HPwsn {mach['revision'] or '?'}"
    )
    print("config: " + ", ".join(f"{k} {v}" for k, v in config.items()))
    report: dict[str, Any] = {"machine": mach, "config": config}

    data_dir = Path(tempfile.mkdtemp(prefix=prefix))
    rc = 1
    try:
        plat = start_platform(args, data_dir)
        report["config"]["server_settings"] = server_settings(plat)
        print(
            "server settings: "
            + ", ".join(f"{k} {v}" for k, v in report["config"]["server_settings"].items())
        )
        measure_fn(plat, args, report)
        rc = 0
    except KeyboardInterrupt:
        log("interrupted")
        rc = 130
    except Exception as exc:
        log(f"failed: {type(exc).__name__}: {exc}")
        args.keep = True
    finally:
        log("stopping everything this run started")
        cleanup()
        log("all stopped")
        if args.keep:
            log(f"data dir and logs kept in {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    if args.json and rc == 0:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
        log(f"figures written to {args.json}")
    return rc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = {
        "web_workers": args.web_workers,
        "worker_concurrency": args.worker_concurrency,
        "database": "PostgreSQL" if args.database_url else "SQLite (temporary)",
        "publisher_procs": args.publisher_procs,
        "publishers_concurrency": args.publishers_concurrency,
        "messages_per_notify": args.messages_per_notify,
        "rate": args.rate or "unlimited (closed loop)",
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "topic": TOPIC,
        "subscription": SUBSCRIBE_TOPIC,
    }
    return run_benchmark(args, config, measure, prefix="hpwsn-bench-")


if __name__ == "__main__":
    sys.exit(main())
