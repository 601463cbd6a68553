"""What delivering a notification costs the worker, in process, counted in instructions.

    .venv/bin/python -m bench.deliver --redis-url redis://127.0.0.1:6379/11 [--notifications 1280]
        [--in-flight 32] [--callgrind]

The worker's side of `bench.e2e`: one subscription on the demo root `ALL`, pushed to a consumer on
127.0.0.1 (a process of its own that answers every POST with 200 at once); 32 notifications
(`--in-flight`) are accepted, then fanned out (`fanout_run`) and pushed (`pump_run`), round after
round, so that a push carries a batch about the size the e2e consumer receives (with 1, each
notification is a fan-out and a push of its own, as at a trickle). For a `fast` topic (Redis) and a
`reliable` one (the database log on a new SQLite database in a temporary directory, and Redis).
The Redis database given is flushed: never give database 0.

Only the fan-out and the push are measured, not the accept: without `--callgrind` the CPU time of
the process a notification delivered; with it (Debian's `valgrind`), each phase runs under
`valgrind --tool=callgrind` and counts the instructions of the fan-outs and pushes alone
(`callgrind_control -i on` and `off` around them), a count that the machine's load does not move.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    callgrind_control,
    counted_phases,
    django_in_process,
    free_port,
)
from bench.e2e import NOTIFY_CT, notify_body

PHASES = ("fast", "reliable")
ROUND = 32
WARMUP_ROUNDS = 5

# The consumer: HTTP/1.1 keep-alive, 200 and no body for every request, as fast as asyncio goes.
CONSUMER = r"""
import asyncio, sys

async def serve(reader, writer):
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

async def main(port):
    server = await asyncio.start_server(serve, "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()

try:
    asyncio.run(main(int(sys.argv[1])))
except (KeyboardInterrupt, asyncio.IncompleteReadError):
    pass
"""


def _accept(loop: asyncio.AbstractEventLoop, r: int, size: int) -> None:
    """Round `r`'s `size` notifications, accepted as the web accepts them, all at once."""
    from hpwsn_site.soap import soap_exchange

    bodies = [
        notify_body("http://bench/wsn/", 1, range(i, i + 1), 1.7e9 + i)
        for i in range(r * size, (r + 1) * size)
    ]

    async def run() -> list[Any]:
        return await asyncio.gather(
            *(soap_exchange(data=b, ctype=NOTIFY_CT, base="http://bench", resource_id=None)
              for b in bodies)
        )  # fmt: skip

    done = loop.run_until_complete(run())
    if any(ex.status != 202 for ex in done):
        raise RuntimeError(f"a Notify was refused: {done[0].body[:300]!r}")


def _measure(sub_id: str, rounds: int, size: int) -> dict[str, Any]:
    from dispatch.fanout import fanout_run
    from dispatch.pump import pump_run

    delivered = 0
    cpu = 0.0
    loop = asyncio.new_event_loop()  # the web's, kept for every round (and its Redis client)
    for r in range(WARMUP_ROUNDS + rounds):
        _accept(loop, r, size)
        measured = r >= WARMUP_ROUNDS
        if measured:
            callgrind_control("--instr=on")
            t0 = time.process_time()
        fanout_run(linger=0, max_run=60)
        n = pump_run(subscription_id=sub_id)
        if measured:
            cpu += time.process_time() - t0
            callgrind_control("--instr=off")
            delivered += n
    loop.close()
    if delivered != rounds * size:
        raise RuntimeError(f"{delivered} of {rounds * size} notifications were delivered")
    return {"notifications": delivered, "cpu_ms": cpu / delivered * 1e3}


def child(phase: str, rounds: int, redis_url: str, in_flight: int) -> None:
    """One phase in this process: prints its figures as one JSON line."""
    data_dir = Path(tempfile.mkdtemp(prefix="hpwsn-bench-deliver-"))
    port = free_port()
    consumer = subprocess.Popen(
        [sys.executable, "-c", CONSUMER, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        if consumer.stdout is None or consumer.stdout.readline().strip() != "ready":
            raise RuntimeError("the consumer did not start")
        django_in_process(data_dir, redis_url)
        from hpwsn.wsn import TopicRef
        from hpwsn_site import state
        from subscriptions.services import subscription_create
        from topics.models import Topic
        from topics.services import topics_load_demo

        state.get_redis().flushdb()
        topics_load_demo()
        Topic.objects.filter(path="ALL").update(reliability=phase)
        sub, _created = subscription_create(
            consumer_address=f"http://127.0.0.1:{port}/consumer",
            topic=TopicRef(text="ALL", dialect=None, nsmap={}),
            content=None,
            initial_termination_time=None,
            soap_version="1.2",
            use_raw=False,
            base_url="http://bench",
        )
        callgrind_control("--zero")
        row = {"phase": phase, **_measure(str(sub.id), rounds, in_flight)}
        callgrind_control("--dump")
        print(json.dumps(row), flush=True)
        state.get_redis().flushdb()
    finally:
        consumer.terminate()
        consumer.wait(10)
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    counted = counted_phases("bench.deliver", __doc__, PHASES, ROUND, child, in_flight=True)
    if counted is None:
        return
    args, rows = counted
    label = "instructions a notification" if args.callgrind else "CPU ms a notification"
    print(f"{'phase':<10} {'notifications':>13} {label:>28}")
    for r in rows:
        value = f"{r['instructions']:,.0f}" if args.callgrind else f"{r['cpu_ms']:.3f}"
        print(f"{r['phase']:<10} {r['notifications']:>13} {value:>28}")
    print(
        f"fan-out and push of {args.in_flight} notifications a round to one consumer on "
        f"127.0.0.1, after {WARMUP_ROUNDS} rounds of warm-up; the accept not counted; SQLite"
    )


if __name__ == "__main__":
    main()
