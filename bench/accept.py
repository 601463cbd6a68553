"""What accepting a notification costs the web process, in process, against parsing it alone.

    .venv/bin/python -m bench.accept --redis-url redis://127.0.0.1:6379/11 [--notifications 1280]
        [--callgrind] [--in-flight 32]

The web's side of `bench.e2e` without the HTTP server: the same one-message SOAP Notify goes
through the ASGI route of /wsn/ (hpwsn_site/fastpath.py), 32 requests at a time as the e2e
publisher keeps them in flight (`--in-flight`: 1 is a publisher that waits for each answer, where
each reliable notification is a group commit of its own), and is stored: for a `reliable` topic
in the database log (a new SQLite database in a temporary directory) and in Redis, for a `fast`
one in Redis alone (the spare database given: it is flushed, so never give database 0). No worker
runs. The baseline, in the same run and through the same route, is `/bench/echo/`: it reads and
parses the envelope as /wsn/ does, and answers 202.

Each phase runs in a process of its own, after a warm-up of ten rounds. Without `--callgrind` it
prints the CPU time of the process a notification (every thread: the log's commits run in one),
which the load of a shared machine moves by up to twice from one half hour to the next. With
`--callgrind` each phase runs under `valgrind --tool=callgrind`, counting instructions during the
measured calls only (`callgrind_control -i on` and `off`): a count that stays within a few per
cent from run to run whatever else the machine does, so a change to the accept path can be
measured before and after on a busy machine. The count is not a time; it is the work.
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
from bench.e2e import NOTIFY_CT, notify_body

PHASES = ("echo", "reliable", "fast")
CONCURRENCY = 32
WARMUP_ROUNDS = 10


async def _measure(phase: str, rounds: int, in_flight: int) -> dict[str, Any]:
    from hpwsn_site.fastpath import BENCH_ECHO, wrap

    async def django_app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError(f"{scope['path']} went to Django, not to the SOAP route")

    app = wrap(django_app)
    path = BENCH_ECHO if phase == "echo" else "/wsn/"
    total = in_flight * (WARMUP_ROUNDS + rounds)
    bodies = [notify_body("http://bench/wsn/", 1, range(i, i + 1), 1.7e9 + i) for i in range(total)]

    async def one(body: bytes) -> None:
        status = await asgi_post(app, path, body, NOTIFY_CT)
        if status != 202:
            raise RuntimeError(f"{path} answered {status}")

    async def run(first: int, count: int) -> None:
        for r in range(first, first + count):
            start = r * in_flight
            await asyncio.gather(*(one(b) for b in bodies[start : start + in_flight]))

    await run(0, WARMUP_ROUNDS)
    callgrind_control("--zero")
    callgrind_control("--instr=on")
    cpu, wall = time.process_time(), time.perf_counter()
    await run(WARMUP_ROUNDS, rounds)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    callgrind_control("--instr=off")
    callgrind_control("--dump")
    n = rounds * in_flight
    return {"phase": phase, "notifications": n, "cpu_ms": cpu / n * 1e3, "rate": n / wall}


def child(phase: str, rounds: int, redis_url: str, in_flight: int) -> None:
    """One phase in this process: prints its figures as one JSON line."""
    data_dir = Path(tempfile.mkdtemp(prefix="hpwsn-bench-accept-"))
    os.environ["HPWSN_BENCH_ENDPOINTS"] = "1"
    try:
        django_in_process(data_dir, redis_url)
        from hpwsn_site import state
        from topics.models import Topic
        from topics.services import topics_load_demo

        state.get_redis().flushdb()
        topics_load_demo()
        policy = "fast" if phase == "fast" else "reliable"
        Topic.objects.filter(path="ALL").update(reliability=policy)
        print(json.dumps(asyncio.run(_measure(phase, rounds, in_flight))), flush=True)
        state.get_redis().flushdb()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    counted = counted_phases("bench.accept", __doc__, PHASES, CONCURRENCY, child, in_flight=True)
    if counted is None:
        return
    args, rows = counted
    phases_print(rows, callgrind=args.callgrind, per="a notification", count="notifications")
    print(
        f"{args.in_flight} requests at a time through the ASGI route of /wsn/ (echo: "
        f"/bench/echo/), after {WARMUP_ROUNDS * args.in_flight} warm-up requests; SQLite; no worker"
        + ("; the rate is valgrind's, not the machine's" if args.callgrind else "")
    )


if __name__ == "__main__":
    main()
