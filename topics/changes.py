"""The change log: how a change of a topic or a subscription reaches every process.

Every process keeps the topic tree and the subscription index in memory. A change is written to
the database (the system of record) and, in the same transaction, appended to the change log
(`topics.Change`): which topic subtree or which subscription to load again. After the commit a
Redis counter of its kind (`hpwsn:ver:topicchanges`, `hpwsn:ver:subchanges`) is incremented to wake
the processes' feeds of that kind up; each reads the entries after the last one it applied and
loads only what they name, so applying a change costs in proportion to the change, not to the
number of topics or subscriptions.

Why a table and not a Redis stream: the entry commits with the change or not at all, so no crash
between the two can lose a delta, and a Redis that loses its data loses only the wake-up (every
process also reads the log every POLL_S seconds). The entries are numbered without holes (the
last number plus one, under an advisory lock held to the commit), so a process sees a gap when
the log was pruned past it. It rebuilds everything from the database when it starts, when it
finds a gap, when the Redis epoch marker changed or is missing (a Redis that came back empty), and
when the old full-rebuild version (`hpwsn:ver:topics`, `hpwsn:ver:subs`) moved: anything that
bumps it still works, at the price of a rebuild.

The entries name what changed rather than carrying it: a process loads the current rows, so
applying an entry twice, or an older entry after a newer one, leaves the same state. Their copy in
Redis may also carry the state of what they name (`change_carrier`): read in the writer's
transaction after its writes and the log's lock, it is the state that entry committed, so a woken
process applies the copies in order without reading the database.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

import psycopg
import redis
from django.db import connection, transaction
from django.utils import timezone

from hpwsn_site import state
from hpwsn_site.dblane import on_db
from topics.models import Change

log = logging.getLogger(__name__)

T = TypeVar("T")

_LOCK_ID = 0x4850_4348  # "HPCH": orders the entries of the change log
KEEP = 100_000  # entries kept; a process further behind than this rebuilds
PRUNE_EVERY = 1_000  # entries between two prunes
PAGE = 10_000  # entries read per query when catching up
POLL_S = 5.0  # read the log at least this often, woken or not (a wake-up lost with Redis)

TOPIC = Change.Kind.TOPIC.value
SUBSCRIPTION = Change.Kind.SUBSCRIPTION.value


def wake_key(kind: str) -> str:
    """The counter incremented after the commit of an entry of this kind: a feed is woken by the
    entries of its own kind only (a Subscribe does not make every process read the log for its
    topic tree)."""
    return state.TOPIC_CHANGES if kind == TOPIC else state.SUBSCRIPTION_CHANGES


# What an entry's copy in Redis carries to the processes it wakes, by kind: read(keys) gives the
# current state of each key as text ('' for gone); a key it leaves out carries nothing, and a
# process applying its entry reads the database as before. Registered by the app owning the kind.
_carriers: dict[str, Callable[[list[str]], dict[str, str]]] = {}


def change_carrier(kind: str, read: Callable[[list[str]], dict[str, str]]) -> None:
    _carriers[kind] = read


_batch = threading.local()


@contextlib.contextmanager
def change_batch() -> Iterator[None]:
    """Hold the entries recorded inside and write them at the end, in one go.

    For a transaction that changes many rows one service call at a time (a topic deleted with
    its subscriptions): the advisory lock is then taken once, after the last row lock.
    """
    if getattr(_batch, "pending", None) is not None:
        yield  # an outer batch writes them
        return
    _batch.pending = {}
    try:
        yield
        pending: dict[str, dict[str, None]] = _batch.pending
    finally:
        _batch.pending = None
    for kind, keys in pending.items():
        change_record(kind=kind, keys=keys)


def change_record(*, kind: str, keys: Iterable[str], carried: dict[str, str] | None = None) -> None:
    """Append entries to the change log in the caller's transaction; processes wake on commit.

    Call it as the last write of the transaction: the advisory lock it takes is held until the
    commit, and a row lock taken after it could deadlock with another change (change_batch
    defers the entries of many calls to the end). `carried`: the state of keys that this
    transaction created, as the kind's carrier would read it (a row no other transaction can
    have changed yet); the carrier reads the others (and, inside a change_batch, every key).
    """
    unique = list(dict.fromkeys(str(k) for k in keys))
    if not unique:
        return
    pending = getattr(_batch, "pending", None)
    if pending is not None:
        pending.setdefault(kind, {}).update(dict.fromkeys(unique))
        return
    # No savepoint of its own: the caller's transaction fails with it (a change is never
    # committed without its entry), and a savepoint costs two round trips.
    now = timezone.now()
    with transaction.atomic(savepoint=False):
        if connection.vendor == "postgresql":
            top = _append_locked(kind, unique, now)
        else:  # SQLite (local runs, benchmarks) serialises every writing transaction anyway
            first = changes_last()[0] + 1
            Change.objects.bulk_create(
                Change(id=first + i, kind=kind, key=key, created_at=now)
                for i, key in enumerate(unique)
            )
            top = first + len(unique) - 1
        last = top - len(unique)
        if top // PRUNE_EVERY != last // PRUNE_EVERY and top > KEEP:
            Change.objects.filter(id__lte=top - KEEP).delete()
        # After the writes and the lock: what no transaction committed after this one changed.
        carried = dict(carried or {})
        carrier = _carriers.get(kind)
        unread = [key for key in unique if key not in carried]
        if carrier is not None and unread:
            carried.update(carrier(unread))
        entries = [(last + 1 + i, kind, key, now, carried.get(key)) for i, key in enumerate(unique)]
        transaction.on_commit(lambda: changes_wake(kind=kind, entries=entries))


# The entries numbered after the newest one, in one statement: it runs after the lock is taken,
# so its snapshot holds every entry committed by the lock's earlier holders.
_APPEND_SQL = (
    f"INSERT INTO {Change._meta.db_table} (id, kind, key, created_at)"  # noqa: S608
    f" SELECT (SELECT COALESCE(MAX(id), 0) FROM {Change._meta.db_table}) + k.n, %s, k.key, %s"
    " FROM unnest(%s::text[]) WITH ORDINALITY AS k(key, n) RETURNING id"
)


def _append_locked(kind: str, keys: list[str], now: datetime.datetime) -> int:
    """PostgreSQL: take the log's lock (held to the commit) and append; the newest number.

    Both in one round trip where the parameters are bound on the client (Django's default): two
    statements of one query, each with its own snapshot, so the append's is taken once the lock is
    held, as with two calls.
    """
    with connection.cursor() as cursor:
        if isinstance(cursor.cursor, psycopg.ClientCursor):
            cursor.execute(
                f"SELECT pg_advisory_xact_lock(%s); {_APPEND_SQL}", [_LOCK_ID, kind, now, keys]
            )
            cursor.nextset()  # the append's rows
        else:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_ID])
            cursor.execute(_APPEND_SQL, [kind, now, keys])
        return max(int(row[0]) for row in cursor.fetchall())


Entry = tuple[int, str, str, object]  # id, kind, key, created_at
Recent = tuple[int, str, str, object, str | None]  # a copy in Redis: what it carries, or None

# The newest entries are copied to Redis with their wake-up (`state.CHANGES_RECENT`): a process
# woken by them reads them there (one round trip to Redis) rather than from the log (one to the
# database), and checks them against the log at its next poll. What a copy carries, if anything,
# goes to `state.CHANGES_CARRIED` under the same number. KEYS[1] the kind's wake counter, KEYS[2]
# the copies, KEYS[3] what they carry; ARGV: how many to keep, then for each entry its number, its
# copy and what it carries ('' for nothing).
RECENT_KEEP = 1_000
_WAKE = """
redis.call('incr', KEYS[1])
for i = 2, #ARGV, 3 do
  redis.call('zadd', KEYS[2], ARGV[i], ARGV[i + 1])
  if ARGV[i + 2] ~= '' then redis.call('zadd', KEYS[3], ARGV[i], ARGV[i + 2]) end
end
redis.call('zremrangebyrank', KEYS[2], 0, -tonumber(ARGV[1]) - 1)
local first = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
if #first > 0 then redis.call('zremrangebyscore', KEYS[3], '-inf', '(' .. first[2]) end
return 1
"""


def changes_wake(*, kind: str, entries: Iterable[Recent] = ()) -> None:
    """Tell every process to read the change log now (after the commit of a change)."""
    args: list[object] = [RECENT_KEEP]
    for number, entry_kind, key, at, carried in entries:
        iso = at.isoformat() if isinstance(at, datetime.datetime) else str(at)
        state_of = "" if carried is None else f"{number}|{key}|{carried}"
        args += [number, f"{number}|{entry_kind}|{iso}|{key}", state_of]
    try:
        # The feeds of that kind (and, for topics, the directory sync).
        keys = (wake_key(kind), state.CHANGES_RECENT, state.CHANGES_CARRIED)
        state.get_redis().eval(_WAKE, 3, *keys, *args)
    except redis.RedisError as exc:
        # The entry is committed: every process finds it at its next poll of the log.
        log.warning("change log wake-up not sent: %s", exc)


# A feed's check in one round trip: the markers (epoch, full-rebuild version, wake-up counter)
# and, when the wake-up counter is not the one the feed last saw, the copies of the entries after
# the feed's last one and what they carry. KEYS: the epoch, the version, the wake counter, the
# copies, what they carry; ARGV: the wake-up counter seen ('' for none), the last entry applied
# (0: none, no copies read), how many to read at most. A counter still absent (no entry of the
# feed's kind since Redis started) is the one a feed that saw none saw.
_POLL = """
local m = redis.call('mget', KEYS[1], KEYS[2], KEYS[3])
if ARGV[2] ~= '0' and (m[3] or '') ~= ARGV[1] then
  m[4] = redis.call('zrangebyscore', KEYS[4], '(' .. ARGV[2], '+inf', 'LIMIT', 0, ARGV[3])
  m[5] = redis.call('zrangebyscore', KEYS[5], '(' .. ARGV[2], '+inf', 'LIMIT', 0, ARGV[3])
end
return m
"""
_poll_script: Any = None  # registered once, called with each thread's own client


def changes_poll(
    *, version_key: str, kind: str, wake_seen: object, last: int
) -> tuple[tuple[object, object, object], list[Recent] | None]:
    """The markers, and the entries after `last` that Redis holds (oldest first) when the wake-up
    counter moved from `wake_seen` (else None)."""
    global _poll_script
    r = state.get_redis()
    if _poll_script is None:
        _poll_script = r.register_script(_POLL)
    found = _poll_script(
        keys=[
            state.EPOCH,
            version_key,
            wake_key(kind),
            state.CHANGES_RECENT,
            state.CHANGES_CARRIED,
        ],
        args=[wake_seen if wake_seen is not None else b"", last, PAGE],
        client=r,
    )
    epoch, version, wake = found[:3]
    if len(found) <= 3:
        return (epoch, version, wake), None
    carried: dict[int, tuple[str, str]] = {}
    for member in found[4]:
        number, key, state_of = member.decode().split("|", 2)
        carried[int(number)] = (key, state_of)
    return (epoch, version, wake), [_entry(member, carried) for member in found[3]]


def _entry(member: bytes, carried: dict[int, tuple[str, str]]) -> Recent:
    """A copy, with what it carries: the state filed under its number for its key (a copy
    replaced since, naming another key, carries nothing)."""
    number, kind, at, key = member.decode().split("|", 3)
    found = carried.get(int(number))
    state_of = found[1] if found is not None and found[0] == key else None
    return (int(number), kind, key, datetime.datetime.fromisoformat(at), state_of)


def changes_after(last: int, limit: int = PAGE) -> list[Entry]:
    """Entries from `last` on (`last` itself first, when it is still there), oldest first."""
    rows = Change.objects.filter(id__gte=last).order_by("id")[:limit]
    return [
        (int(i), str(k), str(key), at)
        for i, k, key, at in rows.values_list("id", "kind", "key", "created_at")
    ]


def changes_last() -> tuple[int, object]:
    """The number and time of the newest entry ((0, None) for an empty log)."""
    row = Change.objects.order_by("-id").values_list("id", "created_at").first()
    return (int(row[0]), row[1]) if row else (0, None)


class ChangeFeed(Generic[T]):
    """A per-process value (topic tree, subscription index) kept current by the change log.

    `build()` loads it whole; `apply(value, keys, carried)` loads again what the keys of this
    feed's kind name, in place, and returns False when it cannot (then the value is rebuilt);
    `carried` holds the state that the copies in Redis carried for some of the keys (a key's
    newest copy decides), which it takes instead of reading them. One thread at a time updates
    it; readers see each change applied or not, never half of it, as far as `apply` replaces
    before it removes.
    """

    def __init__(
        self,
        *,
        kind: str,
        version_key: str,
        build: Callable[[], T],
        apply: Callable[[T, list[str], dict[str, str]], bool],
    ) -> None:
        self.kind = kind
        self.version_key = version_key
        self.build = build
        self.apply = apply
        self.value: T | None = None
        self.version: object = None  # (epoch marker, full-rebuild version) built from
        self.wake: object = None
        self.last = 0  # the last entry of the log applied
        # Its time: an entry of that number with another time is not the one applied (a database
        # restored from a backup, or rolled back, numbers its entries again).
        self.last_at: object = None
        # Entries applied from their copy in Redis (number -> time), checked against the log at
        # its next read.
        self.unverified: dict[int, object] = {}
        self.checked = 0.0
        self.polled = 0.0
        self.rebuilds = 0
        self.applied = 0
        self.updates = 0  # times a thread brought the value up to date (under the lock)
        self._lock = threading.Lock()

    def get(self, *, max_age: float) -> T:
        now = time.monotonic()
        if self.value is not None and now - self.checked < max_age:
            return self.value
        polled = None
        updates = self.updates
        if self.value is not None and now - self.polled < POLL_S:
            # Nothing changed since the value was brought up to date: no lock (the pump threads
            # of a worker process check it before every run, each with a round trip to Redis).
            polled = self._poll()
            (epoch, version, wake), _recent = polled
            if epoch is not None and (epoch, version) == self.version and wake == self.wake:
                self.checked = now
                return self.value
        # The database work, and the lock, on the lane of a pump thread (hpwsn_site/dblane.py).
        return on_db(self._update, now, polled, updates)

    def _update(
        self,
        now: float,
        polled: tuple[tuple[object, object, object], list[Recent] | None] | None,
        updates: int,
    ) -> T:
        with self._lock:
            if polled is None or self.updates != updates:
                # Read again only when another thread brought the value up to date meanwhile:
                # its markers may be newer than those read above.
                polled = self._poll()
            (epoch, version, wake), recent = polled
            if self.value is None or epoch is None or (epoch, version) != self.version:
                # No epoch marker: this Redis may have lost its data (counters start again, a
                # value met again must not pass for the one built from): trust nothing.
                self._rebuild((epoch, version))
            elif now - self.polled >= POLL_S or (
                # Woken: the entries' copy in Redis, else the log.
                wake != self.wake and not self._catch_up_recent(recent)
            ):
                self._catch_up()
            self.wake = wake
            self.checked = now
            self.updates += 1
            assert self.value is not None
            return self.value

    def _poll(self) -> tuple[tuple[object, object, object], list[Recent] | None]:
        try:
            return changes_poll(
                version_key=self.version_key, kind=self.kind, wake_seen=self.wake, last=self.last
            )
        except redis.RedisError:
            # Redis away (a restart, a Sentinel failover): no marker is trusted, so the value is
            # rebuilt from the database, the system of record, as without an epoch marker. The
            # reliable publish path goes on without Redis.
            return (None, None, None), None

    def peek(self) -> T | None:
        """The value as last built, without any I/O (for the async hot path)."""
        return self.value

    def cached(self) -> state.Cached[T] | None:
        """The value with the markers it reflects (`state.Cached`), as `get` would return it
        without a lock after finding them unchanged; None when `get` must run (nothing built, no
        epoch marker, or the log is due to be read again)."""
        # The markers before the value: they are updated after it, so a value newer than its
        # markers can be met here (then the markers are found moved), never an older one.
        version, wake, polled = self.version, self.wake, self.polled
        value = self.value
        if value is None or not isinstance(version, tuple) or version[0] is None:
            return None
        if time.monotonic() - polled >= POLL_S:
            return None
        return state.Cached(
            value, (state.EPOCH, self.version_key, wake_key(self.kind)), (*version, wake)
        )

    def is_fresh(self, *, max_age: float) -> bool:
        return time.monotonic() - self.checked < max_age

    def _rebuild(self, version: object) -> None:
        # The log position first: an entry committed during the build is applied again after
        # it, which changes nothing.
        self.last, self.last_at = changes_last()
        self.unverified = {}
        replaced = self.value is not None
        self.value = built(self.build)
        kept(replaced=replaced)
        self.version = version
        self.polled = time.monotonic()
        self.rebuilds += 1

    def _catch_up_recent(self, entries: list[Recent] | None) -> bool:
        """Apply the entries after the last one applied from their copy in Redis (read with the
        markers); False when it does not hold them all from there on (then the log is read)."""
        if self.last == 0 or entries is None:
            return False
        numbers = [self.last, *(e[0] for e in entries)]
        if not entries or any(b != a + 1 for a, b in itertools.pairwise(numbers)):
            return False  # a wake-up not yet sent or lost, or entries beyond the copy
        keys: list[str] = []
        carried: dict[str, str] = {}  # a key's newest entry decides
        for _id, kind, key, _at, state_of in entries:
            if kind == self.kind:
                keys.append(key)
                if state_of is None:
                    carried.pop(key, None)
                else:
                    carried[key] = state_of
        assert self.value is not None
        if keys and not self.apply(self.value, list(dict.fromkeys(keys)), carried):
            self._rebuild(self.version)
            return True
        self.applied += len(keys)
        self.last, self.last_at = entries[-1][0], entries[-1][3]
        self.unverified.update((number, at) for number, _k, _key, at, _c in entries)
        return True

    def _catch_up(self) -> None:
        self.polled = time.monotonic()
        assert self.value is not None
        # The entries to find in the log as they were applied: the last one, and every one
        # applied from the copy in Redis since the log was last read (a copy that outlived its
        # database, restored from a backup, would otherwise go unnoticed).
        expected = self.unverified or {self.last: self.last_at}
        self.unverified = {}
        start = min(expected)
        while True:
            found = changes_after(start)
            entries = [e for e in found if e[0] > self.last]
            if self.last > 0:
                seen = {e[0]: e[3] for e in found if e[0] <= self.last}
                if any(seen.get(number) != at for number, at in expected.items()):
                    # An entry applied is gone or another: the log was pruned past this process
                    # (or the database replaced). What happened meanwhile is unknown.
                    self._rebuild(self.version)
                    return
            if not entries:
                return
            for a, b in itertools.pairwise([self.last, *(e[0] for e in entries)]):
                if b != a + 1:  # numbered without holes: a gap is a pruned entry
                    self._rebuild(self.version)
                    return
            keys = [key for _id, kind, key, _at in entries if kind == self.kind]
            if keys and not self.apply(self.value, list(dict.fromkeys(keys)), {}):
                self._rebuild(self.version)
                return
            self.applied += len(keys)
            self.last, self.last_at = entries[-1][0], entries[-1][3]
            if len(found) < PAGE:
                return
            start, expected = self.last, {self.last: self.last_at}


def built(build: Callable[[], T]) -> T:
    """build() with the cyclic garbage collector paused. A build allocates millions of objects
    that all live on; the collections their allocation triggers would scan them again and again
    (a 10^6-topic tree loads in about half the time without them)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return build()
    finally:
        if enabled:
            gc.enable()


def kept(*, replaced: bool) -> None:
    """After a built value is in place: every object of the process, the build's millions among
    them, is moved out of the cyclic collector's reach (`gc.freeze`).

    Built with the collector paused, they all sit in its youngest generation: the first
    collection after the build scanned every one of them (0.3-0.5 s at 10^5 subscriptions, paid
    by whatever lookup or push allocated at that moment), and every full collection after it did
    so again. Reference counting still frees frozen objects, but not reference cycles, and the
    value a rebuild replaces holds some (the pattern trie's links to parents). So after a rebuild
    the frozen objects are put back in the collector's view, and frozen again only after the
    next full collection, which frees the old value's cycles once nothing holds it (a lookup in
    another thread may, at the moment of the rebuild)."""
    global _freeze_after_full
    if replaced:
        gc.unfreeze()
        _freeze_after_full = True
    elif not _freeze_after_full:
        gc.freeze()


_freeze_after_full = False


def _freeze_after_a_full_collection(phase: str, info: dict[str, int]) -> None:
    global _freeze_after_full
    if _freeze_after_full and phase == "stop" and info.get("generation") == 2:
        _freeze_after_full = False
        gc.freeze()


gc.callbacks.append(_freeze_after_a_full_collection)
