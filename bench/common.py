"""Helpers shared by the benchmarks: paths, logging, ports, percentiles, /proc readings, callgrind,
one HTTP request through an ASGI application.

Nothing here knows HPwsn's processes: bench/e2e.py starts the platform, the other benchmarks
reuse it and these helpers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def spare_redis_url(url: str) -> str:
    """The Redis URL an in-process benchmark may flush; exits when it names database 0."""
    if url.rstrip("/").endswith("/0") or url.count("/") < 3:
        sys.exit("give a spare Redis database (it is flushed), e.g. redis://127.0.0.1:6379/11")
    return url


def django_in_process(data_dir: Path, redis_url: str) -> None:
    """Set Django up in this process on a new SQLite database in data_dir (or the database of
    HPWSN_BENCH_DATABASE_URL, `--database-url`), with that Redis."""
    os.environ.update(
        {
            "HPWSN_DATA_DIR": str(data_dir),
            "DATABASE_URL": os.environ.get("HPWSN_BENCH_DATABASE_URL")
            or f"sqlite:///{data_dir / 'db.sqlite3'}",
            "REDIS_URL": redis_url,
            "DJANGO_SETTINGS_MODULE": "hpwsn_site.settings",
        }
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


BIN = ROOT / ".venv" / "bin" if (ROOT / ".venv" / "bin").is_dir() else Path(sys.executable).parent


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


def install_uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def proc_stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may contain spaces; everything after the last ')' is space separated.
    return raw[raw.rfind(")") + 2 :].split()


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = proc_stat(int(entry))
        # fields after comm: state(0) ppid(1) pgrp(2)
        if st and st[0] != "Z" and int(st[2]) == pgid:
            pids.append(int(entry))
    return pids


def cpu_seconds(pids: list[int]) -> float:
    tck = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        st = proc_stat(pid)
        if st:
            total += int(st[11]) + int(st[12])  # utime, stime
    return total / tck


def redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def http(
    url: str, body: bytes | None = None, ctype: str | None = None, timeout: float = 10
) -> tuple[int, bytes]:
    if not url.startswith("http://"):
        raise ValueError(f"not an http URL: {url}")
    req = urllib.request.Request(  # noqa: S310 - http only, checked above
        url, data=body, method="POST" if body is not None else "GET"
    )
    if ctype:
        req.add_header("Content-Type", ctype)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    versions = {}
    for pkg in ("django", "uvicorn", "celery", "redis", "aiohttp", "lxml"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[pkg] = version(pkg)
    redis_v = ""
    with contextlib.suppress(Exception):
        redis_v = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True
        ).stdout.split()[2]
    revision = ""
    with contextlib.suppress(Exception):
        revision = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    return {
        "revision": revision,
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "redis_server": redis_v,
        "packages": versions,
    }


def rss_bytes(pids: list[int]) -> int:
    """Resident memory of these processes together (/proc/PID/statm), in bytes."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
    return total


def open_files(pids: list[int]) -> int:
    """Open file descriptors (files, sockets, pipes) of these processes together."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{pid}/fd"))
    return total


def pids_named(*names: str) -> list[int]:
    """Live processes whose command name (/proc/PID/comm) is one of `names`."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{entry}/comm").read_text().strip() in names:
                    pids.append(int(entry))
    return pids


# Set in a benchmark's child process that runs under callgrind (`child_run`).
CALLGRIND_ENV = "HPWSN_BENCH_CALLGRIND"


def callgrind_control(flag: str) -> None:
    """`callgrind_control FLAG` for this process when it runs under `child_run(callgrind=True)`
    (`--instr=on`, `--instr=off`, `--zero`, `--dump`); nothing otherwise."""
    if os.environ.get(CALLGRIND_ENV):
        subprocess.run(
            ["callgrind_control", flag, str(os.getpid())], check=True, capture_output=True
        )


def child_run(module: str, args: list[str], *, callgrind: bool) -> dict[str, Any]:
    """`python -m module args` from the repository root; the JSON object it printed last.

    With `callgrind`, the child runs under `valgrind --tool=callgrind` with instrumentation off
    until it turns it on (`callgrind_control`), and the object gets `instructions_total`: the
    count of the child's first dump (the one it asks for after its measured calls; the dump at
    exit counts nothing, instrumentation being off by then).
    """
    if callgrind and not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        sys.exit("--callgrind needs valgrind (Debian: apt-get install valgrind)")
    cmd = [str(BIN / "python"), "-m", module, *args]
    env = dict(os.environ)
    out_dir = Path(tempfile.mkdtemp(prefix="hpwsn-bench-callgrind-"))
    try:
        if callgrind:
            env[CALLGRIND_ENV] = "1"
            cmd = [
                "valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={out_dir}/callgrind.%p.out", *cmd,
            ]  # fmt: skip
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            sys.exit(f"{module} {args} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        row: dict[str, Any] = json.loads(lines[-1])
        if callgrind:
            dump = sorted(out_dir.glob("callgrind.*.out.1"))[0]
            totals = [
                int(x.split()[1]) for x in dump.read_text().splitlines() if x.startswith("totals:")
            ]
            row["instructions_total"] = totals[0]
        return row
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def counted_phases(
    module: str,
    doc: str,
    phases: tuple[str, ...],
    per_round: int,
    child: Callable[..., None],
    in_flight: bool = False,
) -> tuple[argparse.Namespace, list[dict[str, Any]]] | None:
    """The command line of an in-process benchmark whose phases each run in a child process
    (`child(phase, rounds, redis_url)` prints one JSON object with `notifications`), optionally
    under callgrind. In the child: runs it and returns None. Else: the arguments and each phase's
    object, with `instructions` a notification under `--callgrind`. With `in_flight`, a round's
    size is the `--in-flight` option (`per_round` its default), given to the child as well."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--notifications", type=int, default=1280, help="measured, per phase")
    parser.add_argument("--callgrind", action="store_true", help="count instructions")
    parser.add_argument("--phases", nargs="+", choices=phases, default=list(phases))
    if in_flight:
        parser.add_argument("--in-flight", type=int, default=per_round, help="requests at a time")
    parser.add_argument(
        "--database-url", help="a database to use instead of a new SQLite one (its rows are kept)"
    )
    parser.add_argument("--child", choices=phases, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.database_url:  # for the children
        os.environ["HPWSN_BENCH_DATABASE_URL"] = args.database_url
    redis_url = spare_redis_url(args.redis_url)
    extra = {"in_flight": args.in_flight} if in_flight else {}
    if args.child:
        child(args.child, args.rounds, redis_url, **extra)
        return None
    rounds = str(max(1, args.notifications // extra.get("in_flight", per_round)))
    rows = []
    for phase in args.phases:
        row = child_run(
            module,
            ["--child", phase, "--rounds", rounds, "--redis-url", redis_url]
            + [f"--{k.replace('_', '-')}={v}" for k, v in extra.items()],
            callgrind=args.callgrind,
        )
        if args.callgrind:
            row["instructions"] = row["instructions_total"] / row["notifications"]
        rows.append(row)
    return args, rows


async def asgi_post(app: Callable[..., Any], path: str, body: bytes, content_type: str) -> int:
    """POST `body` to the ASGI application `app` at `path`, as one request from 127.0.0.1 with
    the Host 127.0.0.1:8000; the answer's status."""
    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    scope = {
        "type": "http", "method": "POST", "path": path, "scheme": "http",
        "client": ("127.0.0.1", 40000), "headers": headers,
    }  # fmt: skip

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return int(sent[0]["status"])


def phases_print(
    rows: list[dict[str, Any]], *, callgrind: bool, per: str, count: str, baseline: str = "echo"
) -> None:
    """The phases of `counted_phases` as a table: `per` names what a figure is for ("a
    notification"), `count` the column of how many; each figure also as a multiple of the
    `baseline` phase's, when it ran."""
    unit = "instructions" if callgrind else "cpu_ms"
    base = next((r[unit] for r in rows if r["phase"] == baseline), None)
    label = f"instructions {per}" if callgrind else f"CPU ms {per}"
    width = max(len(label), 20)
    print(f"{'phase':<10} {count:>13} {label:>{width}} {'x ' + baseline:>7} {'rate /s':>8}")
    for r in rows:
        value = f"{r[unit]:,.0f}" if callgrind else f"{r[unit]:.3f}"
        ratio = f"{r[unit] / base:.2f}" if base else "-"
        n, rate = r["notifications"], r["rate"]
        print(f"{r['phase']:<10} {n:>13} {value:>{width}} {ratio:>7} {rate:>8.0f}")
