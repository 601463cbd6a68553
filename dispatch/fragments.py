"""Fragmentation on the way of a notification (thesis 5.3.3.4).

Incoming: a fragment whose Package forbids partial delivery (F=1, P=0) waits in Redis, in the hash
`hpwsn:frag:<n>:<publisher>:<topic>:<identification>` (offset -> fragment text, plus the Topic and
ProducerReference of the first fragment seen), until every fragment of its message has arrived;
a reassembly is its publisher's own (a principal, or an anonymous caller's address: another
publisher's fragments under the same Identification make another message);
the whole message then goes on as one notification. A reassembly that waits longer than
HPWSN_FRAGMENT_TIMEOUT_S for its next fragment is dropped, counted and logged by the beat task
`fragments_expire`. A fragment that allows partial delivery (P=1) is accepted on its own and keeps
its Package (`wsn.stored_fragment`), so the consumer can reassemble it.

Outgoing: a message whose payload exceeds the fragment size is pushed as fragments in the same
format, its Identification being the notification id.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.conf import settings
from lxml import etree

from hpwsn import errors, fragment, ns, wsn
from hpwsn.xmlsafe import XMLRejected
from hpwsn.xmlsafe import parse as parse_xml
from hpwsn_site import state
from monitoring import events

if TYPE_CHECKING:
    from dispatch.accept import Accepted

log = logging.getLogger(__name__)

T = f"{{{ns.WSNT}}}"
STATS = state.PREFIX + "stats"
DEADLINES = state.PREFIX + "frag:deadlines"  # zset: reassembly key -> when it times out
# What every reassembly holds, bounded by HPWSN_MAX_REASSEMBLIES_BYTES: the hash gives each
# reassembly's bytes back when it ends (also once its key has expired), the string is their sum.
SIZES = state.PREFIX + "frag:sizes"  # hash: reassembly key -> bytes of fragment text held
HELD = state.PREFIX + "frag:held"  # the sum of SIZES
MAX_IDENTIFICATION = 256  # characters; it is part of a Redis key
SWEEP_BATCH = 1000


def _scoped(publisher: str, topic_path: str, identification: str) -> str:
    # The publisher's length first: no publisher, topic and Identification spell another's.
    return f"{len(publisher)}:{publisher}:{topic_path}:{identification}"


def reassembly_key(publisher: str, topic_path: str, identification: str) -> str:
    """The reassembly of `publisher`'s message (acl.Principal.publisher)."""
    return f"{state.PREFIX}frag:{_scoped(publisher, topic_path, identification)}"


def done_key(publisher: str, topic_path: str, identification: str) -> str:
    """Set for a while after a reassembly completed: a fragment resent late is ignored."""
    return f"{state.PREFIX}fragdone:{_scoped(publisher, topic_path, identification)}"


# Add one fragment to its reassembly and, when that makes the message whole, hand every fragment
# back and claim the reassembly for ARGV[12] seconds: of two web processes receiving the last two
# fragments at once, exactly one sees the message complete. The reassembly is only deleted (and
# the done marker set) by _DONE once the whole message is stored; if the store fails, _UNCLAIM
# (or the claim's expiry) lets a resent fragment complete it again, so a failed store never
# turns the publisher's resend into a "late" fragment of a message that was lost.
# KEYS: reassembly hash, deadlines zset, stats hash, done marker, sizes hash, held total
# ARGV: offset, more (1/0), text, topic xml, producer xml, identification, deadline (unix time),
#       key ttl (ms), max fragments, max bytes, now (unix time), claim (s), max bytes of all
_RELEASE = """
local function release(sizes, held, key)
  local b = redis.call('hget', sizes, key)
  if b then
    redis.call('hdel', sizes, key)
    redis.call('decrby', held, b)
  end
end
"""
_HOLD = (
    _RELEASE
    + """
local key, off = KEYS[1], tonumber(ARGV[1])
if redis.call('exists', KEYS[4]) == 1 then return {'late'} end
local held = redis.call('hget', key, ARGV[1])
local last
if held then
  if held ~= ARGV[3] then
    return {'conflict', 'offset ' .. ARGV[1] .. ' was already received with other content'}
  end
  last = tonumber(redis.call('hget', key, 'last') or '-1')
else
  local f = redis.call('hmget', key, 'count', 'bytes', 'last', 'top')
  local count = tonumber(f[1] or '0') + 1
  local bytes = tonumber(f[2] or '0') + string.len(ARGV[3])
  last = tonumber(f[3] or '-1')
  local top = tonumber(f[4] or '-1')
  if last >= 0 and off > last then
    return {'conflict', 'offset ' .. ARGV[1] .. ' lies beyond the last fragment (offset ' ..
      last .. ')'}
  end
  if ARGV[2] == '0' and top > off then
    return {'conflict', 'offset ' .. ARGV[1] .. ' says it is the last fragment, but offset ' ..
      top .. ' was received'}
  end
  if off >= tonumber(ARGV[9]) or bytes > tonumber(ARGV[10]) then
    redis.call('del', key)
    redis.call('zrem', KEYS[2], key)
    release(KEYS[5], KEYS[6], key)
    return {'limit', tostring(bytes)}
  end
  -- Refused, not dropped: the reassembly can still complete once others have ended.
  local size = string.len(ARGV[3])
  local all = tonumber(redis.call('get', KEYS[6]) or '0')
  if all + size > tonumber(ARGV[13]) then return {'full', tostring(all)} end
  redis.call('hincrby', KEYS[5], key, size)
  redis.call('incrby', KEYS[6], size)
  redis.call('hset', key, ARGV[1], ARGV[3], 'count', count, 'bytes', bytes)
  if count == 1 then
    redis.call('hset', key, 'topic', ARGV[4], 'producer', ARGV[5], 'id', ARGV[6])
  end
  if off > top then redis.call('hset', key, 'top', off) end
  if ARGV[2] == '0' then
    redis.call('hset', key, 'last', off)
    last = off
  end
end
local count = tonumber(redis.call('hget', key, 'count') or '0')
if last >= 0 and count == last + 1 then
  local now = tonumber(ARGV[11])
  if tonumber(redis.call('hget', key, 'claim') or '0') > now then
    return {'held', tostring(count)}  -- another request is storing the whole message
  end
  redis.call('hset', key, 'claim', now + tonumber(ARGV[12]))
  local out = {'complete', redis.call('hget', key, 'topic'), redis.call('hget', key, 'producer')}
  for i = 0, last do out[#out + 1] = redis.call('hget', key, tostring(i)) end
  redis.call('pexpire', key, ARGV[8])
  redis.call('zadd', KEYS[2], ARGV[7], key)
  return out
end
if held then return {'duplicate'} end
redis.call('pexpire', key, ARGV[8])
redis.call('zadd', KEYS[2], ARGV[7], key)
return {'held', tostring(count)}
"""
)

# The whole message is stored: the reassembly goes and late fragments are ignored for a while.
# KEYS: reassembly hash, deadlines zset, stats hash, done marker, sizes hash, held total;
# ARGV: done marker ttl (ms)
_DONE = (
    _RELEASE
    + """
redis.call('del', KEYS[1])
redis.call('zrem', KEYS[2], KEYS[1])
release(KEYS[5], KEYS[6], KEYS[1])
redis.call('set', KEYS[4], '1', 'PX', ARGV[1])
redis.call('hincrby', KEYS[3], 'fragments_reassembled', 1)
return 1
"""
)

# Drop one reassembly whose deadline has passed (a fragment that arrived meanwhile moved it).
# KEYS: reassembly hash, deadlines zset, stats hash, sizes hash, held total; ARGV: now
_EXPIRE = (
    _RELEASE
    + """
local due = redis.call('zscore', KEYS[2], KEYS[1])
if not due or tonumber(due) > tonumber(ARGV[1]) then return false end
local info = redis.call('hmget', KEYS[1], 'id', 'count', 'last', 'top')
redis.call('del', KEYS[1])
redis.call('zrem', KEYS[2], KEYS[1])
release(KEYS[4], KEYS[5], KEYS[1])
redis.call('hincrby', KEYS[3], 'fragments_timed_out', 1)
return info
"""
)


# ----------------------------------------------------------------------------- incoming (web)


def is_held(n: wsn.NotificationIn) -> bool:
    """A fragment that may not be delivered alone (F=1, P=0): it waits for its whole message."""
    p = n.package
    return p is not None and p.fragmented and not p.partial_allowed


# (publisher, topic path, identification) of a reassembly whose message is whole
Claim = tuple[str, str, str]


async def fragments_hold(
    *, notifications: list[wsn.NotificationIn], accepted: list[Accepted], publisher: str
) -> tuple[list[Accepted], list[Claim]]:
    """Hold the fragments among validated notifications; a message one completes takes its place.

    Also returns the reassemblies this call completed: the caller ends them with
    `fragments_done` once their messages are stored, or `fragments_unclaim` if storing failed.
    """
    if not any(is_held(n) for n in notifications):
        return accepted, []
    kept: list[Accepted] = []
    claims: list[Claim] = []
    try:
        for n, a in zip(notifications, accepted, strict=True):
            if not is_held(n):
                kept.append(a)
                continue
            whole = await fragment_hold(notification=n, topic_path=a.node.path, publisher=publisher)
            if whole is not None:
                assert n.package is not None
                claims.append((publisher, a.node.path, n.package.identification))
                stored = wsn.stored_fragment(whole)
                kept.append(dataclasses.replace(a, fragment=stored, content=whole.content_xml))
    except BaseException:
        await fragments_unclaim(claims)
        raise
    return kept, claims


async def fragments_done(claims: list[Claim]) -> None:
    """The messages of these reassemblies are stored: end them."""
    r = state.get_async_redis()
    ttl = int((2 * settings.HPWSN_FRAGMENT_TIMEOUT_S + 10) * 1000)
    for publisher, topic_path, ident in claims:
        await r.eval(
            _DONE,
            6,
            reassembly_key(publisher, topic_path, ident),
            DEADLINES,
            STATS,
            done_key(publisher, topic_path, ident),
            SIZES,
            HELD,
            ttl,
        )


async def fragments_unclaim(claims: list[Claim]) -> None:
    """Storing failed: a resent fragment of these messages completes them again."""
    r = state.get_async_redis()
    for publisher, topic_path, ident in claims:
        await r.hdel(reassembly_key(publisher, topic_path, ident), "claim")


async def fragment_hold(
    *, notification: wsn.NotificationIn, topic_path: str, publisher: str
) -> wsn.NotificationIn | None:
    """Add a fragment to its reassembly; returns the whole message if this one completed it."""
    package = notification.package
    assert package is not None
    ident = package.identification
    if len(ident) > MAX_IDENTIFICATION:
        raise errors.InvalidFragment(
            f"a fragment's Identification may have at most {MAX_IDENTIFICATION} characters"
        )
    message = notification.message_el
    if message is None or any(isinstance(c.tag, str) for c in message):
        raise errors.InvalidFragment(
            f"fragment {package.offset} of '{ident}' must carry its piece of the message as the "
            "text of wsnt:Message, not as elements"
        )
    timeout = settings.HPWSN_FRAGMENT_TIMEOUT_S
    max_bytes = settings.HPWSN_MAX_REASSEMBLY_BYTES
    result = await state.get_async_redis().eval(
        _HOLD,
        6,
        reassembly_key(publisher, topic_path, ident),
        DEADLINES,
        STATS,
        done_key(publisher, topic_path, ident),
        SIZES,
        HELD,
        package.offset,
        int(package.more),
        (message.text or "").encode(),
        notification.topic_xml,
        notification.producer_xml,
        ident,
        f"{time.time() + timeout:.6f}",
        # The key outlives its deadline so that the sweeper can still say what arrived; if no
        # sweeper runs, Redis drops it anyway.
        int((2 * timeout + 10) * 1000),
        fragment.MAX_FRAGMENTS,
        max_bytes,
        f"{time.time():.6f}",
        # How long a request storing the whole message has before a resend may complete it.
        max(timeout, 5.0),
        settings.HPWSN_MAX_REASSEMBLIES_BYTES,
    )
    status = result[0]
    events.fragment(topic=topic_path, package=package, status=status, text=message.text)
    if status in (b"held", b"duplicate"):
        return None
    if status == b"late":
        # A publisher resending after a lost answer: its message has already been accepted.
        log.debug("fragment %d of '%s' came after its message was whole", package.offset, ident)
        return None
    if status == b"conflict":
        raise errors.InvalidFragment(
            f"fragment of '{ident}' on {topic_path} refused: {result[1].decode()}"
        )
    if status == b"full":
        limit = settings.HPWSN_MAX_REASSEMBLIES_BYTES
        raise errors.InvalidFragment(
            f"fragment {package.offset} of '{ident}' on {topic_path} refused: the incomplete "
            f"messages held hold {int(result[1])} bytes, and this fragment would pass "
            f"HPWSN_MAX_REASSEMBLIES_BYTES ({limit} bytes); send it again once they are fewer"
        )
    if status == b"limit":
        if package.offset >= fragment.MAX_FRAGMENTS:
            problem = (
                f"fragment offset {package.offset} of '{ident}' exceeds the limit of "
                f"{fragment.MAX_FRAGMENTS} fragments per message"
            )
        else:
            problem = (
                f"the reassembly of '{ident}' would hold {int(result[1])} bytes, more than "
                f"HPWSN_MAX_REASSEMBLY_BYTES ({max_bytes} bytes)"
            )
        log.warning("%s on %s; the reassembly is dropped", problem, topic_path)
        raise errors.InvalidFragment(problem + "; the reassembly is dropped")
    topic_xml, producer_xml, *pieces = result[1:]
    log.debug("reassembled '%s' on %s from %d fragments", ident, topic_path, len(pieces))
    return await sync_to_async(_whole, thread_sensitive=False)(
        identification=ident,
        topic_xml=topic_xml,
        producer_xml=producer_xml,
        payload=b"".join(pieces),
    )


def _whole(
    *, identification: str, topic_xml: bytes, producer_xml: bytes, payload: bytes
) -> wsn.NotificationIn:
    """The reassembled notification: the payload as the content of wsnt:Message if it is XML."""
    reason = ""
    # Markup that parses is the message content; anything else (text, a cut that is not
    # well-formed) is carried as text. Both go through the hardened parser and its limits.
    for content in (payload, fragment.escape_text(payload).encode()):
        data = (
            f'<wsnt:NotificationMessage xmlns:wsnt="{ns.WSNT}">'.encode()
            + topic_xml
            + producer_xml
            + b"<wsnt:Message>"
            + content
            + b"</wsnt:Message></wsnt:NotificationMessage>"
        )
        try:
            el = parse_xml(data, max_bytes=len(data), max_depth=settings.HPWSN_MAX_XML_DEPTH)
        except XMLRejected as exc:
            reason = str(exc)
            continue
        return wsn.parse_notification_message(el)
    raise errors.InvalidFragment(
        f"the reassembled message '{identification}' cannot be accepted: {reason}"
    )


# ----------------------------------------------------------------------------- timeouts (beat)


def fragments_expire(*, max_run: float = 4.0) -> int:
    """Drop reassemblies whose next fragment did not come in time; count and log each."""
    r = state.get_redis()
    started = time.monotonic()
    expired = 0
    while time.monotonic() - started < max_run:
        now = time.time()
        keys = r.zrangebyscore(DEADLINES, 0, now, start=0, num=SWEEP_BATCH)
        for key in keys:
            info = r.eval(_EXPIRE, 5, key, DEADLINES, STATS, SIZES, HELD, f"{now:.6f}")
            if info is None:
                continue  # a fragment arrived meanwhile, or another sweeper took it
            expired += 1
            ident, count, last, top = (v.decode() if v is not None else None for v in info)
            if count is None:
                arrived = "its fragments had already expired"
            elif last is not None:
                arrived = f"{count} of {int(last) + 1} fragments arrived"
            else:
                arrived = f"{count} fragments arrived (up to offset {top}); the last never did"
            log.warning(
                "reassembly of '%s' (%s) timed out: %s",
                ident or key.decode(),
                key.decode(),
                arrived,
            )
        if len(keys) < SWEEP_BATCH:
            break
    return expired


# ----------------------------------------------------------------------------- outgoing (worker)


def push_batches(
    *, stored: list[bytes], ids: list[str], fragment_size: int, partial: bool, batch: int
) -> list[tuple[list[str], list[bytes]]]:
    """The Notify batches for these stored messages, in order, larger messages as fragments.

    Each item keeps an id: a message's own, or `<id>:<offset>` for its fragments.
    """
    # Whole messages shorter than the fragment size have shorter payloads: nothing to parse.
    if fragment_size <= 0 or all(len(s) <= fragment_size for s in stored):
        return [(ids, stored)]
    out_ids: list[str] = []
    out: list[bytes] = []
    for nid, s in zip(ids, stored, strict=True):
        pieces = _split_stored(s, identification=nid, fragment_size=fragment_size, partial=partial)
        if pieces is None:
            out_ids.append(nid)
            out.append(s)
        else:
            out_ids.extend(f"{nid}:{i}" for i in range(len(pieces)))
            out.extend(pieces)
    if len(out) == len(stored):
        return [(ids, stored)]
    step = max(batch, 1)
    return [(out_ids[i : i + step], out[i : i + step]) for i in range(0, len(out), step)]


def _split_stored(
    stored: bytes, *, identification: str, fragment_size: int, partial: bool
) -> list[bytes] | None:
    """A stored message as fragments, or None when it stays whole."""
    root = etree.fromstring(b'<m xmlns:wsnt="' + ns.WSNT.encode() + b'">' + stored + b"</m>")
    message = root.find(f"{T}Message")
    if message is None or root.find(f"{T}Package") is not None:
        return None  # a fragment already (passed through with P=1) is never split again
    payload = (
        fragment.escape_text((message.text or "").encode())
        + "".join(etree.tostring(c, encoding="unicode") for c in message)
    ).encode()
    if len(payload) <= fragment_size:
        return None
    try:
        pieces = fragment.split(
            payload,
            fragment_size=fragment_size,
            identification=identification,
            partial_allowed=partial,
        )
    except fragment.FragmentError as exc:
        log.warning("message %s is pushed whole: %s", identification, exc)
        return None
    head = b"".join(
        etree.tostring(el)
        for el in (root.find(f"{T}Topic"), root.find(f"{T}ProducerReference"))
        if el is not None
    )
    return [head + (p.package_xml() + p.message_xml()).encode() for p in pieces]
