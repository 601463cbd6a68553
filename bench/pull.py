"""What a pull point's GetMessages costs the web process, in process, against parsing it alone.

    .venv/bin/python -m bench.pull --redis-url redis://127.0.0.1:6379/11 [--notifications 1280]
        [--callgrind] [--in-flight 32]

A consumer that pulls (WS-Notification's PullPoint, ONVIF's PullMessages) polls: most of its
GetMessages find nothing new. `--in-flight` pull points (32), each with a subscription feeding it
and nothing queued, are polled at once, one GetMessages each at a time, through the ASGI route of
/wsn/pullpoints/<id> (hpwsn_site/fastpath.py), on a new SQLite database in a temporary directory;
the Redis database given is flushed (never give database 0). The baseline, in the same run and
through the same route, is `/bench/echo/` with the same envelopes: it reads and parses them as
/wsn/ does, and answers 202. `poll-1` is `poll` with one SOAP thread (`HPWSN_WEB_SOAP_THREADS=1`),
as every call's database work ran before the process had a few. `--notifications` counts the
measured GetMessages of each phase.

Each phase runs in a process of its own, after a warm-up of ten rounds. Without `--callgrind` it
prints the CPU time of the process a call (every thread: the database work runs on another), which
the load of a shared machine moves; with it (Debian's `valgrind`), the instructions of the measured
calls only, as `bench.accept` counts them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    asgi_post,
    callgrind_control,
    counted_phases,
    django_in_process,
    phases_print,
)

PHASES = ("echo", "poll", "poll-1")
CONCURRENCY = 32
WARMUP_ROUNDS = 10


async def _measure(phase: str, rounds: int, addresses: list[str]) -> dict[str, Any]:
    from hpwsn.client import _Protocol
    from hpwsn_site.fastpath import BENCH_ECHO, wrap

    async def django_app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError(f"{scope['path']} went to Django, not to the SOAP route")

    app = wrap(django_app)
    protocol = _Protocol("http://bench/wsn/", soap_version="1.2", username=None, password=None)
    ops = [protocol.get_messages(address, None) for address in addresses]
    expected = 202 if phase == "echo" else 200  # poll-1: the same calls as poll

    async def one(op: Any) -> None:
        path = BENCH_ECHO if phase == "echo" else op.url.removeprefix("http://bench")
        status = await asgi_post(app, path, op.body, op.headers["Content-Type"])
        if status != expected:
            raise RuntimeError(f"{path} answered {status}")

    async def run(count: int) -> None:
        for _r in range(count):
            await asyncio.gather(*(one(op) for op in ops))

    await run(WARMUP_ROUNDS)
    callgrind_control("--zero")
    callgrind_control("--instr=on")
    cpu, wall = time.process_time(), time.perf_counter()
    await run(rounds)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    callgrind_control("--instr=off")
    callgrind_control("--dump")
    n = rounds * len(ops)
    return {"phase": phase, "notifications": n, "cpu_ms": cpu / n * 1e3, "rate": n / wall}


def child(phase: str, rounds: int, redis_url: str, in_flight: int) -> None:
    """One phase in this process: prints its figures as one JSON line."""
    data_dir = Path(tempfile.mkdtemp(prefix="hpwsn-bench-pull-"))
    os.environ["HPWSN_BENCH_ENDPOINTS"] = "1"
    if phase == "poll-1":  # every call's database work on one thread, as before the pool
        os.environ["HPWSN_WEB_SOAP_THREADS"] = "1"
    try:
        django_in_process(data_dir, redis_url)
        from hpwsn.wsn import TopicRef
        from hpwsn_site import state
        from subscriptions.services import pull_point_create, subscription_create
        from topics.services import topics_load_demo

        state.get_redis().flushdb()
        topics_load_demo()
        addresses = []
        for _i in range(in_flight):
            pp = pull_point_create(base_url="http://bench")
            subscription_create(
                consumer_address=pp.address,
                topic=TopicRef(text="ALL", dialect=None, nsmap={}),
                content=None,
                initial_termination_time=None,
                soap_version="1.2",
                use_raw=False,
                base_url="http://bench",
            )
            addresses.append(pp.address)
        print(json.dumps(asyncio.run(_measure(phase, rounds, addresses))), flush=True)
        state.get_redis().flushdb()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    counted = counted_phases("bench.pull", __doc__, PHASES, CONCURRENCY, child, in_flight=True)
    if counted is None:
        return
    args, rows = counted
    phases_print(rows, callgrind=args.callgrind, per="a call", count="calls")
    print(
        f"GetMessages to {args.in_flight} empty pull points at a time through the ASGI route of "
        f"/wsn/pullpoints/<id> (echo: /bench/echo/), after {WARMUP_ROUNDS} warm-up rounds; SQLite"
        + ("; the rate is valgrind's, not the machine's" if args.callgrind else "")
    )


if __name__ == "__main__":
    main()
