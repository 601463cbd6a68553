"""HPwsn beside RabbitMQ and Mosquitto on the same machine, the same job, in the same run.

One publisher process with 32 requests in flight, one message per request, a payload of about
1 KB, one consumer process; for --duration seconds (or --messages in all), through:

  reliable   HPwsn, SOAP Notify on /wsn/, topic policy `reliable` (committed before the 202),
             pushed to one subscribed consumer (bench/e2e.py's publisher and consumer)
  rabbitmq   RabbitMQ: a durable queue, persistent messages, publisher confirms (each publish
             waits for its confirm), consumer acknowledgements (aio-pika)
  fast       HPwsn, the same with topic policy `fast` (Redis only)
  mosquitto  Mosquitto: MQTT QoS 1 (each publish waits for its PUBACK; the consumer acknowledges
             each message) (aiomqtt)

in that order (each HPwsn path next to the peer it is compared with), each after a warm-up. Rate =
distinct messages received / (last receipt - first send); latency = receipt time at the consumer -
send time carried in the message. It prints a table with msgs/s, p50/p99 latency and the broker's
CPU per message, and the ratios HPwsn / peer. See bench/README.md.

    .venv/bin/python -m bench.peers [--duration 10 | --messages 20000] [--json out.json]

RabbitMQ (127.0.0.1:5672, guest/guest) and Mosquitto (127.0.0.1:1883) are installed with apt-get
when absent and started when not running (`scripts/lib.sh hp_ensure_peers`).
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import itertools
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import e2e
from bench.common import ROOT, cpu_seconds, group_pids, install_uvloop, log, percentile, pids_named

PATHS = ("reliable", "rabbitmq", "fast", "mosquitto")
PEER_OF = {"reliable": "rabbitmq", "fast": "mosquitto"}
GOALS = {"reliable": 1.2, "fast": 0.5}  # issue 13: HPwsn / peer, msgs/s
BROKER_PROCESSES = {"rabbitmq": ("beam.smp",), "mosquitto": ("mosquitto",)}
LABELS = {
    "reliable": "HPwsn reliable",
    "fast": "HPwsn fast",
    "rabbitmq": "RabbitMQ durable+confirms",
    "mosquitto": "Mosquitto MQTT QoS 1",
}


def ensure_peers() -> None:
    """Install RabbitMQ and Mosquitto when absent and start them when not running."""
    subprocess.run(["bash", str(ROOT / "scripts" / "lib.sh"), "hp_ensure_peers"], check=True)


# ============================================================================ peer messages


def peer_payload(phase: int, seq: int, t_send: float, pad: bytes) -> bytes:
    return b"%d %d %.6f " % (phase, seq, t_send) + pad


class _Received:
    __slots__ = ("recv", "sent", "seqs")

    def __init__(self) -> None:
        self.seqs = array.array("q")
        self.sent = array.array("d")
        self.recv = array.array("d")


class _Sink:
    """What the peer consumer received, per phase."""

    def __init__(self) -> None:
        self.phases: dict[int, _Received] = {}
        self.unparsed = 0

    def record(self, body: bytes) -> None:
        now = time.time()
        try:
            phase_s, seq_s, t_s, _pad = body.split(b" ", 3)
            phase, seq, t_send = int(phase_s), int(seq_s), float(t_s)
        except ValueError:
            self.unparsed += 1
            return
        rec = self.phases.get(phase)
        if rec is None:
            rec = self.phases[phase] = _Received()
        rec.seqs.append(seq)
        rec.sent.append(t_send)
        rec.recv.append(now)

    def reply(self, conn: Any, cmd: str, args: list[Any]) -> bool:
        if cmd == "count":
            rec = self.phases.get(args[0])
            conn.send((len(set(rec.seqs)) if rec else 0, len(rec.seqs) if rec else 0))
        elif cmd == "collect":
            rec = self.phases.pop(args[0], None) or _Received()
            conn.send(
                {
                    "seqs": rec.seqs.tobytes(),
                    "sent": rec.sent.tobytes(),
                    "recv": rec.recv.tobytes(),
                    "unparsed": self.unparsed,
                }
            )
        elif cmd == "stop":
            return False
        return True


# ============================================================================ peer consumer


def _quiet_logger() -> logging.Logger:
    # aiomqtt warns for every publish beyond 10 awaiting their PUBACK: 32 are, by design.
    logger = logging.getLogger("bench.peers.mqtt")
    logger.setLevel(logging.ERROR)
    return logger


def peer_consumer_main(conn: Any, kind: str, cfg: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    install_uvloop()
    asyncio.run(_peer_consumer(conn, kind, cfg))


async def _serve_commands(conn: Any, sink: _Sink) -> None:
    # Commands are read in a thread (as bench/e2e.py's consumer), replies sent from the loop.
    loop = asyncio.get_running_loop()
    while True:
        try:
            cmd, *args = await loop.run_in_executor(None, conn.recv)
        except (EOFError, OSError):
            return
        if not sink.reply(conn, cmd, args):
            return


async def _peer_consumer(conn: Any, kind: str, cfg: dict[str, Any]) -> None:
    sink = _Sink()
    if kind == "rabbitmq":
        import aio_pika

        connection = await aio_pika.connect(cfg["amqp_url"])
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=cfg["prefetch"])
        queue = await channel.declare_queue(cfg["queue"], durable=True)
        await queue.purge()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            sink.record(message.body)
            await message.ack()

        await queue.consume(on_message, no_ack=False)
        conn.send("ready")
        await _serve_commands(conn, sink)
        with contextlib.suppress(Exception):
            await queue.delete(if_unused=False, if_empty=False)
        await connection.close()
    else:
        import aiomqtt

        async with aiomqtt.Client(
            cfg["mqtt_host"],
            cfg["mqtt_port"],
            identifier=f"hpwsn-bench-consumer-{os.getpid()}",
            max_inflight_messages=cfg["concurrency"],
            logger=_quiet_logger(),
        ) as client:
            await client.subscribe(cfg["topic"], qos=1)

            async def receive() -> None:
                async for message in client.messages:
                    sink.record(bytes(message.payload))  # type: ignore[arg-type]

            task = asyncio.create_task(receive())
            conn.send("ready")
            await _serve_commands(conn, sink)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    conn.send("bye")


# ============================================================================ peer publisher


def peer_publisher_main(conn: Any, kind: str, cfg: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    install_uvloop()
    conn.send(asyncio.run(_peer_publish(conn, kind, cfg)))


async def _peer_publish(conn: Any, kind: str, cfg: dict[str, Any]) -> dict[str, Any]:
    phase: int = cfg["phase"]
    limit: int = cfg["limit"]
    pad: bytes = cfg["pad"]
    ok_seqs = array.array("q")
    latencies = array.array("d")
    errors: Counter[str] = Counter()
    samples: list[str] = []
    seqs = itertools.count()
    last_done = [0.0]
    stack = contextlib.AsyncExitStack()
    async with stack:
        if kind == "rabbitmq":
            import aio_pika

            connection = await stack.enter_async_context(await aio_pika.connect(cfg["amqp_url"]))
            # Publisher confirms: each publish returns when the broker has taken responsibility
            # for the message (for a persistent message on a durable queue: written to disk).
            channel = await connection.channel(publisher_confirms=True)
            exchange = channel.default_exchange
            queue_name = cfg["queue"]

            async def send(body: bytes) -> None:
                msg = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
                await exchange.publish(msg, routing_key=queue_name)

        else:
            import aiomqtt

            client = await stack.enter_async_context(
                aiomqtt.Client(
                    cfg["mqtt_host"],
                    cfg["mqtt_port"],
                    identifier=f"hpwsn-bench-publisher-{os.getpid()}",
                    max_inflight_messages=cfg["concurrency"],
                    logger=_quiet_logger(),
                )
            )
            topic = cfg["topic"]

            async def send(body: bytes) -> None:
                await client.publish(topic, body, qos=1, timeout=60)

        conn.send("ready")
        start_at = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        start = time.time()
        deadline = start + cfg["duration"]

        async def sender() -> None:
            while True:
                seq = next(seqs)
                t_send = time.time()
                if t_send >= deadline or (limit and seq >= limit):
                    return
                t0 = time.perf_counter()
                try:
                    await send(peer_payload(phase, seq, t_send, pad))
                except Exception as exc:  # counted and reported
                    errors[type(exc).__name__] += 1
                    if len(samples) < 5:
                        samples.append(f"{type(exc).__name__}: {exc}")
                    continue
                latencies.append(time.perf_counter() - t0)
                ok_seqs.append(seq)
                last_done[0] = time.time()

        await asyncio.gather(*(sender() for _ in range(cfg["concurrency"])))
    return {
        "ok_seqs": ok_seqs.tobytes(),
        "latencies": latencies.tobytes(),
        "errors": dict(errors),
        "error_samples": samples,
        "first_send": start,
        "last_done": last_done[0] or time.time(),
    }


def _fork(target: Any, *args: Any, name: str) -> tuple[Any, Any]:
    ctx = mp.get_context("fork")
    parent_end, child_end = ctx.Pipe()
    p = ctx.Process(target=target, args=(child_end, *args), name=name, daemon=True)
    p.start()
    e2e.RUNNING.mp_children.append(p)  # stopped by e2e.cleanup() whatever happens
    return p, parent_end


def _join(p: Any) -> None:
    p.join(5)
    if p.is_alive():
        p.kill()
        p.join(2)
    with contextlib.suppress(ValueError):
        e2e.RUNNING.mp_children.remove(p)


def peer_publish(kind: str, cfg: dict[str, Any], duration: float) -> e2e.PublishResult:
    p, pipe = _fork(peer_publisher_main, kind, cfg, name=f"{kind}-publisher")
    try:
        if not pipe.poll(60) or pipe.recv() != "ready":
            raise RuntimeError(f"the {kind} publisher did not connect")
        pipe.send(time.time() + 0.1)
        if not pipe.poll(duration + 120):
            raise RuntimeError(f"the {kind} publisher did not finish")
        r = pipe.recv()
    finally:
        _join(p)
    ok_seqs, lat = array.array("q"), array.array("d")
    ok_seqs.frombytes(r["ok_seqs"])
    lat.frombytes(r["latencies"])
    return e2e.PublishResult(
        ok_seqs=ok_seqs,
        latencies=sorted(lat),
        errors=Counter(r["errors"]),
        error_samples=r["error_samples"],
        first_send=r["first_send"],
        last_done=r["last_done"],
    )


# ============================================================================ measurement


@dataclass
class Result:
    path: str
    accepted: int
    received: int
    duplicates: int
    missing: int
    secs: float
    latencies_ms: list[float]
    broker_cpu_s: float
    machine_busy_pct: float | None
    errors: dict[str, int]

    @property
    def rate(self) -> float:
        return self.received / self.secs if self.secs > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        lat = self.latencies_ms
        return {
            "path": self.path,
            "accepted": self.accepted,
            "received": self.received,
            "missing": self.missing,
            "duplicates": self.duplicates,
            "secs": round(self.secs, 3),
            "msgs_per_s": round(self.rate, 1),
            "p50_ms": _r(percentile(lat, 50)),
            "p99_ms": _r(percentile(lat, 99)),
            "max_ms": _r(lat[-1] if lat else None),
            "broker_cpu_ms_per_msg": (
                round(1000 * self.broker_cpu_s / self.received, 3) if self.received else None
            ),
            "machine_busy_percent": self.machine_busy_pct,
            "publish_errors": self.errors,
        }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def machine_busy() -> float:
    """Busy CPU seconds of the whole machine so far (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:3]) + fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")


class Clock:
    """CPU of the broker's processes and of the whole machine over one measured phase."""

    def __init__(self, pids: Any) -> None:
        self.pids = pids  # a callable: processes may come and go (uvicorn, the Celery pool)
        self.cpu0 = cpu_seconds(pids())
        self.busy0 = machine_busy()
        self.t0 = time.time()

    def stop(self) -> tuple[float, float]:
        wall = time.time() - self.t0
        busy = 100 * (machine_busy() - self.busy0) / wall if wall > 0 else 0.0
        return cpu_seconds(self.pids()) - self.cpu0, round(busy, 1)


def tally(
    path: str,
    pub: e2e.PublishResult,
    data: dict[str, Any],
    broker_cpu_s: float,
    busy: float | None,
) -> Result:
    seqs, sent, recv = array.array("q"), array.array("d"), array.array("d")
    seqs.frombytes(data["seqs"])
    sent.frombytes(data["sent"])
    recv.frombytes(data["recv"])
    counts = Counter(seqs)
    last = max(recv) if recv else pub.first_send
    return Result(
        path=path,
        accepted=pub.ok,
        received=len(counts),
        duplicates=sum(n - 1 for n in counts.values() if n > 1),
        missing=len(set(pub.ok_seqs).difference(counts)),
        secs=last - pub.first_send,
        latencies_ms=sorted((r - s) * 1000 for r, s in zip(recv, sent, strict=True)),
        broker_cpu_s=broker_cpu_s,
        machine_busy_pct=busy,
        errors=dict(pub.errors),
    )


def _publish_window(args: argparse.Namespace) -> float:
    # With --messages the run ends when they are sent; the duration only bounds it.
    return 3600.0 if args.messages else args.duration


def run_hpwsn(
    plat: e2e.Platform, pipe: Any, args: argparse.Namespace, reliability: str, n: int
) -> Result:
    """One warmed-up phase through HPwsn with the topic tree's policy set to `reliability`."""
    if reliability != args.current_reliability:
        e2e.set_reliability(plat.env, reliability)
        args.current_reliability = reliability
        time.sleep(2.0)  # every process reloads the tree within a second
    wsn_url = plat.base_url + "/wsn/"
    warm_phase, phase = 10 + 2 * n, 11 + 2 * n
    messages, args.messages = args.messages, 0
    log(f"{LABELS[reliability]}: warm-up {args.warmup:g} s")
    warm = e2e.publish(
        wsn_url, phase=warm_phase, duration=args.warmup, args=args, base_url=plat.base_url
    )
    e2e.wait_received(
        pipe, warm_phase, warm.ok, first_timeout=60, idle=args.drain_idle, limit=args.drain_timeout
    )
    pipe.send(("collect", warm_phase))
    pipe.recv()
    args.messages = messages
    e2e.check_alive(plat)
    time.sleep(1.0)

    def server_pids() -> list[int]:
        return [
            pid for c in (plat.web, plat.worker, plat.beat, plat.redis) for pid in group_pids(c.pid)
        ]

    log(f"{LABELS[reliability]}: measuring")
    clock = Clock(server_pids)
    pub = e2e.publish(
        wsn_url, phase=phase, duration=_publish_window(args), args=args, base_url=plat.base_url
    )
    e2e.wait_received(
        pipe, phase, pub.ok, first_timeout=60, idle=args.drain_idle, limit=args.drain_timeout
    )
    cpu, busy = clock.stop()
    time.sleep(args.grace)  # late duplicates
    pipe.send(("collect", phase))
    return tally(reliability, pub, pipe.recv(), cpu, busy)


def run_peer(kind: str, args: argparse.Namespace, n: int) -> Result:
    """One warmed-up phase through RabbitMQ or Mosquitto, with its own consumer process."""
    tag = f"hpwsn-bench-{os.getpid()}-{n}"
    cfg = {
        "amqp_url": args.amqp_url,
        "queue": tag,
        "prefetch": args.prefetch,
        "mqtt_host": args.mqtt_host,
        "mqtt_port": args.mqtt_port,
        "topic": f"hpwsn-bench/{tag}",
        "concurrency": args.publishers_concurrency,
        "pad": b"x" * max(0, args.payload_bytes - len(b"11 1000000 1732170000.123456 ")),
    }
    consumer, pipe = _fork(peer_consumer_main, kind, cfg, name=f"{kind}-consumer")
    try:
        if not pipe.poll(60) or pipe.recv() != "ready":
            raise RuntimeError(f"the {kind} consumer did not connect")
        warm_phase, phase = 10 + 2 * n, 11 + 2 * n
        log(f"{LABELS[kind]}: warm-up {args.warmup:g} s")
        warm = peer_publish(
            kind, {**cfg, "phase": warm_phase, "limit": 0, "duration": args.warmup}, args.warmup
        )
        e2e.wait_received(
            pipe,
            warm_phase,
            warm.ok,
            first_timeout=60,
            idle=args.drain_idle,
            limit=args.drain_timeout,
        )
        pipe.send(("collect", warm_phase))
        pipe.recv()
        time.sleep(1.0)
        log(f"{LABELS[kind]}: measuring")
        clock = Clock(lambda: pids_named(*BROKER_PROCESSES[kind]))
        window = _publish_window(args)
        pub = peer_publish(
            kind, {**cfg, "phase": phase, "limit": args.messages, "duration": window}, window
        )
        e2e.wait_received(
            pipe, phase, pub.ok, first_timeout=60, idle=args.drain_idle, limit=args.drain_timeout
        )
        cpu, busy = clock.stop()
        time.sleep(args.grace)
        pipe.send(("collect", phase))
        result = tally(kind, pub, pipe.recv(), cpu, busy)
        pipe.send(("stop",))
        pipe.poll(10)
    finally:
        _join(consumer)
    return result


def measure(plat: e2e.Platform, args: argparse.Namespace, report: dict[str, Any]) -> None:
    pipe, cport = e2e.start_consumer()
    consumer_url = f"http://127.0.0.1:{cport}/consumer"
    e2e.subscribe(plat, consumer_url)
    wsn_url = plat.base_url + "/wsn/"
    log("probing the pipeline (the worker may still be starting)")
    for seq in range(10):
        body = e2e.notify_body(wsn_url, e2e.PHASE_PROBE, range(seq, seq + 1), time.time())
        status, answer = e2e.http(wsn_url, body, e2e.NOTIFY_CT)
        if status != 202:
            raise RuntimeError(f"Notify on /wsn/ answered {status}: {answer[:500]!r}")
    got, secs = e2e.wait_received(pipe, e2e.PHASE_PROBE, 10, first_timeout=90, idle=30, limit=120)
    if got < 10:
        raise RuntimeError(f"the pipeline delivered {got}/10 probe notifications in {secs:.0f} s")

    results: dict[str, Result] = {}
    for n, path in enumerate(args.paths):
        if path in PEER_OF:
            results[path] = run_hpwsn(plat, pipe, args, path, n)
        else:
            results[path] = run_peer(path, args, n)
        r = results[path]
        log(f"{LABELS[path]}: {r.rate:.0f} msgs/s, missing {r.missing}, duplicates {r.duplicates}")
    report["paths"] = {k: v.as_dict() for k, v in results.items()}
    report["ratios"] = print_report(results)
    report["logs"] = e2e.scan_logs(plat)
    for name, info in report["logs"].items():
        if info["problems"]:
            print(f"{name} log: {info['problems']}")


def print_report(results: dict[str, Result]) -> dict[str, Any]:
    print()
    print(
        f"{'path':<36}{'msgs':>9}{'secs':>8}{'msgs/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'broker CPU ms/msg':>19}{'machine busy':>14}  missing/dup"
    )
    for r in results.values():
        d = r.as_dict()
        cpu = "-" if d["broker_cpu_ms_per_msg"] is None else f"{d['broker_cpu_ms_per_msg']:.3f}"
        busy = "-" if r.machine_busy_pct is None else f"{r.machine_busy_pct:.0f}%"
        label = LABELS[r.path] + (" INCOMPLETE" if r.missing else "")
        print(
            f"{label:<36}{r.received:>9}{r.secs:>8.2f}{r.rate:>10.1f}"
            f"{d['p50_ms'] or 0:>9.1f}{d['p99_ms'] or 0:>9.1f}{cpu:>19}{busy:>14}"
            f"  {r.missing}/{r.duplicates}"
        )
    if any(r.missing for r in results.values()):
        print(
            "INCOMPLETE: messages confirmed to the publisher never reached the consumer; the rate "
            "counts what arrived. Mosquitto drops QoS 1 messages for a consumer that lags by more "
            "than its max_queued_messages (1000 by default; its log says 'Outgoing messages are "
            "being dropped')."
        )
    ratios: dict[str, Any] = {}
    for ours, peer in PEER_OF.items():
        if ours not in results or peer not in results:
            continue
        a, b = results[ours].as_dict(), results[peer].as_dict()
        rate = a["msgs_per_s"] / b["msgs_per_s"] if b["msgs_per_s"] else None
        p50 = a["p50_ms"] / b["p50_ms"] if a["p50_ms"] and b["p50_ms"] else None
        p99 = a["p99_ms"] / b["p99_ms"] if a["p99_ms"] and b["p99_ms"] else None
        ratios[f"{ours}/{peer}"] = {"msgs_per_s": rate, "p50_ms": p50, "p99_ms": p99}
        goal = GOALS[ours]
        verdict = "" if rate is None else ("  goal met" if rate >= goal else "  goal NOT met")
        print(
            f"HPwsn {ours} / {LABELS[peer]}: msgs/s "
            + ("-" if rate is None else f"{rate:.2f}")
            + f" (goal >= {goal}{verdict}), p50 "
            + ("-" if p50 is None else f"{p50:.2f}")
            + ", p99 "
            + ("-" if p99 is None else f"{p99:.2f}")
        )
    return ratios


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=10.0, help="seconds of publishing per path")
    p.add_argument(
        "--messages", type=int, default=0, help="messages per path instead of --duration (0: off)"
    )
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per path")
    p.add_argument("--publishers-concurrency", type=int, default=32, help="requests in flight")
    p.add_argument("--payload-bytes", type=int, default=1024, help="size of each message's payload")
    p.add_argument(
        "--paths",
        default=",".join(PATHS),
        help="comma-separated, in this order: " + ", ".join(PATHS),
    )
    p.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672/", help="RabbitMQ")
    p.add_argument("--prefetch", type=int, default=256, help="RabbitMQ consumer prefetch")
    p.add_argument("--mqtt-host", default="127.0.0.1", help="Mosquitto")
    p.add_argument("--mqtt-port", type=int, default=1883, help="Mosquitto")
    p.add_argument(
        "--no-ensure",
        dest="ensure",
        action="store_false",
        help="do not install or start RabbitMQ and Mosquitto (they run elsewhere)",
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
    p.add_argument("--database-url", default="", help="PostgreSQL instead of SQLite (recreated)")
    p.add_argument("--json", default="", help="write the figures to this file")
    p.add_argument("--drain-idle", type=float, default=15.0, help="give up after s w/o progress")
    p.add_argument("--drain-timeout", type=float, default=300.0, help="give up draining after s")
    p.add_argument("--grace", type=float, default=1.0, help="wait for late duplicates (s)")
    p.add_argument("--keep", action="store_true", help="keep the temporary data dir and logs")
    args = p.parse_args(argv)
    args.paths = [x.strip() for x in args.paths.split(",") if x.strip()]
    unknown = [x for x in args.paths if x not in PATHS]
    if unknown or not args.paths:
        p.error(f"--paths: unknown {unknown}; choose from {', '.join(PATHS)}")
    if args.messages < 0 or args.payload_bytes < 0:
        p.error("--messages and --payload-bytes must not be negative")
    # bench/e2e.py's platform and publisher read its own options from the namespace: start from
    # its defaults, so that an option it gains later needs nothing here.
    merged = e2e.parse_args([])
    merged.publisher_procs = 1
    merged.messages_per_notify = 1
    merged.rate = 0.0
    merged.monitoring_compare = False
    merged.events_compare = False
    merged.compare_reliability = False
    merged.reliability = next((x for x in args.paths if x in PEER_OF), "reliable")
    merged.current_reliability = merged.reliability  # the tree's policy as the platform starts
    for key, value in vars(args).items():
        setattr(merged, key, value)
    return merged


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ensure and any(x not in PEER_OF for x in args.paths):
        ensure_peers()
    config = {
        "paths": ", ".join(args.paths),
        "measure": f"{args.messages} messages" if args.messages else f"{args.duration:g} s",
        "warmup_s": args.warmup,
        "publishers_concurrency": args.publishers_concurrency,
        "payload_bytes": args.payload_bytes,
        "web_workers": args.web_workers,
        "worker_concurrency": args.worker_concurrency,
        "database": "PostgreSQL" if args.database_url else "SQLite (temporary)",
        "amqp": args.amqp_url.split("@")[-1],
        "mqtt": f"{args.mqtt_host}:{args.mqtt_port}",
    }
    return e2e.run_benchmark(args, config, measure, prefix="hpwsn-peers-")


if __name__ == "__main__":
    sys.exit(main())
