"""The event log: one JSON object per fact, one file per process per hour (no Django, no Spark).

Layout under the root (`HPWSN_EVENTS_DIR`):
``date=YYYY-MM-DD/hour=HH/events-<host>-<pid>-<start>-<n>.jsonl`` while the hour is open,
gzipped to ``.jsonl.gz`` when the process moves to the next hour or exits.
Spark discovers ``date`` and ``hour`` as partition columns and reads both kinds of file.

The writer costs the hot path a dict, its JSON encoding and a list append under a lock: a daemon
thread writes the lines out every `flush_s` (or at once when `max_buffer` lines wait). A process
killed with SIGKILL loses at most that last second; one that forks starts a file of its own.

`FIELDS` is the schema: every event has the common fields, each type fills the others it names
in `TYPES`; the rest are absent (null in Spark). A change that is not a pure addition bumps
`SCHEMA_VERSION`, which every line carries as ``v``.
"""

from __future__ import annotations

import atexit
import gzip
import json
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

# name -> type ("string", "long", "double", "boolean"); one declaration for the writer, the
# synthetic generator, the Spark reader and docs/analytics.md.
FIELDS: dict[str, str] = {
    "v": "long",  # schema version
    "type": "string",  # one of TYPES
    "ts": "double",  # when it happened, Unix seconds (UTC)
    "node": "string",  # host:pid of the process that wrote it
    "nid": "string",  # notification id
    "topic": "string",  # topic path (ALL:ALARM:ALARM1)
    "publisher": "string",  # principal name, "" for anonymous
    "policy": "string",  # reliable | fast
    "bytes": "long",  # message (or batch, or fragment) size
    "ident": "string",  # fragment: the Package's Identification
    "offset": "long",  # fragment: its offset
    "more": "boolean",  # fragment: more fragments follow
    "sub": "string",  # subscription id
    "consumer": "string",  # consumer host:port (never its path or query)
    "batch": "string",  # attempt: the push's message id
    "messages": "long",  # attempt, expired, dropped, pull: how many messages
    "status": "long",  # attempt: HTTP status (null when no answer)
    "error": "string",  # attempt: error class (ok, timeout, connect, http_4xx, http_5xx, refused)
    "duration_ms": "double",  # attempt: time spent on the push
    "latency_ms": "double",  # delivered: publish -> delivery
    "reason": "string",  # dead_lettered, dropped, refused: why
    "action": "string",  # subscription: created, renewed, ...; refused: the operation
    "pullpoint": "string",  # pull, dropped: pull point id (dropped: or queue key)
}

TYPES: dict[str, tuple[str, ...]] = {
    "accepted": ("nid", "topic", "publisher", "policy", "bytes"),
    "fragment": ("topic", "ident", "offset", "more", "bytes"),
    "attempt": (
        "sub",
        "consumer",
        "batch",
        "messages",
        "bytes",
        "status",
        "error",
        "duration_ms",
    ),
    "delivered": ("nid", "sub", "consumer", "latency_ms"),
    "dead_lettered": ("nid", "sub", "consumer", "reason"),
    "expired": ("sub", "consumer", "topic", "messages"),
    "dropped": ("pullpoint", "messages", "reason"),
    "refused": ("action", "publisher", "reason"),
    "subscription": ("sub", "action", "consumer", "topic"),
    "pull": ("pullpoint", "messages"),
}

SUBSCRIPTION_ACTIONS = ("created", "renewed", "paused", "resumed", "suspended", "removed")


# One encoder for what the fast cases of `_json_value` leave: json.dumps with separators builds a
# new one at each call.
_encode = json.JSONEncoder(separators=(",", ":")).encode


def _json_value(value: Any) -> str:
    """`json.dumps(value)` for one field, without its cost for what is most common: strings of
    printable ASCII with nothing to escape (ids, topic paths, names), ints, finite floats, None."""
    kind = type(value)
    if kind is str:
        if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
            return f'"{value}"'
    elif kind is int:
        return str(value)
    elif kind is float and value - value == 0.0:  # neither inf nor nan
        return repr(value)
    elif value is None:
        return "null"
    return _encode(value)


def error_class(*, ok: bool, status: int | None, detail: str = "", permanent: bool = False) -> str:
    """The bounded failure class of a push attempt, as the consumer-health job groups it."""
    if ok:
        return "ok"
    if status is not None:
        return f"http_{status // 100}xx"
    text = detail.lower()
    if "timeout" in text or "timed out" in text:
        return "timeout"
    if permanent:
        return "refused"
    return "connect"


def partition_dir(root: Path, ts: float) -> Path:
    """The date/hour partition a moment belongs to (UTC)."""
    t = datetime.fromtimestamp(ts, tz=UTC)
    return root / f"date={t:%Y-%m-%d}" / f"hour={t:%H}"


def partition_globs(since: float, until: float) -> list[str]:
    """Relative globs of the partitions that may hold events of [since, until).

    One hour of margin either side: a line lands in the hour its buffer was written, which may be
    the hour after it happened.
    """
    start = datetime.fromtimestamp(since, tz=UTC).replace(minute=0, second=0, microsecond=0)
    end = datetime.fromtimestamp(until, tz=UTC) + timedelta(hours=1)
    start -= timedelta(hours=1)
    days: dict[str, list[str]] = {}
    t = start
    while t <= end:
        days.setdefault(f"{t:%Y-%m-%d}", []).append(f"{t:%H}")
        t += timedelta(hours=1)
    out = []
    for day, hours in days.items():
        if len(hours) == 24:
            out.append(f"date={day}/hour=*")
        else:
            out.extend(f"date={day}/hour={h}" for h in hours)
    return out


def hour_dirs(root: Path, since: float, until: float) -> list[Path]:
    """The existing date/hour partitions that may hold events of [since, until), in order."""
    out: list[Path] = []
    for pattern in partition_globs(since, until):
        out.extend(sorted(p for p in root.glob(pattern) if p.is_dir()))
    return out


# Closed hours compacted to Parquet (spark/compaction.py) live in a tree of their own, named so
# that Spark's listing of the JSON tree skips it (paths starting with "_" are hidden to Spark).
COMPACT_DIR = "_compact"
MANIFEST = "_manifest.json"


def compacted_dir(root: Path, hour_dir: Path) -> Path:
    """Where the Parquet of one date=/hour= partition goes: root/_compact/date=…/hour=…."""
    return root / COMPACT_DIR / hour_dir.parent.name / hour_dir.name


def json_files(hour_dir: Path) -> list[Path]:
    """The event files of one partition, open (.jsonl) and closed (.jsonl.gz)."""
    return sorted(p for p in hour_dir.iterdir() if p.name.endswith((".jsonl", ".jsonl.gz")))


def manifest_read(compacted: Path) -> dict[str, int] | None:
    """The source files (name -> size) a compacted hour holds; None when it is not compacted."""
    try:
        data = json.loads((compacted / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    sources = data.get("sources") if isinstance(data, dict) else None
    return {str(k): int(v) for k, v in sources.items()} if isinstance(sources, dict) else None


def manifest_write(compacted: Path, sources: dict[str, int]) -> None:
    data = {"v": SCHEMA_VERSION, "sources": sources}
    tmp = compacted / ("." + MANIFEST + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    tmp.replace(compacted / MANIFEST)


def hour_sources(root: Path, hour_dir: Path) -> tuple[list[Path], list[Path]]:
    """(Parquet files, JSON files) that together hold one partition's events, each once.

    The Parquet of a compacted hour replaces exactly the files its manifest names; any other file
    of the hour (a crashed process's file compressed later) is still read as JSON.
    """
    compacted = compacted_dir(root, hour_dir)
    sources = manifest_read(compacted)
    files = json_files(hour_dir)
    if sources is None:
        return [], files
    parquet = sorted(compacted.glob("*.parquet"))
    return parquet, [p for p in files if p.name not in sources]


def _hour_end(hour_dir: Path) -> float:
    """When the date=/hour= partition ends (UTC); 0 for a name that is not one."""
    try:
        start = datetime.strptime(
            f"{hour_dir.parent.name[5:]} {hour_dir.name[5:]}", "%Y-%m-%d %H"
        ).replace(tzinfo=UTC)
    except ValueError:
        return 0.0
    return start.timestamp() + 3600


def hours_to_compact(
    root: Path, *, now: float, since: float, until: float, grace_s: float = 120.0
) -> list[tuple[Path, dict[str, int]]]:
    """Closed partitions of [since, until) whose compacted copy is missing or out of date.

    Closed: the hour ended `grace_s` ago and every file in it is gzipped (a plain .jsonl is a
    file still open, or one a crashed process left for the housekeeping to compress).
    """
    out = []
    for hour_dir in hour_dirs(root, since, until):
        files = json_files(hour_dir)
        if not files or any(p.name.endswith(".jsonl") for p in files):
            continue
        end = _hour_end(hour_dir)
        if not end or end + grace_s > now:
            continue
        sources = {p.name: p.stat().st_size for p in files}
        if manifest_read(compacted_dir(root, hour_dir)) != sources:
            out.append((hour_dir, sources))
    return out


def compress(path: Path) -> Path:
    """Gzip a finished hour file next to itself and remove the plain one.

    Two compressors of one file (its process at the hour's turn and the housekeeping) each write
    a temporary file of their own and put the same content in place; the one that finds the plain
    file gone has nothing left to do.
    """
    target = path.with_name(path.name + ".gz")
    # Spark skips names starting with "."; the pid and thread keep two compressors apart.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with path.open("rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except FileNotFoundError:
        tmp.unlink(missing_ok=True)
        if target.exists():  # compressed meanwhile by another
            return target
        raise
    tmp.replace(target)
    path.unlink(missing_ok=True)
    return target


def _compress_quietly(path: Path) -> None:
    try:
        compress(path)
    except OSError:  # a full disk: the plain file stays, for stale_files_compress
        log.warning("event log: %s not compressed", path, exc_info=True)


def stale_files_compress(root: Path, *, now: float, idle_s: float = 600.0) -> int:
    """Gzip the plain files of past hours nobody writes to any more (a process that crashed).

    A file is left alone until `idle_s` after both its last write and the end of its hour: a live
    process compresses its own file when the hour turns (a file it last wrote long before is closed
    then too), and a busy hour's file takes a minute to gzip.
    """
    done = 0
    for path in root.glob("date=*/hour=*/*.jsonl"):
        try:
            idle_since = max(path.stat().st_mtime, _hour_end(path.parent))
        except FileNotFoundError:  # compressed meanwhile by its process
            continue
        if now - idle_since < idle_s:
            continue
        compress(path)
        done += 1
    return done


def partitions_prune(root: Path, *, now: float, keep_days: int) -> int:
    """Remove the date partitions older than `keep_days` days; returns how many went."""
    cutoff = f"date={datetime.fromtimestamp(now - keep_days * 86400, tz=UTC):%Y-%m-%d}"
    gone = 0
    for day in root.glob(f"{COMPACT_DIR}/date=*"):
        if day.is_dir() and day.name < cutoff:
            shutil.rmtree(day, ignore_errors=True)
    for day in root.glob("date=*"):
        if day.is_dir() and day.name < cutoff:
            shutil.rmtree(day, ignore_errors=True)
            gone += 1
    return gone


class EventLog:
    """A buffered appender of event lines for this process."""

    def __init__(
        self,
        root: Path,
        *,
        flush_s: float = 1.0,
        max_buffer: int = 20_000,
        compress_closed: bool = True,
    ) -> None:
        self.root = root
        self.flush_s = flush_s
        self.max_buffer = max_buffer
        self.compress_closed = compress_closed
        self._lock = threading.Lock()
        self._io = threading.Lock()  # one writer of the file at a time
        self._reset()
        os.register_at_fork(after_in_child=self._reset)
        atexit.register(self.close)

    def _reset(self) -> None:
        self._buffer: list[str] = []
        self._file: Any = None
        self._file_dir: Path | None = None
        self._path: Path | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._leaving = False
        self._gzips: list[threading.Thread] = []
        self._files = 0
        self.node = f"{socket.gethostname()}:{os.getpid()}"
        self._templates: dict[tuple[str, tuple[str, ...]], str] = {}  # they hold the node
        self._lock = threading.Lock()
        self._io = threading.Lock()

    def emit(self, kind: str, ts: float | None = None, **fields: Any) -> None:
        """Append one event of type `kind`; fields named in TYPES[kind] only."""
        names = tuple(fields)
        template = self._templates.get((kind, names)) or self._template(kind, names)
        values = (_json_value(ts or time.time()), *map(_json_value, fields.values()))
        self.emit_line(template % values)

    def _template(self, kind: str, names: tuple[str, ...]) -> str:
        """The line of a `kind` event with these fields, each value a %s: the fixed part of a line
        encoded once, not a dict encoded for every event."""

        def fixed(text: str) -> str:  # a part of the line that % must leave as it is
            return text.replace("%", "%%")

        head = fixed(f'{{"v":{SCHEMA_VERSION},"type":{_encode(kind)},"ts":') + "%s"
        head += fixed(f',"node":{_encode(self.node)}')
        template = head + "".join(fixed(f",{_encode(name)}:") + "%s" for name in names) + "}"
        self._templates[(kind, names)] = template
        return template

    def emit_rows(
        self, kind: str, ts: float, same: dict[str, Any], rows: Iterable[tuple[Any, ...]]
    ) -> None:
        """Append one event of type `kind` per row: the fields `same` holds are the same in all of
        them and encoded once; each row gives the values of the other fields of `TYPES[kind]`, in
        their order. A batch of deliveries costs one encode of what they share and one lock."""
        varying = [f for f in TYPES[kind] if f not in same]
        record = {"v": SCHEMA_VERSION, "type": kind, "ts": ts, "node": self.node, **same}
        head = _encode(record)[:-1]
        names = [f',"{name}":' for name in varying]
        value = _json_value
        if len(names) == 2:  # a delivery's id and latency: one f-string a row, no tuple built
            first, second = names
            lines = [f"{head}{first}{value(a)}{second}{value(b)}}}" for a, b in rows]
        else:
            line = head.replace("%", "%%") + "".join(f"{name}%s" for name in names) + "}"
            lines = [line % tuple(map(value, row)) for row in rows]
        self.emit_many(lines)

    def emit_line(self, line: str) -> None:
        with self._lock:
            self._buffer.append(line)
            full = len(self._buffer) >= self.max_buffer
            if self._thread is None:
                self._start()
        if full:
            self.flush()

    def emit_many(self, lines: Iterable[str]) -> None:
        with self._lock:
            self._buffer.extend(lines)
            full = len(self._buffer) >= self.max_buffer
            if self._thread is None:
                self._start()
        if full:
            self.flush()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hpwsn-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            try:
                self.flush()
            except OSError:  # a full or missing disk must not kill the thread: retry next tick
                continue

    def flush(self, *, now: float | None = None) -> int:
        """Write what waits to this hour's file (rolling over to a new hour's file first)."""
        with self._lock:
            lines, self._buffer = self._buffer, []
        with self._io:
            if not lines:
                if self._file is not None:
                    self._roll(now or time.time(), lines_waiting=False)
                return 0
            self._roll(now or time.time(), lines_waiting=True)
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()
        return len(lines)

    def _roll(self, now: float, *, lines_waiting: bool) -> None:
        target = partition_dir(self.root, now)
        if self._file is not None and target == self._file_dir:
            return
        self._close_file()
        if not lines_waiting:
            return
        target.mkdir(parents=True, exist_ok=True)
        self._files += 1
        host, pid = self.node.rsplit(":", 1)
        self._path = target / f"events-{host}-{pid}-{int(now)}-{self._files}.jsonl"
        self._file = self._path.open("a", encoding="utf-8")
        self._file_dir = target

    def _close_file(self) -> None:
        if self._file is None:
            return
        self._file.close()
        path, self._file, self._file_dir = self._path, None, None
        if not (self.compress_closed and path is not None and path.exists()):
            return
        if self._leaving:  # the process is leaving: a thread would not finish
            compress(path)
            return
        # In a thread of its own, not under the writer's lock: an hour of a busy broker's events
        # (a gigabyte and more) takes a minute to gzip, and the lines emitted meanwhile would pile
        # up in memory (tens of MB a process, kept by the allocator afterwards). A process that
        # is killed before it is done leaves the plain file to stale_files_compress.
        gzip_thread = threading.Thread(
            target=_compress_quietly, args=(path,), name="hpwsn-events-gzip", daemon=True
        )
        gzip_thread.start()
        self._gzips = [t for t in self._gzips if t.is_alive()] + [gzip_thread]

    def close(self) -> None:
        """Write the rest, close the open file and wait until every closed hour is gzipped."""
        self._stop.set()
        self._leaving = True
        try:
            self.flush()
        finally:
            with self._io:
                self._close_file()
            for gzip_thread in self._gzips:  # a closed log has every past hour gzipped
                gzip_thread.join()
