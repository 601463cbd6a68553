"""The node registry's heartbeat: every process says who it is and how it is doing.

Each web process (when the ASGI app is built), each Celery worker (its main process; the figures
cover its pool) and beat starts one daemon thread that writes a record to Redis every
`HPWSN_HEARTBEAT_S` seconds with psutil figures of its process tree. A restarted process is a new
node (a new pid and start time); the old one turns dead and stays listed until pruned.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import threading
import time
from typing import Any

from monitoring.counters import stop_thread
from monitoring.services import node_heartbeat, node_mark_stopped

log = logging.getLogger(__name__)


class _Sampler:
    """CPU, memory, threads and file descriptors of a process and its children."""

    def __init__(self, pid: int) -> None:
        import psutil

        self._psutil = psutil
        self.proc = psutil.Process(pid)
        self.proc.cpu_percent(None)  # the first call only starts the measurement
        self.children: dict[int, Any] = {}

    def sample(self) -> dict[str, float | int]:
        psutil = self._psutil
        procs = [self.proc]
        with contextlib.suppress(psutil.Error):
            seen = {}
            for child in self.proc.children(recursive=True):
                known = self.children.get(child.pid)
                if known is None:
                    child.cpu_percent(None)
                    known = child
                seen[child.pid] = known
            self.children = seen
            procs += list(seen.values())
        cpu = rss = threads = fds = 0.0
        alive = 0
        for p in procs:
            try:
                with p.oneshot():
                    cpu += p.cpu_percent(None)
                    rss += p.memory_info().rss
                    threads += p.num_threads()
                    fds += p.num_fds()
                alive += 1
            except psutil.Error:
                continue
        return {
            "cpu": round(cpu, 1),
            "rss": int(rss),
            "threads": int(threads),
            "fds": int(fds),
            "procs": alive,
        }


class Heartbeat:
    def __init__(self, *, role: str, name: str, pool: int | None) -> None:
        from django.conf import settings

        import hpwsn

        self.interval = float(settings.HPWSN_HEARTBEAT_S)
        self.started = time.time()
        self.pid = os.getpid()
        host = socket.gethostname()
        node = str(settings.HPWSN_NODE_NAME)
        self.node_id = f"{host}:{self.pid}:{int(self.started * 1000)}"
        self.identity: dict[str, Any] = {
            "id": self.node_id,
            "host": host,
            "pid": self.pid,
            "role": role,
            # HPWSN_NODE_NAME: the machine's process set this process belongs to (a site may
            # run several on one host).
            "node": node,
            "name": name or f"{role}@{node}",
            "version": hpwsn.__version__,
            "started": round(self.started, 3),
            "pool": pool,
            "interval": self.interval,
            "dead_after": float(settings.HPWSN_NODE_DEAD_AFTER_S),
        }
        self._sampler = _Sampler(self.pid)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        node_heartbeat(
            node_id=self.node_id,
            record={**self.identity, **self._sampler.sample()},
            now=time.time(),
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.beat()
            except Exception as exc:  # Redis away: try again next period
                log.warning("heartbeat of %s not written: %s", self.node_id, exc)
            self._stop.wait(self.interval)

    def start(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._run, name="hpwsn-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        stop_thread(self._thread, self._stop)  # before the interpreter freezes it mid-write
        with contextlib.suppress(Exception):
            node_mark_stopped(node_id=self.node_id, now=time.time())


_current: Heartbeat | None = None
_lock = threading.Lock()


def node_start(*, role: str, name: str = "", pool: int | None = None) -> Heartbeat | None:
    """Register this process as a node and heartbeat until it exits (idempotent per process)."""
    global _current
    with _lock:
        if _current is not None and _current.pid == os.getpid():
            return _current
        try:
            _current = Heartbeat(role=role, name=name, pool=pool).start()
        except Exception as exc:  # monitoring must never keep a process from starting
            log.warning("node registry: %s", exc)
            return None
        atexit.register(node_stop)
        return _current


def node_stop() -> None:
    """Mark this process's node as stopped (a clean shutdown, not a death)."""
    global _current
    with _lock:
        hb, _current = _current, None
    if hb is not None and hb.pid == os.getpid():
        hb.stop()


def _after_fork_in_child() -> None:
    # A forked child (a Celery pool process) is part of its parent's node, not a node itself.
    global _current
    _current = None


os.register_at_fork(after_in_child=_after_fork_in_child)
