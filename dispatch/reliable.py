"""Reliable topics: a database log in front of the Redis queues, and recovery after a Redis loss.

The web commits every notification of a `reliable` topic to `StoredMessage` before it answers.
The fan-out reads that log in sequence order (`state.FANOUT_SEQ` is how far it got) into the
per-subscription Redis queues, whose items carry the sequence number. Once a second the
checkpoint copies the fan-out position and the low watermark of every subscription that lags
behind it (every matching message up to it has been pushed, dead-lettered or expired) to
`DeliveryCursor`, and deletes the log rows every subscription has passed.

If Redis loses its data (the `state.EPOCH` marker is gone), `recover` rewinds the fan-out to the
lowest durable watermark and lets it replay the log; each subscription skips what its own
watermark says it already had. What was pushed after the last checkpoint is pushed again:
at-least-once, with the stable per-message wsa:MessageID for consumers that deduplicate.

Sequence numbers come from the database and a transaction-scoped lock serialises the inserts
(PostgreSQL; SQLite serialises writers itself), so rows become visible in sequence order: a
reader that sees row n+1 without row n knows n was rolled back and will never appear.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import weakref
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, transaction
from django.db.models import Q

from dispatch import tasks
from dispatch.deadletters import letters_requeue
from dispatch.models import DeliveryCursor, StoredMessage
from hpwsn_site import state
from hpwsn_site.soapcall import DbThread
from subscriptions.models import Subscription
from subscriptions.selectors import subscription_gone, subscription_index

log = logging.getLogger(__name__)

_LOCK_ID = 0x4850_5753  # "HPWS": the advisory lock that orders inserts into the log
RECOVERY_LEASE = state.PREFIX + "recovery:lease"
FANOUT_CURSOR = "fanout"


@dataclass(frozen=True, slots=True)
class LogRow:
    seq: int
    notification_id: str
    topic_path: str
    priority: int
    payload: bytes
    accepted_at: float
    expires_at: float | None


# ----------------------------------------------------------------------------- write (web)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """A notification to write to the log (a StoredMessage row without its sequence number)."""

    notification_id: str
    topic_path: str
    priority: int
    payload: bytes
    accepted_at: float
    expires_at: float | None = None
    idempotency_key: str | None = None


_COLUMNS = tuple(f.name for f in LogEntry.__dataclass_fields__.values())
_ROWS_PER_INSERT = 100  # 700 parameters: under the oldest SQLite limit (999)


_quoted: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {}


def _log_names(*columns: str) -> tuple[str, ...]:
    """The log's table and these columns, quoted for the database (kept per database vendor). The
    statements of this module are written from these names and placeholders only: every value
    goes as a parameter."""
    key = (connection.vendor, columns)
    names = _quoted.get(key)
    if names is None:
        quote = connection.ops.quote_name
        names = _quoted[key] = (quote(StoredMessage._meta.db_table), *map(quote, columns))
    return names


def _insert(cursor: Any, entries: Sequence[LogEntry | StoredMessage]) -> None:
    """One multi-row INSERT per 100 entries: a model instance and bulk_create cost several times
    the insert itself on this path, which every reliable notification takes."""
    table, *names = _log_names(*_COLUMNS)
    columns = ", ".join(names)
    head = f"INSERT INTO {table} ({columns}) VALUES "  # noqa: S608
    row = "(" + ", ".join([_mark()] * len(_COLUMNS)) + ")"
    for start in range(0, len(entries), _ROWS_PER_INSERT):
        chunk = entries[start : start + _ROWS_PER_INSERT]
        params = [getattr(e, c) for e in chunk for c in _COLUMNS]
        cursor.execute(head + ", ".join([row] * len(chunk)), params)


def messages_store(*, messages: Sequence[LogEntry | StoredMessage]) -> list[str]:
    """Commit notifications to the log in one transaction; returns their ids.

    A message whose idempotency key is already in the log, or earlier in this batch (group commit
    puts several requests together: a publisher's retry may meet its original), is not stored
    again: the id it was first accepted under is returned in its place.
    """
    first: dict[str, str] = {}  # each key's first id in this batch
    fresh = []
    for m in messages:
        if m.idempotency_key:
            if m.idempotency_key in first:
                continue
            first[m.idempotency_key] = m.notification_id
        fresh.append(m)
    try:
        held = _store_once(fresh, list(first))
    except IntegrityError:  # another writer stored one of the keys between our read and insert
        held = _store_once(fresh, list(first))
    return [
        held.get(m.idempotency_key) or first[m.idempotency_key]
        if m.idempotency_key
        else m.notification_id
        for m in messages
    ]


def _store_once(fresh: Sequence[LogEntry | StoredMessage], keys: list[str]) -> dict[str, str]:
    """Insert the rows whose keys the log does not hold; the ids it holds under the others.

    On PostgreSQL, where the parameters are bound on the client (Django's default), the lock, the
    read of the keys and the insert are the statements of one query, which the server runs as one
    transaction: one round trip where five were (BEGIN, the three, COMMIT). Each statement takes
    its own snapshot, so the read sees what the lock's earlier holders committed, and the insert
    skips the keys it found (ON CONFLICT: the read's answer comes back with the insert's).
    """
    server_binds = getattr(connection.features, "uses_server_side_binding", False)
    if connection.vendor == "postgresql" and not server_binds:
        return _store_in_one_query(fresh, keys)
    return _store_in_steps(fresh, keys)


def _store_in_steps(fresh: Sequence[LogEntry | StoredMessage], keys: list[str]) -> dict[str, str]:
    with _transaction() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_ID])
        held = _ids_by_key(cursor, keys)
        rows = [m for m in fresh if not m.idempotency_key or m.idempotency_key not in held]
        if rows:
            _insert(cursor, rows)
    return held


def _store_in_one_query(
    fresh: Sequence[LogEntry | StoredMessage], keys: list[str]
) -> dict[str, str]:
    table, *names = _log_names(*_COLUMNS)
    key_column, id_column = _log_names("idempotency_key", "notification_id")[1:]
    statements = ["SELECT pg_advisory_xact_lock(%s)"]
    params: list[Any] = [_LOCK_ID]
    if keys:
        statements.append(
            f"SELECT {key_column}, {id_column} FROM {table} WHERE {key_column} = ANY(%s)"  # noqa: S608
        )
        params.append(keys)
    if fresh:
        row = "(" + ", ".join(["%s"] * len(_COLUMNS)) + ")"
        statements.append(
            f"INSERT INTO {table} ({', '.join(names)}) VALUES {', '.join([row] * len(fresh))}"  # noqa: S608
            f" ON CONFLICT ({key_column}) DO NOTHING"
        )
        params.extend(getattr(m, c) for m in fresh for c in _COLUMNS)
    with _transaction(begin=False) as cursor:
        cursor.execute("; ".join(statements), params)
        if not keys:
            return {}
        cursor.nextset()  # the read's rows
        return {str(key): str(nid) for key, nid in cursor.fetchall()}


def _mark() -> str:
    """The driver's placeholder: the log's statements go to its own cursor, which does not
    translate Django's `%s` (sqlite3 takes `?`, psycopg `%s`)."""
    return "?" if connection.vendor == "sqlite" else "%s"


@contextmanager
def _cursor() -> Iterator[Any]:
    """The driver's own cursor on the thread's connection, for the log's statements.

    The log is written and read every few milliseconds, and Django's cursor wrapper (the `%s` to
    `?` rewrite of every statement, the execute wrappers) cost more than the statements on SQLite.
    The connection gets the health check Django's `cursor()` gives it, so one the server dropped
    during a pause is replaced before it is used. Errors pass through Django's wrapper, so that a
    connection broken during the job is closed before the next (`close_old_connections`), and an
    IntegrityError is Django's.
    """
    conn = connections[DEFAULT_DB_ALIAS]  # once: each use of the `connection` proxy looks it up
    conn.close_if_health_check_failed()
    conn.ensure_connection()
    with conn.wrap_database_errors, closing(conn.connection.cursor()) as cursor:
        yield cursor


@contextmanager
def _transaction(*, begin: bool = True) -> Iterator[Any]:
    """A transaction around the log's statements, and the driver's own cursor for them.

    On the log's thread the connection is in autocommit, and the transaction is a BEGIN and a
    COMMIT sent by hand (BEGIN in the mode the settings give SQLite): Django's `atomic()` cost the
    group commit, with the cursor wrapper, a third of its CPU. A commit that fails is rolled back
    before its error is raised. With `begin=False` neither is sent: the caller's statements go to
    the server as one query, which it runs as one transaction. Inside a caller's transaction (a
    test, a command), a savepoint of Django's instead.
    """
    if connection.in_atomic_block:
        with transaction.atomic(), _cursor() as cursor:
            yield cursor
        return
    with _cursor() as cursor:
        if not begin:
            yield cursor
            return
        # SQLite's mode from the settings: Django reads it when it connects, so after _cursor().
        mode = getattr(connections[DEFAULT_DB_ALIAS], "transaction_mode", None)
        cursor.execute(f"BEGIN {mode}" if mode else "BEGIN")
        try:
            yield cursor
        except BaseException:
            with suppress(Exception):  # the error that ended the transaction is the one to raise
                cursor.execute("ROLLBACK")
            raise
        cursor.execute("COMMIT")


class LogWriter:
    """Group commit: the notifications of concurrent requests go to the log in one transaction.

    While one transaction is in flight the next requests queue up; they are written together as
    soon as it ends, so a busy web process commits far fewer, larger transactions. Each request's
    messages stay together in one transaction and in order.
    """

    def __init__(self) -> None:
        self.pending: list[tuple[list[LogEntry], asyncio.Future[list[str]]]] = []
        self.running = False

    async def store(self, messages: list[LogEntry]) -> list[str]:
        future: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        self.pending.append((messages, future))
        if not self.running:
            self.running = True
            asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self.pending:
                batch, self.pending = self.pending, []
                rows = [m for messages, _f in batch for m in messages]
                try:
                    ids = await log_thread.run(messages_store, messages=rows)
                except Exception as exc:
                    for _m, future in batch:
                        future.set_exception(exc)
                    continue
                start = 0
                for messages, future in batch:
                    future.set_result(ids[start : start + len(messages)])
                    start += len(messages)
        finally:
            self.running = False


# The group commits of every loop of the process, on one thread that keeps its connection.
log_thread = DbThread("hpwsn-log")
# By the loop itself, weakly: a loop's id can pass to a new loop once it has ended, and a writer
# left "running" by an ended loop would never drain the new one's requests.
_writers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LogWriter] = (
    weakref.WeakKeyDictionary()
)


def log_writer() -> LogWriter:
    """The group-commit writer of the running event loop."""
    loop = asyncio.get_running_loop()
    writer = _writers.get(loop)
    if writer is None:
        writer = _writers[loop] = LogWriter()
    return writer


_KEYS_PER_QUERY = 500  # parameters: under the oldest SQLite limit (999)


def _ids_by_key(cursor: Any, keys: list[str]) -> dict[str, str]:
    """The ids the log holds under these idempotency keys. Plain SQL, as the insert beside it:
    every reliable Notify that carries a wsa:MessageID asks, and the ORM's query cost a web
    process ten times the statement."""
    if not keys:
        return {}
    table, key_column, id_column = _log_names("idempotency_key", "notification_id")
    found: dict[str, str] = {}
    for start in range(0, len(keys), _KEYS_PER_QUERY):
        chunk = keys[start : start + _KEYS_PER_QUERY]
        marks = ", ".join([_mark()] * len(chunk))
        cursor.execute(
            f"SELECT {key_column}, {id_column} FROM {table} WHERE {key_column} IN ({marks})",  # noqa: S608
            chunk,
        )
        found.update((str(key), str(nid)) for key, nid in cursor.fetchall())
    return found


# ----------------------------------------------------------------------------- read (fan-out)


_READ_COLUMNS = (
    "seq", "notification_id", "topic_path", "priority", "payload", "accepted_at", "expires_at",
)  # fmt: skip


def log_read(*, after: int, limit: int, max_bytes: int | None = None) -> list[LogRow]:
    """The next rows of the log after sequence number `after`, in order: at most `limit` rows,
    cut after the row that brings their payloads to `max_bytes` (one row at least)."""
    max_bytes = settings.HPWSN_FANOUT_BATCH_BYTES if max_bytes is None else max_bytes
    # One plain query (the fan-out reads the log every few milliseconds; a query that let the
    # database cut the batch by bytes cost a sixth of the end-to-end rate), cut here: the batch
    # that goes into the queues in one Redis transaction ends at the row that brings it to
    # max_bytes, and the rows after it are read again by the next batch. Written as SQL as the
    # insert is: the ORM compiled the same query again each time, a fifth of the worker's CPU
    # with one consumer.
    table, *names = _log_names(*_READ_COLUMNS)
    columns, seq_column = ", ".join(names), names[0]  # "seq" comes first
    m = _mark()
    sql = f"SELECT {columns} FROM {table} WHERE {seq_column} > {m} ORDER BY {seq_column} LIMIT {m}"  # noqa: S608
    out: list[LogRow] = []
    total = 0
    with _cursor() as cursor:
        cursor.execute(sql, [after, limit])
        # A hundred rows at a time, as the ORM read them: a batch cut by bytes fetches no more.
        while total < max_bytes and (chunk := cursor.fetchmany(100)):
            for seq, nid, path, priority, payload, accepted_at, expires_at in chunk:
                out.append(
                    LogRow(
                        seq=int(seq),
                        notification_id=str(nid),
                        topic_path=str(path),
                        priority=int(priority),
                        payload=bytes(payload),
                        accepted_at=float(accepted_at),
                        expires_at=None if expires_at is None else float(expires_at),
                    )
                )
                total += len(payload)
                if total >= max_bytes:
                    break
    return out


def log_head() -> int:
    """The highest sequence number in the log (0 when empty)."""
    table, seq_column = _log_names("seq")
    with _cursor() as cursor:  # at the end of every fan-out run: SQL, as log_read
        cursor.execute(f"SELECT {seq_column} FROM {table} ORDER BY {seq_column} DESC LIMIT 1")  # noqa: S608
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def fanout_position(r: Any) -> int | None:
    """How far the fan-out has read the log; None while Redis has no delivery state yet."""
    if not r.exists(state.EPOCH) and not recover():
        return None  # another process is recovering
    return int(r.get(state.FANOUT_SEQ) or 0)


# ----------------------------------------------------------------------------- watermarks

# Low watermark of each queue: every item carries a mark, b"r<seq>" (a reliable message),
# b"f<F>" (a fast message, fanned out when the fan-out position was F) or b"d<row>" (a redriven
# dead letter, kept in the database until delivered). The head of a FIFO queue bounds what is
# still pending behind it; an empty queue has everything up to the fan-out position F0 (read
# before the heads). Only the subscriptions in `state.BUSY` are looked at (every other one is at
# F0); one whose queues are all empty leaves the set here, atomically with finding them empty,
# so a fan-out that queues for it meanwhile adds it again after.
# Of a subscription's ten priority queues only the default one and those `state.PRIOS` names are
# looked at: the fan-out records there, in the script that queues, every other priority it
# queues for a busy subscription (a redriven letter goes to the default queue). A Redis whose
# PRIOS has no field '*' yet (it was filled by a version before PRIOS) gets one full look at
# every queue, which records what it finds (the caller then sets '*').
# Called for a thousand subscriptions at a time: ten thousand busy ones would otherwise hold
# Redis for tens of milliseconds every second, every pump waiting behind the script.
# Batches an unordered subscription set aside (a zset, see dispatch/pump.py) are all
# looked at: they are not in sequence order.
# KEYS[1]: the busy set, KEYS[2] PRIOS; ARGV: F0, the queue and aside key prefixes, the default
# priority, '1' for the full look, then per subscription its id and its pull point's key ('' for
# its own queues).
_WATERMARKS = """
local function low_of(item)
  local kind, num = string.match(item, '|([rf])(%d+)$')
  if kind == 'r' then return tonumber(num) - 1 elseif kind == 'f' then return tonumber(num) end
  return -1
end
local function look(key, low)  -- the head's watermark if lower; whether the list has any
  local head = redis.call('lindex', key, 0)
  if not head then return low, false end
  local v = low_of(head)
  if v < low then return v, true end
  return low, true
end
local f0, qp, ap, dp = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]
local full = ARGV[5] == '1'
local out = {}
for i = 6, #ARGV, 2 do
  local sid, pull = ARGV[i], ARGV[i + 1]
  local low, empty, found = f0, true, false
  if pull ~= '' then
    low, found = look(pull, low)
    empty = not found
  else
    local prios = redis.call('hget', KEYS[2], sid) or ''
    if full then
      prios = ''
      for p = 0, 9 do
        local q = tostring(p)
        if q ~= dp and redis.call('exists', qp .. sid .. ':' .. q) == 1 then prios = prios .. q end
      end
      if prios ~= '' then redis.call('hset', KEYS[2], sid, prios) end
    end
    low, found = look(qp .. sid .. ':' .. dp, low)
    empty = not found
    for q in string.gmatch(prios, '%d') do
      low, found = look(qp .. sid .. ':' .. q, low)
      if found then empty = false end
    end
    for _, member in ipairs(redis.call('zrange', ap .. sid, 0, -1)) do
      empty = false
      for _, item in ipairs(cjson.decode(member)['items']) do
        local v = low_of(item)
        if v < low then low = v end
      end
    end
  end
  if empty then
    redis.call('srem', KEYS[1], sid)
    redis.call('hdel', KEYS[2], sid)
  end
  out[#out + 1] = low
end
return out
"""


_CHUNK = 1000  # subscriptions a call of _WATERMARKS


def _watermarks(r: Any, f0: int) -> dict[str, int]:
    """The low watermark of every subscription that had something queued; the others are at f0."""
    index = subscription_index(max_age=1.0)
    names: list[str] = []
    args: list[object] = []
    gone: list[str] = []
    members = [raw.decode() for raw in r.smembers(state.BUSY)]
    if any(sid not in index.by_id for sid in members):
        # Made a few milliseconds ago and not yet in this process's index, or really gone?
        index = subscription_index(max_age=0)
    for sid in members:
        entry = index.by_id.get(sid)
        if entry is None:
            if _gone(sid):
                gone.append(sid)
            continue
        names.append(sid)
        pull = entry.pull_point_id if entry.mode == "pull" else None
        args += [sid, state.pullpoint_key(pull) if pull else ""]
    if gone:
        pipe = r.pipeline(transaction=False)
        pipe.srem(state.BUSY, *gone)
        pipe.hdel(state.PRIOS, *gone)
        pipe.execute()
    if not names:
        return {}
    full = not r.hexists(state.PRIOS, "*")
    fixed = [
        f0,
        state.QUEUE_PREFIX,
        state.aside_key(""),
        state.DEFAULT_PRIORITY,
        "1" if full else "",
    ]
    lows: list[int] = []
    for i in range(0, len(args), 2 * _CHUNK):
        lows += r.eval(_WATERMARKS, 2, state.BUSY, state.PRIOS, *fixed, *args[i : i + 2 * _CHUNK])
    if full:
        r.hset(state.PRIOS, "*", "1")
    # -1: a redriven dead letter (mark b"d<row>") heads the queue: its watermark is unknown.
    return {sid: int(low) for sid, low in zip(names, lows, strict=True)}


def _gone(sid: str) -> bool:
    return subscription_gone(sid)


FULL_WRITE_S = 30.0


class _Written:
    """The subscription cursors this process's last checkpoint wrote, and for which Redis."""

    def __init__(self) -> None:
        self.epoch: bytes | None = None
        self.seqs: dict[str, int] = {}
        self.full_at = 0.0


_written = _Written()


def checkpoint_run() -> int:
    """Copy the fan-out position and the lagging subscriptions' watermarks to the database; prune
    the log. A subscription without a cursor of its own is at the fan-out position.

    Returns the number of log rows deleted.
    """
    r = state.get_redis()
    if fanout_position(r) is None:
        return 0
    # Fenced on the epoch marker: every read below must come from the Redis that held this
    # position. A call retried against a replacement (empty) Redis would see no queue at all and
    # delete every cursor and log row still needed.
    epoch, position = r.mget(state.EPOCH, state.FANOUT_SEQ)
    if epoch is None:
        return 0
    f0 = int(position or 0)
    measured = _watermarks(r, f0)
    if r.get(state.EPOCH) != epoch:
        log.warning("checkpoint skipped: Redis was replaced while it read the watermarks")
        return 0
    lows = {sid: low for sid, low in measured.items() if 0 <= low < f0}
    unknown = [f"sub:{s}" for s, low in measured.items() if low < 0]
    if unknown:
        # One without a cursor of its own was at the previous fan-out position (or was made
        # after everything up to it was accepted): that becomes its cursor until it is known.
        have = set(DeliveryCursor.objects.filter(name__in=unknown).values_list("name", flat=True))
        previous = DeliveryCursor.objects.filter(name=FANOUT_CURSOR).values_list("seq", flat=True)
        at = int(previous.first() or 0)
        lows.update({name[4:]: at for name in unknown if name not in have})
    now = time.time()
    seqs = {f"sub:{s}": low for s, low in lows.items()}
    # Only the cursors that moved since this process last wrote them (all of them after a Redis
    # change and every FULL_WRITE_S): ten thousand lagging subscriptions are not ten thousand
    # rows written every second. Watermarks only rise, so one unchanged here is unchanged in the
    # database too, whichever process wrote it last.
    full = _written.epoch != epoch or now - _written.full_at >= FULL_WRITE_S
    moved = seqs if full else {n: v for n, v in seqs.items() if _written.seqs.get(n) != v}
    rows = [DeliveryCursor(name=FANOUT_CURSOR, seq=f0, updated_at=now)]
    rows += [DeliveryCursor(name=name, seq=seq, updated_at=now) for name, seq in moved.items()]
    DeliveryCursor.objects.bulk_create(
        rows, update_conflicts=True, unique_fields=["name"], update_fields=["seq", "updated_at"]
    )
    # Subscriptions whose watermark is unknown keep their last durable one, which also holds the
    # log for them; cursors of subscriptions caught up (or gone) go: all of them in a full write,
    # else those this process wrote (another process's go at its next write, or the next full one).
    lagging = {f"sub:{s}" for s, low in measured.items() if low < f0}
    if full:
        DeliveryCursor.objects.filter(name__startswith="sub:").exclude(name__in=lagging).delete()
    else:
        done = [name for name in _written.seqs if name not in lagging]
        if done:
            DeliveryCursor.objects.filter(name__in=done).delete()
    _written.seqs = seqs
    if full:
        _written.epoch, _written.full_at = epoch, now
    held = DeliveryCursor.objects.filter(
        name__in=[f"sub:{s}" for s, low in measured.items() if low < 0]
    ).values_list("seq", flat=True)
    replay_until = r.hget(state.REPLAY, "_until")
    if replay_until is not None and f0 >= int(replay_until):
        r.delete(state.REPLAY)
    # A row every subscription has passed is done with once the dedup window is over (its
    # idempotency key must still be found if the publisher sends it again).
    low = min([f0, *lows.values(), *held])
    window = settings.HPWSN_DEDUP_WINDOW_S
    deleted, _ = StoredMessage.objects.filter(accepted_at__lt=now - window, seq__lte=low).delete()
    # Past their time to live (or the broker's retention) nobody will be given them any more;
    # a row with an idempotency key stays for the dedup window all the same, however short its
    # time to live, or the publisher's retry would be accepted as a new message.
    deleted += (
        StoredMessage.objects.filter(seq__lte=f0, expires_at__lt=now)
        .filter(Q(idempotency_key__isnull=True) | Q(accepted_at__lt=now - window))
        .delete()[0]
    )
    deleted += StoredMessage.objects.filter(
        accepted_at__lt=now - settings.HPWSN_MESSAGE_RETENTION_S
    ).delete()[0]
    if log_head() > f0 and r.set(state.FANOUT_SCHED, "1", nx=True, ex=60):
        tasks.fanout.delay()  # a publisher's wake-up was lost (Redis was down when it answered)
    if deleted and connection.vendor == "sqlite":
        _sqlite_shrink()
    return deleted


def _sqlite_shrink() -> None:
    """Give the pages of deleted log rows back to the file system (the embedded database).

    The database is created with `auto_vacuum=INCREMENTAL` (settings), so the file shrinks by
    what the checkpoint deleted instead of keeping its largest size for ever. Once the log is
    empty the write-ahead log is truncated too: nothing is being written then, so the
    checkpoint it needs does not wait on the web's inserts.
    """
    raw = connection.connection
    if raw is None or connection.in_atomic_block:
        return
    # executescript steps the pragma to its end; execute() would free a single page.
    raw.executescript("PRAGMA incremental_vacuum;")
    if not StoredMessage.objects.exists():
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def recover() -> bool:
    """Rebuild the delivery state of reliable topics after Redis lost it; True if this call did."""
    r = state.get_redis()
    token = uuid.uuid4().hex
    if r.exists(state.EPOCH) or not r.set(RECOVERY_LEASE, token, nx=True, px=30_000):
        return False
    try:
        cursors = dict(DeliveryCursor.objects.values_list("name", "seq"))
        alive = {str(i) for i in Subscription.objects.values_list("id", flat=True)}
        lows = {
            name[4:]: int(seq)
            for name, seq in cursors.items()
            if name.startswith("sub:") and name[4:] in alive
        }
        fanned = int(cursors.get(FANOUT_CURSOR, 0))
        # A subscription without a cursor had been given everything up to `fanned` (or was made
        # after the last checkpoint, so after all of it was accepted): "_rest" says so.
        start = min([fanned, *lows.values()])
        pipe = r.pipeline(transaction=True)
        pipe.delete(state.REPLAY)
        # Every subscription with a cursor is listed, also one at `start`: it must not fall
        # under "_rest".
        replay = {**lows, "_rest": fanned}
        pipe.hset(state.REPLAY, mapping={**replay, "_until": max(replay.values())})
        pipe.set(state.FANOUT_SEQ, start)
        pipe.execute()

        # Redriven letters not yet delivered were in Redis only: queue them again.
        requeued = letters_requeue(r)
        # Last: until the marker is back, a crash before this line runs the recovery again.
        r.set(state.EPOCH, repr(time.time()))
        # No cursor at all: a new installation, nothing to replay.
        (log.warning if cursors else log.info)(
            "Redis holds no delivery state: replaying the reliable log from %d (%d subscriptions)"
            ", %d redriven letter(s) queued again",
            start,
            len(lows),
            requeued,
        )
    finally:
        r.delete(RECOVERY_LEASE)
    r.set(state.FANOUT_SCHED, "1", ex=60)
    tasks.fanout.delay()
    return True
