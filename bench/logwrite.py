"""What writing reliable notifications to the database log costs the web, per message, in process.

    .venv/bin/python -m bench.logwrite [--database-url postgres://.../hpwsn_logwrite_bench]

Every notification of a `reliable` topic is committed to `StoredMessage` before the publisher
gets its answer (dispatch/reliable.py), so this write is on the path of every reliable publish.
This times, alternately in one run, `dispatch.reliable.messages_store` with the `LogEntry` rows
the accept path builds, each with an idempotency key as a Notify with a wsa:MessageID has,
against the baseline it replaced on PostgreSQL: the same write in steps (BEGIN, the lock, the
read of the keys, the insert, COMMIT: five round trips, where `messages_store` sends one query).
SQLite writes in steps either way, so there both columns time the same code. Batches of 1, 10
and 100 messages (a group commit puts concurrent requests into one batch), on a connection in
autocommit as the log's thread has it. Figures are CPU time of this process per message
(`time.process_time`: waiting for the database or a core is not counted) and wall time per
message, best of the rounds. SQLite in a temporary directory by default; `--database-url` a
PostgreSQL database whose name contains `bench` (its log is emptied).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import django_in_process

PAYLOAD = b"<wsnt:NotificationMessage>" + b"x" * 400 + b"</wsnt:NotificationMessage>"


def django_on(database_url: str | None, data_dir: Path) -> str:
    if database_url is None:
        django_in_process(data_dir, "redis://127.0.0.1:6379/11")
        return "SQLite"
    if "bench" not in database_url.rsplit("/", 1)[-1]:
        raise SystemExit("the log is emptied: give a database whose name contains 'bench'")
    os.environ.update(
        {
            "DATABASE_URL": database_url,
            "HPWSN_DATA_DIR": str(data_dir),
            "DJANGO_SETTINGS_MODULE": "hpwsn_site.settings",
        }
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return "PostgreSQL"


def baseline_store(rows: list[Any]) -> None:
    """The write in steps, as PostgreSQL had it (and SQLite has it)."""
    from dispatch.reliable import LogEntry, _store_in_steps

    entries = [LogEntry(**r) for r in rows]
    _store_in_steps(entries, [e.idempotency_key for e in entries if e.idempotency_key])


def new_store(rows: list[Any]) -> None:
    from dispatch.reliable import LogEntry, messages_store

    messages_store(messages=[LogEntry(**r) for r in rows])


def batch(n: int) -> list[dict[str, Any]]:
    now = time.time()
    return [
        {
            "notification_id": uuid.uuid4().hex,
            "topic_path": "ALL:ALARM:ALARM1",
            "priority": 4,
            "payload": PAYLOAD,
            "accepted_at": now,
            "expires_at": now + 3600,
            "idempotency_key": f"urn:uuid:{uuid.uuid4()}#0",
        }
        for _ in range(n)
    ]


def per_message(
    store: Callable[[list[Any]], None], size: int, messages: int
) -> tuple[float, float]:
    """CPU and wall microseconds per message to write `messages` messages in batches of `size`."""
    batches = [batch(size) for _ in range(max(1, messages // size))]
    c0, w0 = time.process_time(), time.perf_counter()
    for rows in batches:
        store(rows)
    n = len(batches) * size
    return (time.process_time() - c0) / n * 1e6, (time.perf_counter() - w0) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--messages", type=int, default=3000, help="per batch size and round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpwsn-logwrite-") as tmp:
        db = django_on(args.database_url, Path(tmp))
        from dispatch.models import StoredMessage

        print(f"\n{db}: µs per message, best of {args.rounds} rounds (CPU of this process / wall)")
        print(f"{'batch':>6} {'steps CPU':>16} {'one CPU':>9} {'CPU ratio':>10}"
              f" {'steps wall':>17} {'one wall':>9}")  # fmt: skip
        for size in (1, 10, 100):
            best: dict[str, tuple[float, float]] = {}
            for _ in range(args.rounds):  # alternately, so a drift of the machine hits both
                for name, store in (("old", baseline_store), ("new", new_store)):
                    StoredMessage.objects.all().delete()
                    cpu, wall = per_message(store, size, args.messages)
                    prev = best.get(name, (cpu, wall))
                    best[name] = (min(prev[0], cpu), min(prev[1], wall))
            (oc, ow), (nc, nw) = best["old"], best["new"]
            print(f"{size:>6} {oc:>16.1f} {nc:>9.1f} {oc / nc:>9.2f}x {ow:>17.1f} {nw:>9.1f}")
        StoredMessage.objects.all().delete()


if __name__ == "__main__":
    main()
