#!/usr/bin/env python3
"""Fan-out benchmark of HPwsn: one topic, 100 push subscriptions, deliveries/s against a ceiling.

Starts a private platform exactly as bench/e2e.py does (its helpers are imported, not copied),
runs 100 HTTP consumers on 127.0.0.1 (in one asyncio process; with --consumers 10000 they share
--ports listening ports, told apart by their path), subscribes each of them to the topic `ALL`
with a SOAP Subscribe, and measures in one run:

  fan-out   deliveries/s: SOAP Notify on /wsn/ at an offered rate, each notification pushed to
            every consumer; deliveries = distinct (consumer, notification) pairs received, over
            first send -> last receipt; with publish-to-receipt latency and a loss check
  ceiling   the same consumers' raw receive rate: a load generator posts the broker's kind of
            wsnt:Notify POSTs (the mean batch size the broker used in the fan-out phase) straight
            to the consumers, round robin, as fast as they take them

and prints them side by side with their ratio. See bench/README.md.

    .venv/bin/python -m bench.fanout [--consumers 100] [--ports 100] [--rate 100] [--duration 10]
"""

from __future__ import annotations

import argparse
import array
import asyncio
import itertools
import multiprocessing as mp
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import e2e  # the platform, publisher, CPU meter, profiler
from bench.common import install_uvloop

MAX_CONSUMERS = 100_000

PHASE_PROBE, PHASE_WARMUP, PHASE_MEASURE, PHASE_CEILING = (
    e2e.PHASE_PROBE,
    e2e.PHASE_WARMUP,
    e2e.PHASE_MEASURE,
    7,
)
OK_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
BYE_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
log = e2e.log


# ============================================================================ consumer process


class _Phase:
    __slots__ = ("latencies", "per_consumer", "seen", "total")

    def __init__(self, consumers: int) -> None:
        self.seen: set[int] = set()  # seq * MAX_CONSUMERS + consumer index
        self.total = 0
        self.latencies = array.array("d")  # receipt - send time, of first receipts
        self.per_consumer = array.array("q", [0] * consumers)


class _Sink:
    """What every consumer received, per benchmark phase."""

    def __init__(self, consumers: int) -> None:
        self.consumers = consumers
        self.phases: dict[int, _Phase] = {}
        self.posts = 0
        self.notifications = 0
        self.last_receipt = 0.0

    def record(self, index: int, body: bytes) -> None:
        now = time.time()
        self.posts += 1
        self.last_receipt = now
        for m in e2e.RECORD_RE.finditer(body):
            self.notifications += 1
            phase, seq = int(m.group(1)), int(m.group(2))
            rec = self.phases.get(phase)
            if rec is None:
                rec = self.phases[phase] = _Phase(self.consumers)
            rec.total += 1
            key = seq * MAX_CONSUMERS + index
            if key not in rec.seen:
                rec.seen.add(key)
                rec.per_consumer[index] += 1
                rec.latencies.append(now - float(m.group(3)))


def _protocol_factory(sink: _Sink) -> Any:
    import httptools

    class Consumer(asyncio.Protocol):
        """NotificationConsumers reduced to HTTP/1.1 keep-alive: parse, record, answer 200. The
        consumer is the path's last segment (`/c/<index>`): many consumers share one port."""

        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)
            self.body: list[bytes] = []
            self.index = 0

        def on_url(self, url: bytes) -> None:
            self.index = int(url.rsplit(b"/", 1)[-1])

        def data_received(self, data: bytes) -> None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self.transport.close()

        def on_message_begin(self) -> None:
            self.body = []

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            sink.record(self.index, b"".join(self.body))
            keep = self.parser.should_keep_alive()
            self.transport.write(OK_RESPONSE if keep else BYE_RESPONSE)
            if not keep:
                self.transport.close()

    return Consumer


def consumers_main(conn: Any, count: int, ports: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    install_uvloop()
    asyncio.run(_consumers(conn, count, ports))


async def _consumers(conn: Any, count: int, n_ports: int) -> None:
    loop = asyncio.get_running_loop()
    sink = _Sink(count)
    servers, ports = [], []
    for _i in range(n_ports):
        server = await loop.create_server(
            _protocol_factory(sink), "127.0.0.1", 0, backlog=1024, reuse_address=True
        )
        servers.append(server)
        ports.append(server.sockets[0].getsockname()[1])
    urls = [f"http://127.0.0.1:{ports[i % n_ports]}/c/{i}" for i in range(count)]
    conn.send(("urls", urls))

    def reply(cmd: str, args: list[Any]) -> bool:
        if cmd == "count":
            rec = sink.phases.get(args[0])
            conn.send((len(rec.seen), rec.total) if rec else (0, 0))
        elif cmd == "collect":
            rec = sink.phases.pop(args[0], None) or _Phase(count)
            conn.send(
                {
                    "distinct": len(rec.seen),
                    "total": rec.total,
                    "latencies": rec.latencies.tobytes(),
                    "per_consumer": list(rec.per_consumer),
                    "posts": sink.posts,
                    "notifications": sink.notifications,
                    "last_receipt": sink.last_receipt,
                }
            )
        elif cmd == "totals":
            conn.send({"posts": sink.posts, "notifications": sink.notifications})
        elif cmd == "stop":
            conn.send("bye")
            return False
        return True

    # Commands are read in a thread, replies sent from the loop (as bench/e2e.py's consumer).
    while True:
        try:
            cmd, *args = await loop.run_in_executor(None, conn.recv)
        except (EOFError, OSError):
            break
        if not reply(cmd, args):
            break
    for server in servers:
        server.close()


def start_consumers(count: int, ports: int) -> tuple[Any, list[str]]:
    """The consumers' process and their URLs: `count` consumers over `ports` listening ports."""
    ctx = mp.get_context("fork")
    parent_end, child_end = ctx.Pipe()
    p = ctx.Process(
        target=consumers_main, args=(child_end, count, ports), name="consumers", daemon=True
    )
    p.start()
    # e2e's cleanup stops it and its CPU meter counts it as "consumer".
    e2e.RUNNING.consumer, e2e.RUNNING.consumer_pipe = p, parent_end
    if not parent_end.poll(60):
        raise RuntimeError("the consumer process did not start")
    tag, urls = parent_end.recv()
    assert tag == "urls"
    return parent_end, urls


def wait_deliveries(
    pipe: Any, phase: int, expected: int, *, idle: float, limit: float
) -> tuple[int, float]:
    """Wait until `expected` distinct deliveries of `phase` arrived or progress stops."""
    start = last_change = time.time()
    last = -1
    while True:
        distinct, _total = e2e.consumer_count(pipe, phase)
        now = time.time()
        if distinct != last:
            last, last_change = distinct, now
        if distinct >= expected or now - last_change > idle or now - start > limit:
            return distinct, now - start
        time.sleep(0.1)


# ============================================================================ ceiling generator


def generator_main(conn: Any, cfg: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    install_uvloop()
    conn.send(asyncio.run(_generate(cfg)))


async def _generate(cfg: dict[str, Any]) -> dict[str, Any]:
    """Post Notify batches straight to the consumers, round robin, for `duration` seconds."""
    import aiohttp

    urls: list[str] = cfg["urls"]
    batch: int = cfg["batch"]
    concurrency: int = cfg["concurrency"]
    headers = {"Content-Type": e2e.NOTIFY_CT}
    # Bodies are built once per consumer and reused: the generator must not be the bottleneck.
    bodies = [e2e.notify_body(u, cfg["phase"], range(batch), time.time()) for u in urls]
    turn = itertools.count()
    ok = errors = 0
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=2)
    async with aiohttp.ClientSession(connector=connector) as session:
        cpu0 = time.process_time()
        start = time.time()
        deadline = start + cfg["duration"]
        last_done = start

        async def sender() -> None:
            nonlocal ok, errors, last_done
            while time.time() < deadline:
                i = next(turn) % len(urls)
                try:
                    async with session.post(urls[i], data=bodies[i], headers=headers) as resp:
                        await resp.read()
                        if resp.status < 300:
                            ok += 1
                        else:
                            errors += 1
                except aiohttp.ClientError:
                    errors += 1
                last_done = time.time()

        await asyncio.gather(*(sender() for _ in range(concurrency)))
    return {
        "posts": ok,
        "errors": errors,
        "first_send": start,
        "last_done": last_done,
        "cpu_s": time.process_time() - cpu0,
    }


def ceiling(urls: list[str], *, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    parent_end, child_end = ctx.Pipe()
    cfg = {
        "urls": urls,
        "batch": batch,
        "concurrency": args.ceiling_concurrency,
        "duration": args.duration,
        "phase": PHASE_CEILING,
    }
    p = ctx.Process(target=generator_main, args=(child_end, cfg), name="generator", daemon=True)
    p.start()
    e2e.RUNNING.mp_children.append(p)
    try:
        if not parent_end.poll(args.duration + 120):
            raise RuntimeError("the ceiling load generator did not finish")
        return dict(parent_end.recv())
    finally:
        p.join(5)
        if p.is_alive():
            p.kill()
        e2e.RUNNING.mp_children.remove(p)


# ============================================================================ measurement


def _lat_ms(raw: bytes) -> list[float]:
    a = array.array("d")
    a.frombytes(raw)
    return sorted(x * 1000 for x in a)


def measure(plat: e2e.Platform, args: argparse.Namespace, report: dict[str, Any]) -> None:
    wsn_url = plat.base_url + "/wsn/"
    n = args.consumers
    pipe, urls = start_consumers(n, min(n, args.ports))
    log(f"{n} consumers on {min(n, args.ports)} ports of 127.0.0.1; subscribing each to ALL")
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:  # Subscribe requests in flight together
        list(pool.map(lambda url: e2e.subscribe(plat, url), urls))
    log(f"subscribed {n} in {time.monotonic() - started:.1f} s")

    log("probing the pipeline (the worker may still be starting)")
    for seq in range(3):
        status, body = e2e.http(
            wsn_url, e2e.notify_body(wsn_url, PHASE_PROBE, range(seq, seq + 1), time.time()),
            e2e.NOTIFY_CT,
        )  # fmt: skip
        if status != 202:
            raise RuntimeError(f"Notify on /wsn/ answered {status}: {body[:500]!r}")
    got, secs = wait_deliveries(pipe, PHASE_PROBE, 3 * n, idle=60, limit=180)
    if got < 3 * n:
        raise RuntimeError(f"the pipeline delivered {got}/{3 * n} probe deliveries in {secs:.0f} s")
    log(f"pipeline up ({got} probe deliveries in {secs:.1f} s)")

    log(f"fan-out: warm-up {args.warmup:g} s at {args.rate:g} notifications/s")
    warm = e2e.publish(
        wsn_url, phase=PHASE_WARMUP, duration=args.warmup, args=args, base_url=plat.base_url
    )
    wait_deliveries(pipe, PHASE_WARMUP, warm.ok * n, idle=args.drain_idle, limit=300)
    pipe.send(("collect", PHASE_WARMUP))
    pipe.recv()
    time.sleep(1.0)
    e2e.check_alive(plat)

    # ------------------------------------------------------------- fan-out
    before = e2e.redis_info(plat)
    pipe.send(("totals",))
    totals_before = pipe.recv()
    profiles: list[tuple[str, Path]] = []
    if args.profile:
        profiles = e2e.start_profilers(
            [plat.web, plat.worker], Path(args.profile), args.duration + 10, "fan-out"
        )
    meter = e2e.CpuMeter(plat)
    meter.start()
    log(f"fan-out: {args.duration:g} s at {args.rate or 'unlimited'} notifications/s to {n}")
    pub, pub_cpu = e2e.run_publish_with_cpu(plat, wsn_url, PHASE_MEASURE, args.duration, args)
    pub_cpu.pop("_connections", None)
    at_pub_end, _ = e2e.consumer_count(pipe, PHASE_MEASURE)
    expected = pub.ok * n
    log(f"fan-out: {pub.ok} accepted ({expected} deliveries due), {at_pub_end} delivered so far")
    got, drain = wait_deliveries(
        pipe, PHASE_MEASURE, expected, idle=args.drain_idle, limit=args.drain_timeout
    )
    cpu = meter.stop()
    time.sleep(args.grace)
    after = e2e.redis_info(plat)
    pipe.send(("collect", PHASE_MEASURE))
    data = pipe.recv()
    e2e.wait_profilers()
    posts = data["posts"] - totals_before["posts"]
    msgs = data["notifications"] - totals_before["notifications"]
    mean_batch = msgs / max(posts, 1)
    secs = data["last_receipt"] - pub.first_send
    fan = e2e.Row(
        "fan-out (/wsn/ -> consumers)", data["distinct"], secs, _lat_ms(data["latencies"])
    )
    short = [i for i, c in enumerate(data["per_consumer"]) if c < pub.ok]
    report["fan_out"] = {
        **fan.as_dict(),
        "deliveries_per_s": round(fan.rate, 1),
        "accepted_notifications": pub.ok,
        "deliveries_due": expected,
        "delivered_distinct": data["distinct"],
        "delivered_total": data["total"],
        "missing": expected - data["distinct"],
        "duplicates": data["total"] - data["distinct"],
        "consumers_short": len(short),
        "delivered_by_publish_end": at_pub_end,
        "delivered_rate_while_publishing": round(
            at_pub_end / max(pub.last_done - pub.first_send, 1e-9), 1
        ),
        "drain_secs": round(drain, 2),
        "posts": posts,
        "mean_batch": round(mean_batch, 1),
        "publish_errors": dict(pub.errors),
        "cpu_percent": cpu,
        "cpu_percent_while_publishing": pub_cpu,
        "redis_commands_per_delivery": round(
            (after["total_commands_processed"] - before["total_commands_processed"])
            / max(data["distinct"], 1),
            2,
        ),
    }
    log(f"fan-out: {fan.rate:.0f} deliveries/s, mean batch {mean_batch:.1f} messages per POST")

    # ------------------------------------------------------------- ceiling
    batch = max(1, round(mean_batch))
    log(f"ceiling: {args.duration:g} s of {batch}-message POSTs straight to the {n} consumers")
    meter = e2e.CpuMeter(plat)
    meter.start()
    gen = ceiling(urls, batch=batch, args=args)
    ceil_cpu = meter.stop()
    pipe.send(("collect", PHASE_CEILING))
    cdata = pipe.recv()
    ceil_secs = gen["last_done"] - gen["first_send"]
    # The generator repeats each consumer's body, so every receipt counts here (not distinct).
    ceil = e2e.Row("ceiling (straight to consumers)", cdata["total"], ceil_secs, [])
    report["ceiling"] = {
        **ceil.as_dict(),
        "deliveries_per_s": round(ceil.rate, 1),
        "batch": batch,
        "posts": gen["posts"],
        "errors": gen["errors"],
        "generator_cpu_percent": round(100 * gen["cpu_s"] / max(ceil_secs, 1e-9), 1),
        "cpu_percent": ceil_cpu,
    }
    ratio = fan.rate / ceil.rate if ceil.rate else None
    report["ratio_fanout_ceiling"] = None if ratio is None else round(ratio, 3)
    report["goal_deliveries_per_s"] = args.goal
    report["logs"] = e2e.scan_logs(plat)
    e2e.check_alive(plat)

    # ------------------------------------------------------------- report
    print()
    print(f"{'phase':<34}{'deliveries':>11}{'secs':>8}{'deliv/s':>10}{'p50 ms':>9}", end="")
    print(f"{'p99 ms':>9}{'max ms':>9}")
    for row in (fan, ceil):
        d = row.as_dict()

        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"

        print(
            f"{row.phase:<34}{row.msgs:>11}{row.secs:>8.2f}{row.rate:>10.1f}"
            f"{f(d['p50_ms']):>9}{f(d['p99_ms']):>9}{f(d['max_ms']):>9}"
        )
    print(f"{'ratio fan-out/ceiling':<34}{'-' if ratio is None else f'{ratio:.2f}':>11}")
    goal = "meets" if fan.rate >= args.goal else "BELOW"
    print(f"goal {args.goal:.0f} deliveries/s: {goal}")
    fo = report["fan_out"]
    print(
        f"fan-out: {pub.ok} notifications accepted x {n} consumers = {expected} due; "
        f"missing {fo['missing']}, duplicates {fo['duplicates']}, consumers short "
        f"{fo['consumers_short']}; {at_pub_end} delivered while publishing "
        f"({fo['delivered_rate_while_publishing']:.0f}/s), drain {drain:.1f} s"
    )
    print(
        f"pushes: {posts} POSTs, {mean_batch:.1f} messages per POST; "
        f"{fo['redis_commands_per_delivery']} Redis commands per delivery"
    )
    if pub.errors:
        print(f"publish errors: {dict(pub.errors)} {pub.error_samples[:2]}")
    if gen["errors"]:
        print(f"ceiling errors: {gen['errors']}")
    gen_cpu = report["ceiling"]["generator_cpu_percent"]
    print(f"ceiling: {gen['posts']} POSTs of {batch} messages; load generator CPU {gen_cpu:.0f}%")
    if gen_cpu >= 90:
        print("note: the load generator used a whole core: the ceiling is a lower bound")
    offered = args.rate * n
    if args.rate and fo["delivered_rate_while_publishing"] >= 0.9 * offered:
        print(
            f"note: deliveries kept up with the offered {offered:.0f}/s: the broker may do more "
            "(try a higher --rate)"
        )
    parts = ", ".join(f"{k} {v:.0f}%" for k, v in pub_cpu.items())
    print(f"CPU while publishing: {parts}")
    for name, c, rate in (("fan-out", cpu, fan.rate), ("ceiling", ceil_cpu, ceil.rate)):
        parts = ", ".join(f"{k} {v:.0f}%" for k, v in c.items())
        print(f"CPU during {name}{' (publish + drain)' if name == 'fan-out' else ''}: {parts}")
        if rate:
            per = {k: round(1000 * 10 * v / rate, 1) for k, v in c.items() if k != "steal"}
            report["fan_out" if name == "fan-out" else "ceiling"]["cpu_us_per_delivery"] = per
            print(
                "  CPU us per delivery: " + ", ".join(f"{k} {v:.1f}" for k, v in per.items() if v)
            )
    for name, info in report["logs"].items():
        if info["problems"]:
            print(f"{name} log: {info['problems']}")
            for ln in info["first"][:4]:
                print(f"  {ln[:200]}")
    if profiles:
        report["profile"] = {}
        for name, raw in profiles:
            summary = e2e.summarise_profile(raw)
            report["profile"][name] = summary
            e2e.print_profile(name, raw, summary)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--consumers", type=int, default=100, help=f"push subscriptions (max {MAX_CONSUMERS})"
    )
    p.add_argument("--ports", type=int, default=100, help="listening ports the consumers share")
    p.add_argument("--rate", type=float, default=100.0, help="offered Notify/s (0: unlimited)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of publishing")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up publishing")
    p.add_argument("--publishers-concurrency", type=int, default=32, help="in-flight Notify")
    p.add_argument(
        "--messages-per-notify",
        type=int,
        default=1,
        help="NotificationMessages per published Notify (--rate counts messages)",
    )
    p.add_argument("--ceiling-concurrency", type=int, default=32, help="in-flight ceiling POSTs")
    p.add_argument("--goal", type=float, default=5000.0, help="deliveries/s to meet")
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
        "--reliability",
        choices=("reliable", "fast"),
        default="reliable",
        help="policy of the topic tree (reliable: committed to the database before 202)",
    )
    p.add_argument("--database-url", default="", help="PostgreSQL instead of SQLite (recreated)")
    p.add_argument("--json", default="", help="write the figures to this file")
    p.add_argument("--profile", default="", help="py-spy the web and worker into this directory")
    p.add_argument("--drain-idle", type=float, default=20.0, help="give up after s w/o progress")
    p.add_argument("--drain-timeout", type=float, default=300.0, help="give up draining after s")
    p.add_argument("--grace", type=float, default=1.0, help="wait for late duplicates (s)")
    p.add_argument("--keep", action="store_true", help="keep the temporary data dir and logs")
    args = p.parse_args(argv)
    if not 1 <= args.consumers <= MAX_CONSUMERS:
        p.error(f"--consumers must be 1..{MAX_CONSUMERS}")
    if args.ports < 1:
        p.error("--ports must be at least 1")
    # bench/e2e.py's platform and publisher read its own options from the namespace: start from
    # its defaults, so that an option it gains later needs nothing here.
    merged = e2e.parse_args([])
    merged.publisher_procs = 1
    merged.monitoring_compare = False
    merged.compare_reliability = False
    for key, value in vars(args).items():
        setattr(merged, key, value)
    return merged


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = {
        "consumers": args.consumers,
        "reliability": args.reliability,
        "rate": args.rate or "unlimited (closed loop)",
        "duration_s": args.duration,
        "web_workers": args.web_workers,
        "worker_concurrency": args.worker_concurrency,
        "database": "PostgreSQL" if args.database_url else "SQLite (temporary)",
        "publishers_concurrency": args.publishers_concurrency,
        "messages_per_notify": args.messages_per_notify,
        "ceiling_concurrency": args.ceiling_concurrency,
        "topic": e2e.TOPIC,
        "subscription": e2e.SUBSCRIBE_TOPIC,
    }
    return e2e.run_benchmark(args, config, measure, prefix="hpwsn-fanout-")


if __name__ == "__main__":
    sys.exit(main())
