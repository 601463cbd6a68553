"""What sending the pump threads' database work to a lane costs, against each thread's own
connection, in process.

    .venv/bin/python -m bench.dblane --redis-url redis://127.0.0.1:6379/11 \\
        --database-url postgres://hpwsn:hpwsn@127.0.0.1:5432/hpwsn_pull_bench [--batches 4000]

A pool process's pump threads reach the database mostly to store dead letters: a consumer that
refuses every push for good sends every batch there (dispatch/pump.py `_bury`). Here 16 threads
(`HPWSN_PUMP_THREADS`) store batches of 10 dead letters as fast as they can, in rounds that
alternate the ways: `own`, each thread on its own connection (as before the lane); `lane-2` and
`lane-1`, through a lane of 2 or 1 threads (hpwsn_site/dblane.py). It prints batches a second,
the process's CPU time a batch and the connections each way opened. The rows stay in the given
database (`--database-url`; a new SQLite one without it).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import django_in_process, spare_redis_url

THREADS = 16
LETTERS = 10
WAYS = ("own", "lane-2", "lane-1")


def _store(n: int) -> int:
    """One batch of dead letters, as `_bury` stores it; the connection's server process."""
    from django.db import connection

    from dispatch.deliver import dead_letter_store
    from subscriptions.selectors import SubEntry

    entry = SubEntry(
        id=str(uuid.uuid4()), mode="push", consumer_address="http://127.0.0.1:9/refuses",
        reference_address="", pull_point_id=None, soap_version="1.2", use_raw=False,
        signing_secret="", paused=False, termination_ts=None, content_filter=None,
    )  # fmt: skip
    live = [(f"{n}-{i}", b"<m xmlns='urn:bench'>refused</m>") for i in range(LETTERS)]
    dead_letter_store(entry=entry, live=live, reason="permanent", attempts=[], redriven=[])
    return id(connection.connection)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--database-url", help="a database to use instead of a new SQLite one")
    parser.add_argument("--batches", type=int, default=4000, help="measured, each way")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    if args.database_url:
        os.environ["HPWSN_BENCH_DATABASE_URL"] = args.database_url
    data_dir = Path(tempfile.mkdtemp(prefix="hpwsn-bench-dblane-"))
    django_in_process(data_dir, spare_redis_url(args.redis_url))

    from hpwsn_site.dblane import DbLane, on_db

    lanes = {"lane-2": DbLane("bench-lane-2", 2), "lane-1": DbLane("bench-lane-1", 1)}
    pools = {
        way: ThreadPoolExecutor(
            THREADS, initializer=lanes[way].serve_from_here if way in lanes else None
        )
        for way in WAYS
    }
    wall = dict.fromkeys(WAYS, 0.0)
    cpu = dict.fromkeys(WAYS, 0.0)
    connections: dict[str, set[int]] = {way: set() for way in WAYS}
    lock = threading.Lock()

    def batches(way: str, count: int) -> None:
        def one(n: int) -> None:
            conn = on_db(_store, n)
            with lock:
                connections[way].add(conn)

        t0, c0 = time.perf_counter(), time.process_time()
        list(pools[way].map(one, range(count)))
        wall[way] += time.perf_counter() - t0
        cpu[way] += time.process_time() - c0

    for way in WAYS:  # warm-up: connections, the first statements
        batches(way, THREADS * 4)
        wall[way] = cpu[way] = 0.0
    per_round = max(1, args.batches // args.rounds)
    for _ in range(args.rounds):  # the ways in turn, so a drift of the machine spreads over all
        for way in WAYS:
            batches(way, per_round)
    measured = per_round * args.rounds
    rows: list[tuple[str, Any, Any, Any]] = [("way", "batches/s", "CPU ms a batch", "connections")]
    for way in WAYS:
        rows.append(
            (
                way,
                f"{measured / wall[way]:,.0f}",
                f"{cpu[way] / measured * 1e3:.2f}",
                len(connections[way]),
            )
        )
    for row in rows:
        print(f"{row[0]:<8} {row[1]:>10} {row[2]:>15} {row[3]:>12}")
    for way in lanes:
        print(f"{way} / own: {wall['own'] / wall[way]:.2f} x the batches a second")


if __name__ == "__main__":
    main()
