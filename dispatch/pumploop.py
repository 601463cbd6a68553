"""The pump loop: each worker process pushes to many subscriptions at once.

Every pool process of a Celery worker runs one loop (started by `hpwsn_site.celery` when the
process starts): a thread takes subscription ids off the ready list (dispatch/ready.py) and
hands each to one of `HPWSN_PUMP_THREADS` pump threads, so that many subscriptions have a push
in flight together while each subscription has at most one (its fenced lease,
dispatch/pump.py). It takes ids only for the threads that are free, so another process serves
the rest, and takes as many as are free in one round trip. A pump drains its subscription for at
most `HPWSN_PUMP_SLICE_S` and then goes to the back of the ready list if work is left: a
thousand busy subscriptions share the threads in turn. Their database work goes to
`HPWSN_PUMP_DB_THREADS` threads, whose connections they share (hpwsn_site/dblane.py).

Celery keeps the fan-out, the sweeps and everything periodic; the loop replaces one Celery task
per push (a broker round trip and a pool slot each) with a share of one take.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings
from django.db import close_old_connections
from redis.exceptions import RedisError

from dispatch.pump import Pump
from hpwsn_site import state
from hpwsn_site.dblane import DbLane

log = logging.getLogger(__name__)

# The first ARGV[2] ids of the ready list (KEYS[1]), their scheduled marks (in KEYS[2]) stamped
# with the time their pumps start (ARGV[1]). Until a pump takes the lease the stall sweep sees an
# id neither waiting nor leased, and a mark as old as its wait on the list, which under a long
# list is longer than the sweep's grace: the stamp tells it that a pump has just started. Used
# while ids wait; an empty list is waited on with BLPOP. A take is one round trip for as many
# ids as there are free threads (two for the id that shows ids are waiting: a BLPOP answered at
# once, then its stamp).
_TAKE = state.Script("""
local sids = redis.call('lpop', KEYS[1], ARGV[2])
if not sids then return {} end
local marks = {}
for i, sid in ipairs(sids) do
  marks[2 * i - 1] = sid
  marks[2 * i] = ARGV[1]
end
redis.call('hset', KEYS[2], unpack(marks))
return sids
""")

# A BLPOP that answers sooner than this found the list not empty.
_AT_ONCE_S = 0.01


def _pump(sid: str) -> None:
    Pump(sid).run(max_run=settings.HPWSN_PUMP_SLICE_S)


class PumpLoop:
    def __init__(
        self,
        threads: int,
        *,
        db_threads: int = 2,
        lock_timeout_s: float = 5.0,
        pump: Callable[[str], None] = _pump,
    ) -> None:
        self.threads = threads
        self.pump = pump
        self.free = threading.Semaphore(threads)
        # The pumps' database work on the connections of a few threads (hpwsn_site/dblane.py).
        self.lane = DbLane("hpwsn-pump-db", db_threads, lock_timeout_s=lock_timeout_s)
        self.pool = ThreadPoolExecutor(
            threads, thread_name_prefix="hpwsn-pump", initializer=self.lane.serve_from_here
        )
        self.stopping = threading.Event()
        self.backlog = False  # the last take found ids waiting: take the next with `_TAKE`
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self.serve, name="hpwsn-pump-loop", daemon=True)
        self.thread.start()

    def stop(self, timeout: float) -> None:
        """Take no more work and wait up to `timeout` for the pushes in flight."""
        self.stopping.set()
        deadline = time.monotonic() + timeout
        for _ in range(self.threads):  # every slot free again: nothing in flight
            if not self.free.acquire(timeout=max(0.0, deadline - time.monotonic())):
                log.warning("pump loop stops with pushes in flight (their leases expire)")
                break
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.lane.shutdown()

    def serve(self) -> None:
        r = state.get_redis()
        while not self.stopping.is_set():
            if not self.free.acquire(timeout=1.0):
                continue
            free = 1
            while free < self.threads and self.free.acquire(blocking=False):
                free += 1
            sids = self._take(r, free)
            for _ in range(free - len(sids)):
                self.free.release()
            # Even when this process pumps it now: that pump may be past its last look at the
            # queue, and a wake-up dropped here would wait for the safety net (seconds). The
            # lease makes a second pump return at once if the first still drains.
            for sid in sids:
                self.pool.submit(self._run, sid)

    def _take(self, r: Any, count: int = 1) -> list[str]:
        """Up to `count` ids off the ready list: at once while ids wait, else the first to come
        (waited for up to a second)."""
        try:
            if self.backlog:
                sids = _TAKE(r, 2, state.READY, state.SCHED, repr(time.time()), count)
                if sids:
                    return [sid.decode() for sid in sids]
                self.backlog = False
            waited = time.monotonic()
            found = r.blpop([state.READY], timeout=1)
            if found is None:
                return []
            sid = found[1]
            if time.monotonic() - waited < _AT_ONCE_S:
                # Found without waiting: ids may be queued behind it, this one among them for
                # long; it gets its stamp, and the ids after it are taken with theirs. An id
                # waited for was put there a moment ago, with its mark (dispatch/ready.py).
                r.hset(state.SCHED, sid, repr(time.time()))
                self.backlog = True
        except RedisError:
            log.warning("pump loop cannot read the ready list", exc_info=True)
            time.sleep(1.0)
            return []
        return [sid.decode()]

    def _run(self, sid: str) -> None:
        try:
            close_old_connections()  # any connection a pump thread opened outside the lane
            self.pump(sid)
        except Exception:  # the loop goes on; the stall sweep runs the subscription again
            log.exception("pump of %s raised", sid)
        finally:
            self.free.release()


_loop: PumpLoop | None = None


def pump_loop_start() -> PumpLoop:
    """Start this process's pump loop (once)."""
    global _loop
    if _loop is None:
        _loop = PumpLoop(
            settings.HPWSN_PUMP_THREADS,
            db_threads=settings.HPWSN_PUMP_DB_THREADS,
            lock_timeout_s=settings.HPWSN_DB_LOCK_TIMEOUT_S,
        )
        _loop.start()
    return _loop


def pump_loop_stop(timeout: float = 5.0) -> None:
    global _loop
    if _loop is not None:
        _loop.stop(timeout)
        _loop = None
