"""The command lines of a node's processes, declared once.

A node is one machine's set of HPwsn processes on a site's shared PostgreSQL and Redis: the web
(uvicorn), a Celery worker, beat and the directory sync. `scripts/run.sh`, the test platforms and
the benchmarks all take their command lines from here, so a flag changed here changes them all.

    python -m hpwsn_site.processes ROLE [--host H] [--port P] [--node-name N] ...
    python -m hpwsn_site.processes roles "web,worker"
    python -m hpwsn_site.processes redis-server

The first prints ROLE's command line, one argument per line (run.sh reads it with `mapfile`);
the second the roles a `HPWSN_ROLES` switch names, in start order; the third how a local
redis-server starts (its options follow). The roles are `web`,
`worker`, `beat` and `directory`.

No Django here: run.sh calls this before anything is configured, and it must stay cheap.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROLES = ("web", "worker", "beat", "directory")
_ROOT = Path(__file__).resolve().parent.parent


def node_name_default() -> str:
    """`HPWSN_NODE_NAME`, else the host name: how a node is told apart in the registry."""
    return os.environ.get("HPWSN_NODE_NAME") or socket.gethostname()


def roles_parse(text: str) -> tuple[str, ...]:
    """The roles of a comma-separated switch (`web,worker`; empty or `all`: every role)."""
    words = [w.strip().lower() for w in text.split(",") if w.strip()]
    if not words or words == ["all"]:
        return ROLES
    unknown = sorted(set(words) - set(ROLES))
    if unknown:
        raise ValueError(
            f"unknown role(s) {', '.join(unknown)}: choose among {', '.join(ROLES)} or all"
        )
    return tuple(r for r in ROLES if r in words)


@dataclass(frozen=True)
class Options:
    """What tells one node's command lines from another's."""

    bin_dir: Path = Path(sys.executable).parent  # the virtualenv's bin/
    host: str = "127.0.0.1"
    port: int = 8000
    web_workers: int = 1
    concurrency: int = 2
    node_name: str = ""
    data_dir: Path = _ROOT / "var"
    loglevel: str = "INFO"
    # Celery's worker name (%h is the host); by default `<node name>@%h`. Names must differ
    # between the workers of one site: the broker's control messages address workers by name.
    worker_name: str = ""

    @property
    def node(self) -> str:
        return self.node_name or node_name_default()


def web(opts: Options) -> list[str]:
    """uvicorn with read deadlines (hpwsn_site/serve.py)."""
    return [str(opts.bin_dir / "python"), "-m", "hpwsn_site.serve", "--host", opts.host,
            "--port", str(opts.port), "--workers", str(opts.web_workers)]  # fmt: skip


def worker(opts: Options) -> list[str]:
    """The Celery worker: fair scheduling; no mingle or gossip (nothing uses them, and with many
    nodes they only add broker traffic at start-up and every second)."""
    return [str(opts.bin_dir / "celery"), "-A", "hpwsn_site", "worker", "--loglevel",
            opts.loglevel, "--concurrency", str(opts.concurrency), "-O", "fair",
            "--without-mingle", "--without-gossip",
            "-n", opts.worker_name or f"{opts.node}@%h"]  # fmt: skip


def beat(opts: Options) -> list[str]:
    """Celery beat. Every beat task is safe to run twice, so each node may run one."""
    return [str(opts.bin_dir / "celery"), "-A", "hpwsn_site", "beat", "--loglevel", opts.loglevel,
            "--schedule", str(opts.data_dir / "celerybeat-schedule")]  # fmt: skip


def directory(opts: Options) -> list[str]:
    """Follows the LDAP directory (docs/directory.md)."""
    return [str(opts.bin_dir / "python"), str(_ROOT / "manage.py"), "directory_sync"]


_BUILDERS = {"web": web, "worker": worker, "beat": beat, "directory": directory}

# jemalloc (Debian's redis-server links the system's) gives pages that hold nothing back to the
# system 1 s after they empty, not 10 s: Redis's RSS then follows the backlog of the moment
# rather than its peaks of the last seconds (docs/benchmarks.md, the hour's soak).
REDIS_MALLOC_CONF = "dirty_decay_ms:1000"


def redis_server() -> list[str]:
    """The start of a local redis-server's command line (`make run`'s, the benchmarks'); its
    options follow."""
    return ["env", f"MALLOC_CONF={REDIS_MALLOC_CONF}", "redis-server"]


def command(role: str, opts: Options) -> list[str]:
    """The command line of one role."""
    if role not in _BUILDERS:
        raise ValueError(f"unknown role {role!r}: choose among {', '.join(ROLES)}")
    return _BUILDERS[role](opts)


def commands(roles: Sequence[str], opts: Options) -> dict[str, list[str]]:
    """The command lines of several roles, in the order they start."""
    return {role: command(role, opts) for role in roles}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["redis-server"]:
        sys.stdout.write("\n".join(redis_server()) + "\n")
        return 0
    if argv[:1] == ["roles"]:
        # `roles "$HPWSN_ROLES"`: the roles to start, one a line, or the reason it is refused.
        try:
            roles = roles_parse(argv[1] if len(argv) > 1 else "")
        except ValueError as exc:
            sys.stderr.write(f"HPWSN_ROLES: {exc}\n")
            return 2
        sys.stdout.write("\n".join(roles) + "\n")
        return 0
    parser = argparse.ArgumentParser(description="Print a node process's command line.")
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--bin-dir", type=Path, default=Options.bin_dir)
    parser.add_argument("--host", default=Options.host)
    parser.add_argument("--port", type=int, default=Options.port)
    parser.add_argument("--web-workers", type=int, default=Options.web_workers)
    parser.add_argument("--concurrency", type=int, default=Options.concurrency)
    parser.add_argument("--node-name", default="")
    parser.add_argument("--data-dir", type=Path, default=Options.data_dir)
    parser.add_argument("--loglevel", default=Options.loglevel)
    parser.add_argument("--worker-name", default="")
    args = parser.parse_args(argv)
    opts = Options(
        bin_dir=args.bin_dir,
        host=args.host,
        port=args.port,
        web_workers=args.web_workers,
        concurrency=args.concurrency,
        node_name=args.node_name,
        data_dir=args.data_dir,
        loglevel=args.loglevel,
        worker_name=args.worker_name,
    )
    sys.stdout.write("\n".join(command(args.role, opts)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
