"""`make run` (scripts/run.sh) stops every process it started on SIGTERM, even mid-push."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from pathlib import Path

import httpx
import pytest
import redis

from tests.support import make_run_env, notify_xml, soap_call, subscribe_xml, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            for kid in map(int, kids):
                if kid not in found:
                    found.add(kid)
                    todo.append(kid)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class SlowConsumer:
    """Holds every POST for 60 s: the push is in flight when the platform is stopped."""

    def __init__(self) -> None:
        self.got = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/slow"
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.conns.append(conn)
            conn.recv(65536)
            self.got.set()  # and never answer

    def stop(self) -> None:
        self.server.close()
        for c in self.conns:
            c.close()


def test_sigterm_stops_every_process_of_make_run_and_frees_its_ports(tmp_path):
    env, ports = make_run_env(tmp_path / "data", HPWSN_PUSH_TIMEOUT_S="60")
    log = open(tmp_path / "run.log", "wb")  # noqa: SIM115 - closed below
    run = subprocess.Popen(
        ["bash", "scripts/run.sh"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    consumer = SlowConsumer()
    base = f"http://127.0.0.1:{ports['http']}"
    started: set[int] = set()
    try:
        healthy = wait_until(
            lambda: run.poll() is None and _healthz(base), timeout=180, interval=0.5
        )
        assert healthy, (tmp_path / "run.log").read_text(errors="replace")[-4000:]
        res = soap_call(base + "/wsn/", subscribe_xml(consumer.url, "ALL1"))
        assert res.status == 200, res.body[:500]
        res = soap_call(
            base + "/wsn/", notify_xml(("ALL1", "<x:i xmlns:x='urn:x'>in flight</x:i>"))
        )
        assert res.status == 202, res.body[:500]
        assert consumer.got.wait(30), "the push never started"
        started |= _descendants(run.pid)
        assert len(started) >= 5  # web, worker, beat, redis-server, slapd, sync (and helpers)
        # Its Redis's allocator returns emptied pages after 1 s (hpwsn_site.processes).
        password = (tmp_path / "data" / "redis.password").read_text()
        with redis.Redis(port=ports["redis"], password=password) as r:
            stats = r.execute_command("MEMORY", "MALLOC-STATS").decode()
        assert "opt.dirty_decay_ms: 1000 " in stats, stats[:2000]

        run.send_signal(signal.SIGTERM)

        stopped = wait_until(
            lambda: (
                not any(_alive(p) for p in started)
                and not any(_listening(p) for p in ports.values())
            ),
            timeout=10,
            interval=0.2,
        )
        still = sorted(p for p in started if _alive(p))
        listening = sorted(name for name, p in ports.items() if _listening(p))
        assert stopped, f"still running after 10 s: {still}; ports held: {listening}"
        assert run.wait(5) is not None
    finally:
        consumer.stop()
        for pid in [*started, *_descendants(run.pid), run.pid]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        run.wait(5)
        log.close()


def _healthz(base: str) -> bool:
    try:
        return httpx.get(base + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
