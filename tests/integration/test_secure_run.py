"""`make run` (scripts/run.sh) with its defaults: a working demo on this machine only, whose files
other users of the machine cannot read."""

from __future__ import annotations

import signal
import stat
import subprocess
from pathlib import Path

import httpx
import pytest
import redis

from tests.support import console_login, make_run_env, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LISTEN = "0A"  # the state column of /proc/net/tcp*


def _listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp* writes them) listening on this port."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] == LISTEN and int(hex_port, 16) == port:
                found.add(address)
    return found


# 127.0.0.1 as /proc/net/tcp writes it (little-endian), and ::1 as /proc/net/tcp6 does.
LOOPBACK = {"0100007F", "00000000000000000000000001000000"}


def _open_to_others(path: Path) -> bool:
    try:
        return bool(stat.S_IMODE(path.lstat().st_mode) & 0o077)
    except FileNotFoundError:  # a journal or a temporary file gone meanwhile
        return False


def _healthz(base: str) -> bool:
    try:
        return httpx.get(base + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_make_run_serves_its_demo_on_loopback_and_keeps_its_files_to_itself(tmp_path):
    data = tmp_path / "data"
    env, ports = make_run_env(data)
    log_path = tmp_path / "run.log"
    with open(log_path, "wb") as log:
        run = subprocess.Popen(
            ["bash", "scripts/run.sh"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            umask=0o022,
        )
        base = f"http://127.0.0.1:{ports['http']}"
        try:
            healthy = wait_until(
                lambda: run.poll() is None and _healthz(base), timeout=180, interval=0.5
            )
            assert healthy, log_path.read_text(errors="replace")[-4000:]

            # The newcomer's login of the README works (the broker binds with its kept password).
            console = console_login(base, "operator1", "hpwsn-demo")
            assert console.get("/console/").status_code == 200

            # Nothing listens beyond this machine.
            for name, port in ports.items():
                addresses = _listening_addresses(port)
                assert addresses, f"nothing listens on the {name} port"
                assert addresses <= LOOPBACK, f"{name} listens on {addresses}"

            # No file of the platform's is open to other users, and its data dir is closed.
            assert stat.S_IMODE(data.stat().st_mode) == 0o700
            exposed = sorted(
                str(p.relative_to(data)) for p in data.rglob("*") if _open_to_others(p)
            )
            assert not exposed, f"readable by others: {exposed}"
            for made in ("hpwsn.sqlite3", "secret_key", "slapd/slapd.conf", "redis"):
                assert (data / made).exists(), made

            # Redis, which every local user can reach, asks for the password kept there.
            with pytest.raises(redis.exceptions.AuthenticationError):
                redis.Redis(port=ports["redis"]).ping()
            password = (data / "redis.password").read_text()
            assert redis.Redis(port=ports["redis"], password=password).ping()
        finally:
            run.send_signal(signal.SIGTERM)
            try:
                run.wait(20)
            except subprocess.TimeoutExpired:
                run.kill()
                run.wait(5)
