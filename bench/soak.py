"""Soak test of HPwsn: an hour at a steady rate on a reliable topic to 10 consumers, one of them
failing 5 % of its requests, with memory, open files, Redis and the database sampled throughout.

Starts a private platform as bench/e2e.py does (its helpers are imported), subscribes --consumers
HTTP consumers (one port each, in one process) to `ALL`, the last --failing of them answering
--fail-status (503) to --fail-rate of their POSTs (the broker must deliver those again), and
publishes SOAP Notify requests on `ALL:ALARM:ALARM1` at --rate notifications/s for --duration
seconds (bench/e2e.py's open-loop publisher). Every --sample-every seconds it writes one CSV
row: RSS, open files and CPU of every process (web, worker, beat, Redis, publisher, consumers),
Redis used_memory (with its dataset and connection buffers) and keys, the database size, what
the consumers got and the latency in that window.

At the end it waits until every consumer has every accepted notification, then up to --settle
seconds (by default the dedup window and a minute: the reliable log keeps a row that long after
its accept) for Redis and the database to come back to their size before publishing, and prints:
per consumer, the notifications lost and duplicated; the growth of every figure between
--steady-from (minute 10) and the end of publishing (medians of five minutes of samples at each
end); whether Redis's dataset and the database returned to their starting size. See
bench/README.md.

    .venv/bin/python -m bench.soak [--duration 3600] [--rate 1000] [--csv soak.csv]
    .venv/bin/python -m bench.soak --duration 120             # a smoke run
"""

from __future__ import annotations

import argparse
import array
import asyncio
import csv
import multiprocessing as mp
import os
import random
import re
import signal
import statistics
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from bench import e2e
from bench.common import (
    ROOT,
    cpu_seconds,
    group_pids,
    install_uvloop,
    log,
    open_files,
    rss_bytes,
)

PHASE_PROBE, PHASE_MEASURE = e2e.PHASE_PROBE, e2e.PHASE_MEASURE
OK_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
FAIL_RESPONSE = b"HTTP/1.1 %d Failed\r\nContent-Length: 0\r\n\r\n"
MAX_LATENCY_MS = 600_000  # histogram bins of 1 ms; slower receipts land in the last bin
MB = 1024 * 1024
COMPONENTS = ("web", "worker", "beat", "redis", "publisher", "consumers")


# ============================================================================ consumer process


class _Histogram:
    """Latencies in 1 ms bins: an hour at 10,000 deliveries/s does not fit in a list."""

    def __init__(self) -> None:
        self.bins = array.array("q", bytes(8 * (MAX_LATENCY_MS + 1)))
        self.n = 0
        self.max_ms = 0

    def add(self, ms: int) -> None:
        ms = min(max(ms, 0), MAX_LATENCY_MS)
        self.bins[ms] += 1
        self.n += 1
        self.max_ms = max(self.max_ms, ms)

    def percentile(self, q: float) -> int | None:
        if not self.n:
            return None
        rank, seen = q / 100 * self.n, 0
        for ms in range(self.max_ms + 1):
            seen += self.bins[ms]
            if seen >= rank:
                return ms
        return self.max_ms


class _Sink:
    """What each consumer received: a count per sequence number (one byte each, so an hour at
    1,000/s is 3.6 MB per consumer), distinct and total receipts, POSTs and refused POSTs."""

    def __init__(self, failing: list[bool]) -> None:
        consumers = len(failing)
        self.failing = failing
        self.counts = [bytearray() for _ in range(consumers)]
        self.distinct = [0] * consumers
        self.total = [0] * consumers
        self.posts = [0] * consumers
        self.refused = [0] * consumers
        self.probe: list[set[int]] = [set() for _ in range(consumers)]
        # Latency of the consumers that never refuse, and of those that do (retries and the
        # broker's back-off make theirs another figure).
        self.window = [_Histogram(), _Histogram()]
        self.overall = [_Histogram(), _Histogram()]

    def record(self, index: int, body: bytes) -> None:
        now = time.time()
        self.posts[index] += 1
        counts = self.counts[index]
        for m in e2e.RECORD_RE.finditer(body):
            phase, seq = int(m.group(1)), int(m.group(2))
            if phase == PHASE_PROBE:
                self.probe[index].add(seq)
                continue
            if phase != PHASE_MEASURE:
                continue
            if seq >= len(counts):
                counts.extend(bytes(max(seq + 1 - len(counts), 1 << 20)))
            self.total[index] += 1
            n = counts[seq]
            if n == 0:
                self.distinct[index] += 1
                ms = int((now - float(m.group(3))) * 1000)
                self.window[self.failing[index]].add(ms)
                self.overall[self.failing[index]].add(ms)
            if n < 255:
                counts[seq] = n + 1

    def sample(self) -> dict[str, Any]:
        w, f = self.window
        self.window = [_Histogram(), _Histogram()]
        return {
            "distinct": list(self.distinct),
            "total": list(self.total),
            "posts": list(self.posts),
            "refused": list(self.refused),
            "p50_ms": w.percentile(50),
            "p99_ms": w.percentile(99),
            "max_ms": w.max_ms if w.n else None,
            "failing_p99_ms": f.percentile(99),
        }

    def final(self, sent: int, not_accepted: list[int]) -> dict[str, Any]:
        """Per consumer: lost (accepted, never received), duplicated, unexpected (received but
        the publisher saw the Notify fail, e.g. a timeout after the broker had taken it)."""
        rows = []
        for i, counts in enumerate(self.counts):
            if len(counts) < sent:
                counts.extend(bytes(sent - len(counts)))
            zeros = counts[:sent].count(0)
            unexpected = sum(1 for s in not_accepted if counts[s])
            rows.append(
                {
                    "consumer": i,
                    "received": self.distinct[i],
                    "lost": zeros - (len(not_accepted) - unexpected),
                    "duplicates": self.total[i] - self.distinct[i],
                    "unexpected": unexpected,
                    "beyond": sum(1 for c in counts[sent:] if c),
                    "posts": self.posts[i],
                    "refused": self.refused[i],
                }
            )
        h, f = self.overall
        return {
            "consumers": rows,
            "p50_ms": h.percentile(50),
            "p99_ms": h.percentile(99),
            "max_ms": h.max_ms if h.n else None,
            "failing_p50_ms": f.percentile(50),
            "failing_p99_ms": f.percentile(99),
            "failing_max_ms": f.max_ms if f.n else None,
        }


def _protocol_factory(index: int, sink: _Sink, fail_rate: float, fail_status: int) -> Any:
    import httptools

    failed = FAIL_RESPONSE % fail_status

    class Consumer(asyncio.Protocol):
        """A NotificationConsumer reduced to HTTP/1.1 keep-alive; a failing one refuses a share
        of the POSTs with an error status and forgets what they carried."""

        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)
            self.body: list[bytes] = []

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
            if fail_rate and random.random() < fail_rate:
                sink.refused[index] += 1
                self.transport.write(failed)
            else:
                sink.record(index, b"".join(self.body))
                self.transport.write(OK_RESPONSE)
            if not self.parser.should_keep_alive():
                self.transport.close()

    return Consumer


def consumers_main(conn: Any, fail_rates: list[float], fail_status: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    install_uvloop()
    asyncio.run(_consumers(conn, fail_rates, fail_status))


async def _consumers(conn: Any, fail_rates: list[float], fail_status: int) -> None:
    loop = asyncio.get_running_loop()
    sink = _Sink([rate > 0 for rate in fail_rates])
    servers, ports = [], []
    for i, rate in enumerate(fail_rates):
        server = await loop.create_server(
            _protocol_factory(i, sink, rate, fail_status),
            "127.0.0.1",
            0,
            backlog=1024,
            reuse_address=True,
        )
        servers.append(server)
        ports.append(server.sockets[0].getsockname()[1])
    conn.send(("ports", ports))
    # Commands are read in a thread, replies sent from the loop (as bench/e2e.py's consumer).
    while True:
        try:
            cmd, *args = await loop.run_in_executor(None, conn.recv)
        except (EOFError, OSError):
            break
        if cmd == "probe":
            conn.send(min(len(s) for s in sink.probe))
        elif cmd == "sample":
            conn.send(sink.sample())
        elif cmd == "distinct":
            conn.send(list(sink.distinct))
        elif cmd == "final":
            conn.send(sink.final(*args))
        elif cmd == "stop":
            conn.send("bye")
            break
    for server in servers:
        server.close()


class Consumers:
    """The consumer process and a lock around its pipe (the sampler thread asks it too)."""

    def __init__(self, fail_rates: list[float], fail_status: int) -> None:
        ctx = mp.get_context("fork")
        self.pipe, child_end = ctx.Pipe()
        self.proc = ctx.Process(
            target=consumers_main,
            args=(child_end, fail_rates, fail_status),
            name="consumers",
            daemon=True,
        )
        self.proc.start()
        # e2e's cleanup stops it (its "stop" answer is ignored).
        e2e.RUNNING.consumer, e2e.RUNNING.consumer_pipe = self.proc, self.pipe
        self.lock = threading.Lock()
        if not self.pipe.poll(60):
            raise RuntimeError("the consumer process did not start")
        tag, self.ports = self.pipe.recv()
        assert tag == "ports"

    def ask(self, *cmd: Any) -> Any:
        with self.lock:
            self.pipe.send(cmd)
            return self.pipe.recv()


# ============================================================================ sampling


class Sampler:
    """Every `every` seconds, one row of figures (and the CSV line), in a thread."""

    def __init__(
        self, plat: e2e.Platform, consumers: Consumers, args: argparse.Namespace, out: Path
    ) -> None:
        import redis

        self.plat, self.consumers, self.args = plat, consumers, args
        self.redis = redis.Redis(port=plat.redis_port)
        self.rows: list[dict[str, Any]] = []
        self.stage = "before"
        self.t0 = time.time()
        self.accepted = 0
        self._stop = threading.Event()
        self._cpu: dict[str, float] = {}
        self._cpu_t = time.time()
        self._fh = open(out, "w", newline="")  # noqa: SIM115 - closed by stop()
        self._csv: Any = None
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def pids(self) -> dict[str, list[int]]:
        p = self.plat
        out = {c.name: group_pids(c.pid) for c in (p.web, p.worker, p.beat, p.redis)}
        out["publisher"] = [m.pid for m in e2e.RUNNING.mp_children if m.pid and m.is_alive()]
        out["consumers"] = [self.consumers.proc.pid]
        return out

    def take(self) -> dict[str, Any]:
        now = time.time()
        row: dict[str, Any] = {
            "t_s": round(now - self.t0, 1),
            "time": time.strftime("%H:%M:%S"),
            "stage": self.stage,
        }
        pids = self.pids()
        cpu = {name: cpu_seconds(ps) for name, ps in pids.items()}
        wall = now - self._cpu_t
        for name in COMPONENTS:
            row[f"rss_mb_{name}"] = round(rss_bytes(pids[name]) / MB, 1)
        for name in COMPONENTS:
            row[f"fds_{name}"] = open_files(pids[name])
        for name in COMPONENTS:
            before = self._cpu.get(name)
            ok = before is not None and wall > 0 and cpu[name] >= before
            row[f"cpu_pct_{name}"] = round(100 * (cpu[name] - before) / wall, 1) if ok else ""
        self._cpu, self._cpu_t = cpu, now
        info = self.redis.info("memory")
        row["redis_used_memory_mb"] = round(info["used_memory"] / MB, 2)
        # What the keys hold, and the buffers of the connections (which the platform's
        # connection pools keep open once a load has opened them).
        row["redis_dataset_mb"] = round(info["used_memory_dataset"] / MB, 2)
        row["redis_clients_mb"] = round(info.get("mem_clients_normal", 0) / MB, 2)
        # The dashboard's per-second counters (kept 5 minutes, monitoring/counters.py): bounded
        # by time, not by the backlog, so the return to the starting size is judged without it.
        row["redis_monitoring_mb"] = round(keys_bytes(self.redis, MONITORING_KEYS) / MB, 2)
        # Where Redis's RSS goes beyond its used_memory (jemalloc): pages of live allocations
        # (active), pages resident but holding nothing (dirty pages the allocator keeps), and
        # what the process holds besides the allocator.
        row["redis_alloc_active_mb"] = round(info.get("allocator_active", 0) / MB, 2)
        row["redis_alloc_resident_mb"] = round(info.get("allocator_resident", 0) / MB, 2)
        row["redis_keys"] = self.redis.dbsize()
        row["db_mb"] = round(database_bytes(self.plat, self.args) / MB, 2)
        got = self.consumers.ask("sample")
        row["accepted"] = self.accepted or ""  # known when publishing ends
        row["received_min"] = min(got["distinct"])
        row["received_sum"] = sum(got["distinct"])
        # Each consumer's count, so a delay of one subscription shows apart from a slow platform.
        row["received_each"] = " ".join(map(str, got["distinct"]))
        row["duplicates_sum"] = sum(got["total"]) - sum(got["distinct"])
        row["refused_posts"] = sum(got["refused"])
        row["p50_ms"] = got["p50_ms"] if got["p50_ms"] is not None else ""
        row["p99_ms"] = got["p99_ms"] if got["p99_ms"] is not None else ""
        row["max_ms"] = got["max_ms"] if got["max_ms"] is not None else ""
        row["failing_p99_ms"] = got["failing_p99_ms"] if got["failing_p99_ms"] is not None else ""
        return row

    def record(self) -> dict[str, Any]:
        row = self.take()
        self.rows.append(row)
        if self._csv is None:
            self._csv = csv.DictWriter(self._fh, fieldnames=list(row))
            self._csv.writeheader()
        self._csv.writerow(row)
        self._fh.flush()
        return row

    def start(self) -> None:
        self.t0 = time.time()
        self._thread.start()

    def _run(self) -> None:
        next_at = time.time()
        while not self._stop.is_set():
            try:
                row = self.record()
            except Exception as exc:  # a failed sample must not end the soak
                log(f"sample failed: {type(exc).__name__}: {exc}")
            else:
                if len(self.rows) % 6 == 1:
                    log(
                        f"t={row['t_s']:.0f}s {row['stage']}: received min {row['received_min']}, "
                        f"redis {row['redis_used_memory_mb']} MB, db {row['db_mb']} MB, "
                        f"rss worker {row['rss_mb_worker']} MB, p99 {row['p99_ms']} ms"
                    )
            next_at += self.args.sample_every
            self._stop.wait(max(0.0, next_at - time.time()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        self._fh.close()
        self.redis.close()


MONITORING_KEYS = "hpwsn:mon:*"


def keys_bytes(r: Any, match: str) -> int:
    """What the keys matching a pattern hold (MEMORY USAGE, key and value)."""
    keys = list(r.scan_iter(match=match, count=1000))
    with r.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.memory_usage(key)
        return sum(n or 0 for n in pipe.execute())


_ID_SEGMENT = re.compile(r"^(?=.*\d)[0-9A-Za-z_.-]{6,}$")


def key_census(r: Any, limit: int = 100_000) -> dict[str, dict[str, int]]:
    """Redis's keys grouped by pattern (id-like segments as `*`): count, bytes and how many never
    expire, so what a run leaves behind can be named. Scans at most `limit` keys."""
    out: dict[str, dict[str, int]] = {}
    for n, key in enumerate(r.scan_iter(count=1000)):
        if n >= limit:
            break
        parts = key.decode(errors="replace").split(":")
        pattern = ":".join("*" if _ID_SEGMENT.match(p) else p for p in parts)
        with r.pipeline(transaction=False) as pipe:
            pipe.memory_usage(key)
            pipe.ttl(key)
            size, ttl = pipe.execute()
        row = out.setdefault(pattern, {"keys": 0, "bytes": 0, "no_ttl": 0})
        row["keys"] += 1
        row["bytes"] += size or 0
        row["no_ttl"] += ttl == -1
    return out


def print_census(before: dict[str, dict[str, int]], end: dict[str, dict[str, int]]) -> None:
    print("\nRedis keys by pattern, before publishing and at the end:")
    print(f"{'pattern':<40}{'keys':>8}{'bytes':>10}{'keys':>8}{'bytes':>10}{'no TTL':>8}")
    none = {"keys": 0, "bytes": 0, "no_ttl": 0}
    for pattern in sorted(set(before) | set(end), key=lambda p: -end.get(p, none)["bytes"]):
        a, b = before.get(pattern, none), end.get(pattern, none)
        print(
            f"{pattern[:39]:<40}{a['keys']:>8}{a['bytes']:>10}{b['keys']:>8}{b['bytes']:>10}"
            f"{b['no_ttl']:>8}"
        )


def database_bytes(plat: e2e.Platform, args: argparse.Namespace) -> int:
    """Size of the database: its files (SQLite, with the WAL) or pg_database_size."""
    if not args.database_url:
        return sum(f.stat().st_size for f in plat.data_dir.glob("hpwsn.sqlite3*") if f.is_file())
    import psycopg

    parts = urllib.parse.urlsplit(args.database_url)
    with psycopg.connect(args.database_url.replace(parts.scheme + "://", "postgresql://", 1)) as c:
        row = c.execute("select pg_database_size(current_database())").fetchone()
        return int(row[0]) if row else 0


# ============================================================================ the soak


def wait_until(check: Any, *, timeout: float, every: float = 1.0) -> bool:
    deadline = time.time() + timeout
    while True:
        if check():
            return True
        if time.time() > deadline:
            return False
        time.sleep(every)


def measure(plat: e2e.Platform, args: argparse.Namespace, report: dict[str, Any]) -> None:
    rates = [0.0] * (args.consumers - args.failing) + [args.fail_rate] * args.failing
    consumers = Consumers(rates, args.fail_status)
    for i, port in enumerate(consumers.ports):
        e2e.subscribe(plat, f"http://127.0.0.1:{port}/consumer/{i}")
    log(
        f"{args.consumers} consumers subscribed, {args.failing} answering {args.fail_status} to "
        f"{100 * args.fail_rate:g} % of their POSTs"
    )
    wsn_url = plat.base_url + "/wsn/"
    for seq in range(3):
        body = e2e.notify_body(wsn_url, PHASE_PROBE, range(seq, seq + 1), time.time())
        status, answer = e2e.http(wsn_url, body, e2e.NOTIFY_CT)
        if status != 202:
            raise RuntimeError(f"Notify on /wsn/ answered {status}: {answer[:500]!r}")
    if not wait_until(lambda: consumers.ask("probe") >= 3, timeout=180):
        raise RuntimeError("the probe notifications did not reach every consumer in 180 s")
    log("pipeline up; waiting 15 s for the platform to settle before the starting sample")
    time.sleep(15)

    out = Path(args.csv or ROOT / "bench" / "out" / f"soak-{time.strftime('%Y%m%d-%H%M%S')}.csv")
    out.parent.mkdir(parents=True, exist_ok=True)
    sampler = Sampler(plat, consumers, args, out)
    census_before = key_census(sampler.redis)
    sampler.start()  # the first row is the starting size
    try:
        time.sleep(1.0)
        sampler.stage = "publishing"
        log(f"publishing {args.rate:g} notifications/s for {args.duration:g} s; samples in {out}")
        pub = e2e.publish(
            wsn_url, phase=PHASE_MEASURE, duration=args.duration, args=args, base_url=plat.base_url
        )
        sampler.accepted = pub.ok
        end_of_publishing = len(sampler.rows)
        sampler.stage = "catching up"
        log(f"{pub.ok} accepted ({pub.ok / args.duration:.0f}/s); waiting for every consumer")
        last = [-1, time.time()]

        def caught_up() -> bool:
            got = min(consumers.ask("distinct"))
            if got != last[0]:
                last[:] = [got, time.time()]
            return got >= pub.ok or time.time() - last[1] > args.drain_idle

        wait_until(caught_up, timeout=args.drain_timeout)
        caught_up_after = time.time() - pub.last_done
        behind = [i for i, n in enumerate(consumers.ask("distinct")) if n < pub.ok]
        sampler.stage = "settling"
        start = sampler.rows[0]
        log(
            (f"consumer(s) {behind} still behind" if behind else "every consumer caught up")
            + f" {caught_up_after:.0f} s after publishing; up to {args.settle:g} s for "
            "Redis and the database to come back to their starting size"
        )

        def back() -> bool:
            rows = sampler.rows
            return len(rows) > end_of_publishing and _returned(start, rows[-1])

        wait_until(back, timeout=args.settle, every=args.sample_every)
        sampler.stage = "end"
        sampler.record()
        report["redis_keys_by_pattern"] = {
            "before": census_before,
            "end": key_census(sampler.redis),
        }
    finally:
        sampler.stop()

    sent = max(pub.ok_seqs) + 1 if pub.ok else 0
    accepted = bytearray(sent)
    for s in pub.ok_seqs:
        accepted[s] = 1
    not_accepted = [i for i, a in enumerate(accepted) if not a]
    final = consumers.ask("final", sent, not_accepted)
    report["csv"] = str(out)
    report["samples"] = sampler.rows
    report["publish"] = {
        "accepted": pub.ok,
        "errors": dict(pub.errors),
        "error_samples": pub.error_samples,
        "rate": round(pub.ok / max(pub.last_done - pub.first_send, 1e-9), 1),
    }
    report["consumers"] = final
    report["caught_up_after_s"] = round(caught_up_after, 1)
    report["behind"] = behind
    report["logs"] = e2e.scan_logs(plat)
    print_report(report, sampler.rows, end_of_publishing, args)
    print_census(**report["redis_keys_by_pattern"])


def _held(row: dict[str, Any]) -> dict[str, float]:
    """What the return to the starting size is judged on: Redis's dataset without the
    dashboard's time window, and the database."""
    return {
        "redis_dataset_mb": round(row["redis_dataset_mb"] - row["redis_monitoring_mb"], 2),
        "db_mb": row["db_mb"],
    }


def _returned(start: dict[str, Any], now: dict[str, Any]) -> bool:
    a, b = _held(start), _held(now)
    return all(b[k] <= a[k] * 1.10 + 1.0 for k in a)


def _growth(a: float, b: float) -> str:
    return f"{100 * (b - a) / a:+.1f} %" if a else "-"


def print_report(
    report: dict[str, Any], rows: list[dict[str, Any]], end_index: int, args: argparse.Namespace
) -> None:
    pub, final = report["publish"], report["consumers"]
    print()
    print(
        f"published {pub['accepted']} notifications ({pub['rate']:.0f}/s accepted, "
        f"{args.rate:g}/s offered), errors {pub['errors'] or 0}; "
        + (
            f"every consumer caught up {report['caught_up_after_s']:.0f} s after publishing ended"
            if not report["behind"]
            else f"consumer(s) {report['behind']} had NOT caught up "
            f"{report['caught_up_after_s']:.0f} s after publishing ended (--drain-idle, "
            "--drain-timeout): their 'lost' includes what was still queued for them"
        )
    )
    print(
        f"latency publish -> first receipt: consumers that never refuse p50 {final['p50_ms']} ms, "
        f"p99 {final['p99_ms']} ms, max {final['max_ms']} ms; refusing consumers p50 "
        f"{final['failing_p50_ms']} ms, p99 {final['failing_p99_ms']} ms, max "
        f"{final['failing_max_ms']} ms (receipts after {MAX_LATENCY_MS} ms count as that)"
    )
    print(
        f"\n{'consumer':<12}{'received':>10}{'lost':>8}{'duplicates':>12}{'unexpected':>12}"
        f"{'POSTs':>9}{'refused':>9}"
    )
    for c in final["consumers"]:
        name = f"{c['consumer']}" + (" (fails)" if c["refused"] else "")
        print(
            f"{name:<12}{c['received']:>10}{c['lost']:>8}{c['duplicates']:>12}"
            f"{c['unexpected']:>12}{c['posts']:>9}{c['refused']:>9}"
        )
    lost = sum(c["lost"] for c in final["consumers"])
    dups = sum(c["duplicates"] for c in final["consumers"])
    print(f"{'all':<12}{'':>10}{lost:>8}{dups:>12}")

    publishing = rows[1:end_index] if end_index > 1 else rows
    steady_at = min(args.steady_from, args.duration / 2)
    last_t = publishing[-1]["t_s"]
    # A sample is one instant: Redis's RSS moves by 10 % and more with the backlog of that second
    # (17-24 MB within a minute at 1,000/s). Growth compares the median of the first
    # --growth-window seconds from steady_at with that of the last --growth-window seconds.
    first_win = [r for r in publishing if steady_at <= r["t_s"] < steady_at + args.growth_window]
    last_win = [r for r in publishing if r["t_s"] > last_t - args.growth_window]
    first_win = first_win or publishing[:1]
    last_win = last_win or publishing[-1:]
    start, end = rows[0], rows[-1]
    growth = {}
    print(
        f"\ngrowth from t={steady_at:.0f} s to the end of publishing (t={last_t:.0f} s), "
        f"medians of {args.growth_window:g} s of samples at each end, goal < 5 % for RSS:"
    )
    print(
        f"{'figure':<26}{'start':>10}{'t=' + format(steady_at, '.0f'):>10}"
        f"{'end pub.':>10}{'growth':>10}{'after':>10}"
    )
    keys = [f"rss_mb_{c}" for c in COMPONENTS] + [f"fds_{c}" for c in COMPONENTS]
    keys += ["redis_used_memory_mb", "redis_dataset_mb", "redis_monitoring_mb", "redis_clients_mb"]
    keys += ["redis_alloc_active_mb", "redis_alloc_resident_mb", "redis_keys", "db_mb"]
    for k in keys:
        a = statistics.median(r[k] for r in first_win)
        b = statistics.median(r[k] for r in last_win)
        growth[k] = _growth(a, b)
        print(f"{k:<26}{start[k]:>10}{a:>10g}{b:>10g}{growth[k]:>10}{end[k]:>10}")
    report["growth"] = growth
    report["returned"] = {}
    # Judged on what the keys hold: used_memory also counts the buffers of the connections open
    # at the time (printed beside it), which follow the number of connections, not the backlog;
    # and the dashboard's per-second series fill their 5-minute window whatever the backlog.
    held = [_held(r) for r in (start, publishing[-1], end)]
    for k, label in (
        ("redis_dataset_mb", "Redis dataset without the dashboard's per-second counters"),
        ("db_mb", "database size"),
    ):
        a, b, c = (h[k] for h in held)
        ok = c <= a * 1.10 + 1.0
        report["returned"][k] = ok
        print(
            f"{label}: {a} MB before publishing, {b} MB at its end, "
            f"{c} MB after catching up and {args.settle:g} s more: "
            + ("back to the starting size" if ok else "NOT back to the starting size")
        )
    print(
        f"Redis used_memory: {start['redis_used_memory_mb']} MB before publishing, "
        f"{end['redis_used_memory_mb']} MB at the end, of which the connections' buffers "
        f"{end['redis_clients_mb']} MB (before: {start['redis_clients_mb']} MB)"
    )
    for name, info in report["logs"].items():
        if info["problems"]:
            print(f"{name} log: {info['problems']}")
            for ln in info["first"][:3]:
                print(f"  {ln[:200]}")
    print(f"samples: {report['csv']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=3600.0, help="seconds of publishing")
    p.add_argument("--rate", type=float, default=1000.0, help="notifications/s offered")
    p.add_argument("--consumers", type=int, default=10, help="push subscriptions, one port each")
    p.add_argument("--failing", type=int, default=1, help="consumers that refuse POSTs at times")
    p.add_argument("--fail-rate", type=float, default=0.05, help="share of their POSTs refused")
    p.add_argument(
        "--fail-status",
        type=int,
        default=503,
        help="HTTP status of a refused POST (503 and 429 make the broker wait at least "
        "HPWSN_RETRY_THROTTLED_MIN_S, 500 does not)",
    )
    p.add_argument("--sample-every", type=float, default=10.0, help="seconds between samples")
    p.add_argument(
        "--steady-from",
        type=float,
        default=600.0,
        help="growth is measured from here to the end (at most half of --duration)",
    )
    p.add_argument(
        "--growth-window", type=float, default=300.0, help="s of samples whose median is taken"
    )
    p.add_argument(
        "--settle",
        type=float,
        default=None,
        help="s to wait for Redis and the DB (default: the dedup window, HPWSN_DEDUP_WINDOW_S, "
        "and 60 s: a log row stays that long after its accept, for its idempotency key)",
    )
    p.add_argument(
        "--csv", default="", help="samples file (default bench/out/soak-<date>-<time>.csv)"
    )
    p.add_argument("--payload-bytes", type=int, default=1024, help="size of each payload")
    p.add_argument("--publishers-concurrency", type=int, default=32, help="in-flight Notify")
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
    p.add_argument("--json", default="", help="write the figures (and every sample) to this file")
    p.add_argument("--drain-idle", type=float, default=120.0, help="give up after s w/o progress")
    p.add_argument(
        "--drain-timeout", type=float, default=1800.0, help="give up catching up after s"
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary data dir and logs")
    args = p.parse_args(argv)
    if not 1 <= args.consumers <= 1000 or not 0 <= args.failing <= args.consumers:
        p.error("--consumers must be 1..1000 and --failing 0..--consumers")
    if not 400 <= args.fail_status <= 599:
        p.error("--fail-status must be a 4xx or 5xx status")
    if not 0 <= args.fail_rate < 1 or args.rate <= 0 or args.duration <= 0:
        p.error("--fail-rate must be in [0, 1), --rate and --duration positive")
    # bench/e2e.py's platform and publisher read its own options from the namespace.
    merged = e2e.parse_args([])
    merged.publisher_procs = 1
    merged.messages_per_notify = 1
    merged.reliability = "reliable"
    merged.monitoring_compare = False
    merged.events_compare = False
    merged.compare_reliability = False
    for key, value in vars(args).items():
        setattr(merged, key, value)
    return merged


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.settle is None:
        args.settle = float(os.environ.get("HPWSN_DEDUP_WINDOW_S", "300")) + 60.0
    config = {
        "duration_s": args.duration,
        "rate": args.rate,
        "consumers": args.consumers,
        "failing": f"{args.failing} at {100 * args.fail_rate:g} % (HTTP {args.fail_status})",
        "payload_bytes": args.payload_bytes,
        "reliability": "reliable",
        "web_workers": args.web_workers,
        "worker_concurrency": args.worker_concurrency,
        "database": "PostgreSQL" if args.database_url else "SQLite (temporary)",
        "sample_every_s": args.sample_every,
    }
    return e2e.run_benchmark(args, config, measure, prefix="hpwsn-soak-")


if __name__ == "__main__":
    sys.exit(main())
