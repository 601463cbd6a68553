"""Message bodies in Redis live as long as a queue holds them, not as long as the retention.

A body (`state.payload_key`) is counted: the fan-out adds, in the same transaction as it queues
the message, one reference per queue or pull point it put the message in (`refs_key`); whatever
takes an item off for good (a delivered or dead-lettered batch, a GetMessages, a trim, an
unsubscribe) gives its reference back in the same script, and the last one deletes the body.
The retention (and a topic's time to live) still bounds what is pending: both keys carry it.

A message that matched nobody keeps no body at all. A count that is missing (a body queued by an
older version, or one whose count expired) never deletes a body: it is left to its time to live.

Every script that takes items off includes `RELEASE_LUA` and calls `release(prefix, items)` with
the payload key prefix; items are queue items (b"<id>|<mark>") or pull point items
(b"<id>|<subscription>|<mark>"): the id is what comes before the first "|".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpwsn_site import state
from hpwsn_site.state import RELEASE_LUA, bodies_drop

__all__ = [
    "HOLD_LUA",
    "RELEASE_LUA",
    "bodies_drop",
    "bodies_drop_head",
    "bodies_hold",
    "bodies_hold_args",
    "bodies_trim",
]

# The fan-out's references, one script per batch. ARGV[1] the key prefix, then per message
# four values: id, references (queues and pull points it went to), time to live in ms for a
# body given here ('' when the body is already in Redis: a fast message), the body or ''.
# A message that went nowhere leaves no body; one that did gets its count with its body's TTL.
_HOLD = """
local prefix = ARGV[1]
for b = 2, #ARGV, 4 do
  local nid, refs, ttl, body = ARGV[b], tonumber(ARGV[b + 1]), ARGV[b + 2], ARGV[b + 3]
  local key = prefix .. 'n:' .. nid
  if refs == 0 then
    if ttl == '' then redis.call('del', key) end
  else
    if ttl ~= '' then redis.call('set', key, body, 'PX', ttl) end
    local left = redis.call('pttl', key)
    local count = prefix .. 'refs:' .. nid
    redis.call('incrby', count, refs)
    if left > 0 then redis.call('pexpire', count, left) else redis.call('del', count) end
  end
end
return 1
"""

# Trim a list to `keep` items at one end, giving the references of what goes back. KEYS[1] the
# list; ARGV[1] prefix, ARGV[2] how many to keep, ARGV[3] 'head' (keep the first) or 'tail'.
_TRIM = (
    RELEASE_LUA
    + """
local keep = tonumber(ARGV[2])
local n = redis.call('llen', KEYS[1])
if n <= keep then return 0 end
if ARGV[3] == 'head' then
  release(ARGV[1], redis.call('lrange', KEYS[1], keep, -1))
  redis.call('ltrim', KEYS[1], 0, keep - 1)
else
  release(ARGV[1], redis.call('lrange', KEYS[1], 0, n - keep - 1))
  redis.call('ltrim', KEYS[1], -keep, -1)
end
return n - keep
"""
)


# Drop the first items of a list only if they are still the ones given (read a moment before: a
# pump that started on it meanwhile may be pushing them), giving their references back; how many
# went. KEYS[1] the list; ARGV[1] prefix, ARGV[2..] the items.
_DROP_HEAD = (
    RELEASE_LUA
    + state.HEAD_LUA
    + """
if not head_is(KEYS[1], ARGV, 2) then return 0 end
release(ARGV[1], ARGV, 2)
redis.call('ltrim', KEYS[1], #ARGV - 1, -1)
return #ARGV - 1
"""
)


# `_HOLD` as a function of its arguments, for a script that holds a batch's bodies among other
# steps (the fan-out's store, dispatch/fanout.py).
HOLD_LUA = "local function bodies_hold(ARGV)\n" + _HOLD + "end\n"


def bodies_hold_args(held: Iterable[tuple[str, int, int | None, bytes | None]]) -> list[object]:
    """`_HOLD`'s arguments: per message its id, how many queues took it, and for a body written
    here its TTL in ms and the body."""
    args: list[object] = [state.PREFIX]
    for nid, refs, ttl_ms, body in held:
        args += [nid, refs, "" if ttl_ms is None else ttl_ms, body or b""]
    return args


def bodies_hold(pipe: Any, held: Iterable[tuple[str, int, int | None, bytes | None]]) -> None:
    """Queue on a pipeline the references of a batch (`bodies_hold_args`)."""
    args = bodies_hold_args(held)
    if len(args) > 1:
        pipe.eval(_HOLD, 0, *args)


def bodies_trim(r: Any, key: str, *, keep: int, end: str) -> int:
    """Trim a list to `keep` items, keeping its 'head' or its 'tail'; how many went."""
    return int(r.eval(_TRIM, 1, key, state.PREFIX, keep, end))


def bodies_drop_head(r: Any, key: str, items: list[bytes]) -> int:
    """Drop `items` from the head of a list if they are still there; how many went."""
    if not items:
        return 0
    return int(r.eval(_DROP_HEAD, 1, key, state.PREFIX, *items))
