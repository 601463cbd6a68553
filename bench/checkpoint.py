"""What the once-a-second checkpoint of reliable topics costs as subscriptions grow, in process.

    .venv/bin/python -m bench.checkpoint --redis-url redis://127.0.0.1:6379/11 [--subs 1000 10000]

Uses an SQLite database in a temporary directory and the Redis database given (it is flushed:
never give database 0). For each number of subscriptions it creates them, queues one message for
a share of them (`--busy`, 10 %: the others are idle, as most subscriptions are at any moment)
and times, alternately, `dispatch.reliable.checkpoint_run` and the baseline: the same checkpoint
scanning every subscription's ten queues in one Lua call and writing a cursor for each, as it was
done before `hpwsn:busy`. Both lines print the wall time per checkpoint and the part spent in the
Lua call, during which Redis serves nobody else.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import django_in_process, spare_redis_url

F0 = 1_000  # the fan-out position; every queued message is older than it

# The scan of every subscription, as the checkpoint did it before `hpwsn:busy`.
_SCAN_ALL = """
local f0 = tonumber(ARGV[1])
local out = {}
local k = 1
for i = 2, #ARGV do
  local n = tonumber(ARGV[i])
  local low = f0
  for j = k, k + n - 1 do
    local head = redis.call('lindex', KEYS[j], 0)
    if head then
      local kind, num = string.match(head, '|([rf])(%d+)$')
      if kind == 'r' then num = tonumber(num) - 1 elseif kind == 'f' then num = tonumber(num)
      else num = -1 end
      if num < low then low = num end
    end
  end
  k = k + n
  out[#out + 1] = low
end
return out
"""


def baseline_checkpoint(r: Any) -> float:
    """Every subscription's watermark and cursor; returns the seconds spent in the Lua call."""
    from dispatch.models import DeliveryCursor
    from hpwsn_site import state
    from subscriptions.selectors import subscription_index

    index = subscription_index(max_age=1.0)
    keys: list[str] = []
    counts: list[int] = []
    names: list[str] = []
    for entry in index.by_id.values():
        own = state.queue_keys(entry.id)
        names.append(entry.id)
        keys.extend(own)
        counts.append(len(own))
    t0 = time.perf_counter()
    lows = r.eval(_SCAN_ALL, len(keys), *keys, F0, *counts)
    in_lua = time.perf_counter() - t0
    now = time.time()
    rows = [
        DeliveryCursor(name=f"sub:{s}", seq=int(low), updated_at=now)
        for s, low in zip(names, lows, strict=True)
    ]
    DeliveryCursor.objects.bulk_create(
        rows, update_conflicts=True, unique_fields=["name"], update_fields=["seq", "updated_at"]
    )
    return in_lua


def populate(r: Any, n: int, busy: float) -> None:
    from dispatch.models import DeliveryCursor
    from hpwsn_site import state
    from subscriptions.models import Subscription

    Subscription.objects.all().delete()
    DeliveryCursor.objects.all().delete()
    r.flushdb()
    subs = [
        Subscription(
            consumer_address=f"http://127.0.0.1:9/c{i}",
            topic_expression="ALL",
            topic_dialect="http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple",
            topic_path="ALL",
            dedup_key=uuid.uuid4().hex,
        )
        for i in range(n)
    ]
    Subscription.objects.bulk_create(subs, batch_size=2000)
    step = max(1, round(1 / busy))
    pipe = r.pipeline(transaction=False)
    for sub in subs[::step]:
        pipe.rpush(state.queue_key(str(sub.id)), f"{uuid.uuid4().hex}|r{F0 - 10}".encode())
        pipe.sadd(state.BUSY, str(sub.id))
    pipe.set(state.FANOUT_SEQ, F0)
    pipe.set(state.EPOCH, repr(time.time()))
    pipe.incr(state.VERSION_SUBS)
    pipe.execute()


def measure(r: Any, rounds: int) -> tuple[float, float, float, float]:
    """Per checkpoint: (new wall, new Lua, baseline wall, baseline Lua) in seconds."""
    from dispatch import reliable

    lua_s = 0.0
    real_eval = r.eval

    def timed_eval(*args: Any) -> Any:
        nonlocal lua_s
        t0 = time.perf_counter()
        try:
            return real_eval(*args)
        finally:
            lua_s += time.perf_counter() - t0

    reliable.checkpoint_run()  # warm-up: the subscription index, the cursors table
    baseline_checkpoint(r)
    new_s = base_s = base_lua = 0.0
    for _ in range(rounds):  # alternately, so a drift of the shared machine hits both
        r.eval = timed_eval
        t0 = time.perf_counter()
        reliable.checkpoint_run()
        new_s += time.perf_counter() - t0
        r.eval = real_eval
        t0 = time.perf_counter()
        base_lua += baseline_checkpoint(r)
        base_s += time.perf_counter() - t0
    return new_s / rounds, lua_s / rounds, base_s / rounds, base_lua / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--subs", type=int, nargs="+", default=[1_000, 10_000, 50_000])
    parser.add_argument("--busy", type=float, default=0.1, help="share with a queued message")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    django_in_process(
        Path(tempfile.mkdtemp(prefix="hpwsn-bench-checkpoint-")),
        spare_redis_url(args.redis_url),
    )
    from hpwsn_site import state

    r = state.get_redis()
    print(
        f"{'subscriptions':>13} {'busy':>6} | {'checkpoint ms':>13} {'Lua ms':>7} | "
        f"{'scan-all ms':>11} {'Lua ms':>7} | {'ratio':>6}"
    )
    try:
        for n in args.subs:
            populate(r, n, args.busy)
            new_s, new_lua, base_s, base_lua = measure(r, args.rounds)
            print(
                f"{n:>13} {len(r.smembers(state.BUSY)):>6} | {new_s * 1e3:>13.1f} "
                f"{new_lua * 1e3:>7.1f} | {base_s * 1e3:>11.1f} {base_lua * 1e3:>7.1f} | "
                f"{base_s / new_s:>5.1f}x"
            )
    finally:
        r.flushdb()
    print(
        f"mean of {args.rounds} checkpoints each, SQLite, {os.cpu_count()} CPUs; ratio = scan-all "
        "wall time / checkpoint wall time"
    )


if __name__ == "__main__":
    main()
