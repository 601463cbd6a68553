"""Redis clients, key names and cache versions shared by the web, workers and beat."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis
import redis.asyncio as aioredis
from django.conf import settings

from hpwsn_site.dblane import on_db
from hpwsn_site.env import parse_rate
from hpwsn_site.redisconn import RedisTarget

T = TypeVar("T")

PREFIX = "hpwsn:"
INGEST = PREFIX + "ingest"  # accepted notifications awaiting fan-out: b"<id>|<ts>|<topic path>"
FANOUT_SCHED = PREFIX + "fanout:sched"  # set while a fan-out task is queued or running
RETRY = PREFIX + "retry"  # zset: subscription id -> due time of its next attempt
# zset: unordered subscription id -> due time of its first batch set aside (see aside_key)
ASIDE_DUE = PREFIX + "asidedue"
LAST_DELIVERY = PREFIX + "lastdelivery"  # hash: push subscription id -> time of its last delivery
# hash: subscription id -> evaluations of its MessageContent filter that failed (raised, or a
# filter refused since it was stored). Such an evaluation matches nothing; the count marks the
# subscription for operators (console, /metrics). Freed with the subscription.
FILTER_ERRORS = PREFIX + "filtererr"
VERSION_TOPICS = PREFIX + "ver:topics"
# Reliable topics (dispatch/reliable.py): the last sequence number of the database log the fan-out
# has moved into queues, the marker that this Redis still holds the delivery state, and the
# per-subscription low watermarks a replay after a Redis loss starts from.
FANOUT_SEQ = PREFIX + "fanout:seq"
EPOCH = PREFIX + "epoch"
REPLAY = PREFIX + "replay"
# Set of the subscriptions that may have something queued: added to in the same transaction as
# their queue (or pull point), removed by the checkpoint once it finds their queues empty. The
# checkpoint and the safety net look at these only, however many subscriptions are idle.
BUSY = PREFIX + "busy"
# Hash: busy subscription id -> the priorities other than DEFAULT_PRIORITY it had queued since
# the checkpoint last found its queues empty (digits, e.g. "97"). Set by the fan-out in the same
# script as the queue, removed with the subscription's busy mark. The checkpoint reads the
# default queue and these only, not ten queues per busy subscription.
PRIOS = PREFIX + "prios"
READY = PREFIX + "ready"  # list: subscriptions whose pump should run (dispatch/ready.py)
# Hash: subscription id -> the time its pump was scheduled (put on the ready list); the field
# goes when the pump finds nothing left. The fan-out makes ready only the subscriptions it sets
# a field for, so a queue has one pump scheduled at a time. One hash rather than a key each: one
# Notify to 10^4 subscriptions sets 10^4 of them in one script (bench/scale.py).
SCHED = PREFIX + "sched"
# Versions before the hash kept a key per subscription (`hpwsn:sched:<id>`, no expiry): what a
# Redis upgraded from them still holds is dropped when a worker starts (legacy_marks_drop).
LEGACY_SCHED_MATCH = SCHED + ":*"
PRIORITIES = range(9, -1, -1)  # highest first: the order the pump looks at the queues
DEFAULT_PRIORITY = 4
VERSION_SUBS = PREFIX + "ver:subs"
# Incremented after the commit of an entry of the change log (topics/changes.py), one counter per
# kind: the processes then read the log and load again what changed. VERSION_TOPICS and
# VERSION_SUBS still mean "rebuild everything" for whatever bumps them.
TOPIC_CHANGES = PREFIX + "ver:topicchanges"  # entries of topics (the directory sync watches it too)
SUBSCRIPTION_CHANGES = PREFIX + "ver:subchanges"  # entries of subscriptions
# Zset: a copy of the newest entries of the change log of either kind (a process must see every
# number to know it missed none), scored by number, member "<id>|<kind>|<created_at ISO>|<key>".
CHANGES_RECENT = PREFIX + "changes:recent"
# Zset: what the copies above carry (topics/changes.py, change_carrier), scored by the same number,
# member "<id>|<key>|<state>"; apart, so that a process of a version before reads its copies as
# before. Trimmed with them.
CHANGES_CARRIED = PREFIX + "changes:carried"
# Federation (federation/services.py): hash peer name -> JSON {last_ok, links, paths, last_error}
# (paths: topic path -> the interest path its link states, sites joined by "/"), written by each
# sync round; the site registry /metrics and the console read.
FEDERATION_PEERS = PREFIX + "fed:peers"
# "1" while some publisher registration asked for demand-based publishing, "0" while none does;
# absent: not known (read from the database). Kept DEMAND_TTL_S seconds, so a write that missed
# it is seen within that time (subscriptions/registrations.py).
DEMAND = PREFIX + "demand"
DEMAND_TTL_S = 60
# Held by the federation sync round that is running (one at a time per site).
FEDERATION_SYNC_LOCK = PREFIX + "fed:synclock"


def federation_seen_key(peer: str, push_id: str) -> str:
    """Set once a message pushed by `peer` (its id in the push, hpwsn:Id) is stored here; kept
    for the dedup window, and at least as long as a push's signature holds, so a later push of it
    in another batch, or the same signed push sent again, is dropped (federation/services.py)."""
    return f"{PREFIX}fed:seen:{peer}:{push_id}"


def federation_origin_key(origin: str, origin_id: str) -> str:
    """The peer that first brought here the notification (origin site, origin id) of an origin
    that is not a direct peer, kept for the dedup window: the same notification relayed by
    another peer is dropped, so each subscriber here gets it once however many ways it comes (a
    direct peer's notifications are taken from its own link only; federation/services.py)."""
    return f"{PREFIX}fed:origin:{origin}:{origin_id}"


def federation_lock_key(origin: str) -> str:
    """Held while a push with notifications relayed from `origin` (not a direct peer) is checked
    and stored: of two peers relaying the same origin's stream, the later one never stores a
    newer notification before the earlier one has stored an older one it claimed
    (federation/services.py)."""
    return f"{PREFIX}fed:lock:{origin}"


def federation_rate_key(peer: str) -> str:
    """Hash {tokens, at}: what `peer` may still push here now, in notifications, and when that
    was last worked out (HPWSN_FEDERATION_INBOUND_RATE, a token bucket; federation/services.py)."""
    return f"{PREFIX}fed:rate:{peer}"


def federation_turn_key(origin: str) -> str:
    """The peer whose push waits for the lock of `origin` (federation_lock_key) and is to take it
    next, so a peer whose pushes hold it back to back cannot keep it from another peer; kept
    while that push waits (federation/services.py)."""
    return f"{PREFIX}fed:turn:{origin}"


VERSION_LIMITS = PREFIX + "ver:limits"


def payload_key(nid: str) -> str:
    return f"{PREFIX}n:{nid}"


def current_key(topic_path: str) -> str:
    return f"{PREFIX}cur:{topic_path}"


QUEUE_PREFIX = PREFIX + "q:"


def queue_key(sub_id: str, priority: int = DEFAULT_PRIORITY) -> str:
    """One FIFO list per subscription and priority (0-9); items are b"<id>|<mark>"."""
    return f"{QUEUE_PREFIX}{sub_id}:{priority}"


def queue_keys(sub_id: str) -> list[str]:
    """A subscription's queues, highest priority first."""
    return [queue_key(sub_id, p) for p in PRIORITIES]


def lease_key(sub_id: str) -> str:
    return f"{PREFIX}lease:{sub_id}"


def attempts_key(sub_id: str) -> str:
    """List of JSON attempts at the batches at the heads of the queues, each naming its batch's
    first item (`head`): a batch's count is the number of its records (dispatch/deliver.py)."""
    return f"{PREFIX}att:{sub_id}"


def aside_key(sub_id: str) -> str:
    """Unordered subscriptions: zset of the batches whose push failed, each waiting for its own
    next attempt (member: JSON {"items": [queue items], "attempts": [...]}, score: due time)."""
    return f"{PREFIX}aside:{sub_id}"


def failing_since_key(sub_id: str) -> str:
    """Time of the first failed push since the subscription's last success."""
    return f"{PREFIX}failing:{sub_id}"


def pullpoint_key(pp_id: str) -> str:
    return f"{PREFIX}pp:{pp_id}"


def pull_answer_keys(pp_id: str) -> tuple[str, str]:
    """The last GetMessages answer of a pull point, kept until the next GetMessages for a retry
    of the same request: the request's id, and the list of the items it took (their bodies'
    references held)."""
    return f"{PREFIX}ppans:{pp_id}:id", f"{PREFIX}ppans:{pp_id}"


def subscription_keys(sub_id: str) -> list[str]:
    """Every key a subscription may hold (freed on unsubscribe and expiry)."""
    return [
        *queue_keys(sub_id),
        aside_key(sub_id),
        lease_key(sub_id),
        attempts_key(sub_id),
        failing_since_key(sub_id),
    ]


# Message bodies are counted (dispatch/bodies.py). release(prefix, items, first) gives back one
# reference per item from items[first] on (an item's id is what comes before its first "|"); the
# last reference deletes the body. A missing count (DECR gives -1) deletes only the count.
RELEASE_LUA = """
local function release(prefix, items, first)
  for i = first or 1, #items do
    local nid = string.match(items[i], '^([^|]*)')
    local left = redis.call('decr', prefix .. 'refs:' .. nid)
    if left <= 0 then
      redis.call('del', prefix .. 'refs:' .. nid)
      if left == 0 then redis.call('del', prefix .. 'n:' .. nid) end
    end
  end
end
"""

# Whether a list starts with items[first..], the items a caller read a moment before (another
# reader, a pump or a bound's trim may have moved its head since).
HEAD_LUA = """
local function head_is(key, items, first)
  local n = #items - first + 1
  local head = redis.call('lrange', key, 0, n - 1)
  if #head ~= n then return false end
  for i = 1, n do
    if head[i] ~= items[first + i - 1] then return false end
  end
  return true
end
"""

# Drop lists of items (queues, pull points) and aside zsets (members are JSON {"items": [...]})
# with their references. KEYS: the lists, then the zsets; ARGV[1] the key prefix, ARGV[2] how
# many KEYS are lists.
_BODIES_DROP = (
    RELEASE_LUA
    + """
local lists = tonumber(ARGV[2])
for k = 1, #KEYS do
  if k <= lists then
    release(ARGV[1], redis.call('lrange', KEYS[k], 0, -1))
  else
    for _, member in ipairs(redis.call('zrange', KEYS[k], 0, -1)) do
      release(ARGV[1], cjson.decode(member)['items'])
    end
  end
  redis.call('del', KEYS[k])
end
return 1
"""
)


def bodies_drop(pipe: Any, *, lists: list[str], asides: tuple[str, ...] = ()) -> None:
    """Queue on a pipeline (or run on a client) the deletion of these lists and aside zsets,
    giving back the references of every item they held."""
    pipe.eval(_BODIES_DROP, len(lists) + len(asides), *lists, *asides, PREFIX, len(lists))


def legacy_marks_drop(r: Any, *, chunk: int = 1000) -> int:
    """Delete the per-subscription scheduled marks of versions before `SCHED`: nothing reads
    them, and nothing else would ever delete them. Incremental (SCAN), so a large Redis is not
    held up. Returns how many went."""
    gone = 0
    batch: list[bytes] = []
    for key in r.scan_iter(match=LEGACY_SCHED_MATCH, count=chunk):
        batch.append(key)
        if len(batch) >= chunk:
            gone += int(r.unlink(*batch))
            batch = []
    if batch:
        gone += int(r.unlink(*batch))
    return gone


def subscription_forget(pipe: Any, sub_id: str) -> None:
    """Queue on a pipeline the removal of everything Redis holds for a subscription."""
    bodies_drop(pipe, lists=queue_keys(sub_id), asides=(aside_key(sub_id),))
    pipe.delete(*subscription_keys(sub_id))
    pipe.zrem(RETRY, sub_id)
    pipe.zrem(ASIDE_DUE, sub_id)
    pipe.hdel(LAST_DELIVERY, sub_id)
    pipe.hdel(FILTER_ERRORS, sub_id)
    pipe.hdel(PRIOS, sub_id)
    pipe.hdel(SCHED, sub_id)


_local = threading.local()
# By the loop itself, weakly: a loop that ended may leave its id (an address) to a new one, and
# its client, made for that loop and the settings of its time, must not be handed to the new loop.
_async_clients: weakref.WeakKeyDictionary[Any, aioredis.Redis] = weakref.WeakKeyDictionary()


def redis_target() -> RedisTarget:
    """The site's Redis as the settings name it: a URL, or a master behind Redis Sentinel."""
    return RedisTarget(
        url=settings.REDIS_URL,
        sentinels=tuple(settings.REDIS_SENTINELS),
        master=settings.REDIS_SENTINEL_MASTER,
        sentinel_password=settings.REDIS_SENTINEL_PASSWORD,
    )


def get_redis() -> Any:
    """This thread's Redis client (a thread of a process forked from this one gets its own).

    It holds one connection for its commands: a command taken through redis-py's pool cost
    about 60,000 instructions more of the client's CPU (the pool's lock and bookkeeping, its
    metrics hooks, a poll of the socket), as much as the rest of a short command. Its
    pipelines take a connection of their own from its pool. Nothing hands a thread's client to
    another thread, so the client's lock never waits. Behind Sentinel it uses its pool for
    every command (`RedisTarget.client` says why)."""
    # Typed as Any: redis-py declares every reply as bytes | str (decode_responses is a runtime
    # flag); these clients never decode, so replies are bytes.
    client = getattr(_local, "client", None)
    if client is None or _local.pid != os.getpid():
        # With Sentinel the client finds the master again after a failover by itself: a call
        # that fails meanwhile raises a ConnectionError like a Redis that is down.
        client = redis_target().client(
            single_connection=True, socket_timeout=10, health_check_interval=30
        )
        _local.client, _local.pid = client, os.getpid()
    return client


class Script:
    """A Lua script that a client calls by its SHA1 (EVALSHA): its body, a few kilobytes for the
    pump's, is not encoded, sent and hashed by Redis at every call. It is sent (EVAL, which also
    caches it) only when Redis answers that it does not know it: it has just started, or its
    scripts were flushed. On a pipeline, whose errors come back only at its end, it goes as EVAL.
    Called as `r.eval` is: `script(r, numkeys, *keys_and_args)`."""

    def __init__(self, body: str) -> None:
        self.body = body
        self.sha = hashlib.sha1(body.encode(), usedforsecurity=False).hexdigest()

    def __call__(self, r: Any, numkeys: int, *args: Any) -> Any:
        if isinstance(r, redis.client.Pipeline):
            return r.eval(self.body, numkeys, *args)
        try:
            return r.evalsha(self.sha, numkeys, *args)
        except redis.exceptions.NoScriptError:
            return r.eval(self.body, numkeys, *args)


def get_async_redis() -> Any:
    """The running event loop's asyncio client, made at its first call in that loop."""
    import asyncio

    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        client = _async_clients[loop] = redis_target().async_client(socket_timeout=10)
    return client


class SharedClock:
    """Epoch seconds by the Redis server's clock, for times that processes on different hosts
    compare (a subscription's creation against a message's acceptance).

    The offset of this host's clock to Redis's is measured every `every` seconds (half the round
    trip counted on our side), so reading the time costs no round trip.
    """

    def __init__(self, every: float = 10.0) -> None:
        self.every = every
        self.offset = 0.0
        self.measured = -1e9

    def now(self) -> float:
        local = time.time()
        if time.monotonic() - self.measured >= self.every:
            self.measure()
        return local + self.offset

    def measure(self) -> None:
        self.measured = time.monotonic()
        try:
            before = time.time()
            seconds, micros = get_redis().time()
            after = time.time()
        except redis.RedisError:
            return  # keep the last offset; Redis is away for a moment
        self.offset = seconds + micros / 1e6 - (before + after) / 2


_clock = SharedClock()


def shared_now() -> float:
    """The time every process agrees on (Redis's clock), in epoch seconds."""
    return _clock.now()


def bump(version_key: str) -> int:
    return int(get_redis().incr(version_key))


# Hash: periodic task -> "<started>,<seconds>" of its last run (periodic_within_share).
PERIODIC = PREFIX + "periodic"


def periodic_within_share(name: str, share: float, run: Callable[[], object]) -> bool:
    """Run a periodic task whose cost grows with the work, unless its last run (in any process)
    cost more than `share` of the time since it started; whether it ran.

    Ten thousand busy subscriptions make the checkpoint cost a tenth of a second of Redis and
    Python, a hundred thousand about a second: run every second whatever it costs, it would take
    a whole process. Spaced out this way, it still runs at its interval while it is cheap.
    """
    r = get_redis()
    started = shared_now()
    raw = r.hget(PERIODIC, name)
    if raw is not None:
        at, cost = (float(x) for x in raw.split(b","))
        if started - at < cost / share:
            return False
    t0 = time.monotonic()
    run()
    r.hset(PERIODIC, name, f"{started!r},{time.monotonic() - t0!r}")
    return True


class VersionedCache(Generic[T]):
    """A per-process value (topic tree, subscription index) rebuilt when its shared version moves.

    The version is read before the rebuild: a change racing with the rebuild bumps the version
    again, so the next check rebuilds once more instead of keeping a stale value. It is read with
    the Redis epoch marker: counters start again from zero in a Redis that lost its data, and a
    count met again must not pass for the one this process built from. Without a marker (for
    the second or so until the checkpoint writes one) no version is trusted: every check rebuilds.
    """

    def __init__(self, version_key: str, build: Callable[[], T]) -> None:
        self.version_key = version_key
        self.build = build
        self.value: T | None = None
        self.version: object = None
        self.checked = 0.0

    def get(self, *, max_age: float) -> T:
        now = time.monotonic()
        if self.value is None or now - self.checked >= max_age:
            try:
                version: tuple[Any, ...] = tuple(get_redis().mget(EPOCH, self.version_key))
            except redis.RedisError:
                # Redis away (a restart, a Sentinel failover): no version is trusted, so the
                # value is rebuilt from the database (the system of record) as without a
                # marker. The reliable publish path goes on without Redis; it used to answer
                # 500 here.
                version = (None,)
            if self.value is None or version != self.version or version[0] is None:
                self.value = on_db(self.build)  # a pump thread's, on its process's lane
                self.version = version
            self.checked = now
        return self.value

    def peek(self) -> T | None:
        """The value as last built, without any I/O (for the async hot path)."""
        return self.value

    def cached(self) -> Cached[T] | None:
        """The value as last built with the markers it was built from (`Cached`); None when there
        is nothing to trust (not built yet, or built without an epoch marker)."""
        version = self.version  # before the value: a value newer than its markers is only refused
        value = self.value
        if value is None or not isinstance(version, tuple) or version[0] is None:
            return None
        return Cached(value, (EPOCH, self.version_key), version)

    def is_fresh(self, *, max_age: float) -> bool:
        return time.monotonic() - self.checked < max_age


@dataclass(frozen=True, slots=True)
class Cached(Generic[T]):
    """A per-process value with the Redis keys whose values it was built from and those values
    (None for a key that was absent). A script that finds the keys unchanged, in the same step
    as its own work, has used a value as fresh as a read of the markers before it would have
    given, without that read's round trip (dispatch/pump.py)."""

    value: T
    keys: tuple[str, ...]
    seen: tuple[object, ...]

    def expected(self) -> list[object]:
        """The values the script compares (an absent key reads as the empty string there)."""
        return [b"" if v is None else v for v in self.seen]


# REST API (hpwsn_site/api/): the version of the set of live API tokens (bumped on create and
# revoke, so every web process drops a revoked token at its next request), and the fixed-window
# request counters of the API's throttling: hpwsn:api:rl:<scope>:<principal>:<window start>.
VERSION_API_TOKENS = PREFIX + "ver:apitokens"


def api_throttle_key(scope: str, ident: str, window: int) -> str:
    return f"{PREFIX}api:rl:{scope}:{ident}:{window}"


@dataclass(frozen=True)
class LoginWindow:
    """The fixed window of HPWSN_LOGIN_THROTTLE that a client address's failed logins under one
    user name are counted in, wherever credentials are checked: the console's and the admin's
    forms (hpwsn_site/loginguard.py) and SOAP and REST credentials (hpwsn_site/auth.py) share
    the counter hpwsn:login:fail:<address>:<name>:<window start>."""

    key: str
    limit: int  # failures the window allows
    period: int  # seconds
    ends_in: float  # seconds until the window ends

    def failed(self) -> int:
        """Count one failure; the window's failures so far."""
        pipe = get_redis().pipeline(transaction=False)
        pipe.incr(self.key)
        pipe.expire(self.key, self.period + 1, nx=True)
        return int(pipe.execute()[0])

    async def afailed(self) -> int:
        async with get_async_redis().pipeline(transaction=False) as pipe:
            pipe.incr(self.key)
            pipe.expire(self.key, self.period + 1, nx=True)
            return int((await pipe.execute())[0])

    def spent(self) -> bool:
        """The window's failures, counted by any process at any edge, reached its limit."""
        return int(get_redis().get(self.key) or 0) >= self.limit

    async def afailures(self) -> int:
        """The window's failures, counted by any process at any edge."""
        return int(await get_async_redis().get(self.key) or 0)


def login_window(address: str, name: str) -> LoginWindow | None:
    """The window the failures of `address` under the user name `name` count in now; None when
    HPWSN_LOGIN_THROTTLE is off. User names are counted without case or surrounding spaces."""
    limit, period = parse_rate(settings.HPWSN_LOGIN_THROTTLE)
    if limit <= 0:
        return None
    now = time.time()
    name = name.strip().lower()
    key = f"{PREFIX}login:fail:{address}:{name}:{int(now // period)}"
    return LoginWindow(key=key, limit=limit, period=period, ends_in=period - now % period)
