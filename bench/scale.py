"""Topic tree and subscription index at 10^3 .. 10^5 topics and subscriptions, in process.

    .venv/bin/python -m bench.scale --redis-url redis://127.0.0.1:6379/11 \\
        --database-url postgres://hpwsn:hpwsn@127.0.0.1:5432/hpwsn_scale_bench \\
        [--sizes 1000 10000 100000] [--load-topics 1000000]

The PostgreSQL database named (its name must contain `bench`) is migrated and its topics and
subscriptions deleted before each size; the Redis database given is flushed (never database 0).
For each size N it makes N topics (a tree of depth up to 8 under 10 roots; the roots and one
topic in 997 set who may subscribe, one subtree refuses the benchmark's user) and N subscriptions
(80 % to one topic, 20 % Full-dialect patterns: `R/a//*`, `R/*/b`, `R//c`), both with bulk
inserts (the setup only; every measured change goes through the services), then prints, next to
the cost of what each replaces (the baseline, measured in the same run):

- applying one topic change (a leaf's policy, `topic_update`) and one subscription change
  (`subscription_set_state`) in another process: a second in-process feed that was woken, reads
  the change log and loads the row; baseline: the full reload every process did on any change;
- Subscribe (`subscription_create`, a non-admin caller, 80 % concrete, 20 % wildcard), and its
  access check alone; baseline: the check over every topic;
- the first and the next lookup of a topic's subscriptions (`SubscriptionIndex.matching`);
  baseline: the first lookup scanning every wildcard subscription;
- memory per topic and per subscription (tracemalloc, over the build);
- 10^4 subscriptions with the same XPath filter on one topic: filter evaluations of one
  message, shared (one evaluation) against one per subscription.

`--load-topics N` also times loading a tree of N topics at start-up.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import os
import random
import statistics
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable, Hashable
from typing import Any

from bench.common import spare_redis_url

ROOTS = 10
MAX_DEPTH = 8
GROUP = "bench-subs"


def django_setup(database_url: str, redis_url: str) -> None:
    if "bench" not in database_url.rsplit("/", 1)[-1]:
        sys.exit("the database is emptied: give one whose name contains 'bench'")
    os.environ.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": spare_redis_url(redis_url),
            "DJANGO_SETTINGS_MODULE": "hpwsn_site.settings",
        }
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


# ---------------------------------------------------------------- setup (bulk)


def tree_paths(n: int) -> list[str]:
    """n colon paths breadth-first under ROOTS roots, at most MAX_DEPTH deep."""
    fan = 2
    while ROOTS * sum(fan**d for d in range(MAX_DEPTH)) < n:
        fan += 1
    out = [f"R{i}" for i in range(ROOTS)]
    i = 0
    while len(out) < n:
        parent = out[i]
        i += 1
        if parent.count(":") + 1 >= MAX_DEPTH:
            continue
        out.extend(f"{parent}:n{k}" for k in range(fan))
    return out[:n]


def populate_topics(n: int) -> list[str]:
    from topics.models import Change, Topic

    Change.objects.all().delete()
    Topic.objects.all().delete()
    paths = tree_paths(n)
    ids: dict[str, int] = {}
    by_depth = itertools.groupby(paths, key=lambda p: p.count(":"))
    deny = paths[len(paths) // 2]  # one subtree the benchmark's user may not read
    for _depth, group in by_depth:
        rows = []
        for i, path in enumerate(group):
            parent, _, name = path.rpartition(":")
            row = Topic(name=name, path=path, parent_id=ids.get(parent))
            if not parent:
                row.subscribe_groups = GROUP
            elif path == deny:
                row.subscribe_groups = "ops"
            elif i % 997 == 0:
                row.subscribe_groups = f"{GROUP},ops"
            rows.append(row)
        for row in Topic.objects.bulk_create(rows, batch_size=5000):
            ids[row.path] = row.pk
    return paths


def expressions(paths: list[str], n: int, rng: random.Random) -> list[tuple[str, str, str]]:
    """(expression, dialect, topic path) of n subscriptions: 80 % concrete, 20 % patterns."""
    from hpwsn import ns

    deep = [p.split(":") for p in paths if p.count(":") >= 2]
    out = []
    for i in range(n):
        if i % 5:
            path = rng.choice(paths)
            out.append((path, ns.DIALECT_COLON, path))
            continue
        names = rng.choice(deep)
        form = i // 5 % 3
        if form == 0:
            text = f"{names[0]}/{names[1]}//*"
        elif form == 1:
            text = f"{names[0]}/*/{names[2]}"
        else:
            text = f"{names[0]}//{names[-1]}"
        out.append((text, ns.DIALECT_FULL, ""))
    return out


def populate_subscriptions(paths: list[str], n: int, rng: random.Random) -> None:
    from subscriptions.models import Subscription

    Subscription.objects.all().delete()
    rows = [
        Subscription(
            consumer_address=f"http://127.0.0.1:9/c{i % 1000}",
            topic_expression=text,
            topic_dialect=dialect,
            topic_path=path,
            dedup_key=uuid.uuid4().hex,
        )
        for i, (text, dialect, path) in enumerate(expressions(paths, n, rng))
    ]
    Subscription.objects.bulk_create(rows, batch_size=5000)


# ---------------------------------------------------------------- baselines (the code before)


class LinearMatcher:
    """The matcher before the trie: every wildcard subscription tried on every new topic."""

    def __init__(self) -> None:
        self.exact: dict[tuple[str, ...], list[Hashable]] = {}
        self.wild: list[tuple[Hashable, Any]] = []

    def add(self, key: Hashable, expression: Any, exact: tuple[str, ...] | None) -> None:
        if exact is not None:
            self.exact.setdefault(exact, []).append(key)
        else:
            self.wild.append((key, expression))

    def match(self, root_ns: str | None, names: tuple[str, ...]) -> tuple[Hashable, ...]:
        keys: list[Hashable] = []
        for k in range(1, len(names) + 1):
            keys.extend(self.exact.get(names[:k], ()))
        keys.extend(key for key, expr in self.wild if expr.covers(root_ns, names))
        return tuple(dict.fromkeys(keys))


def acl_every_topic(tree: Any, expression: Any, principal: Any) -> bool:
    """The access check before: every topic of the tree tried against the expression."""
    from topics.acl import may_subscribe

    for node in tree.by_names.values():
        if may_subscribe(node.policy, principal):
            continue
        if expression.covers(node.root_namespace, node.names):
            return False
    return True


# ---------------------------------------------------------------- measures


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _collections() -> int:
    """Runs of the cyclic garbage collector so far, every generation."""
    return sum(g["collections"] for g in gc.get_stats())


def memory_of(build: Callable[[], Any]) -> tuple[Any, int]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    value = build()
    gc.collect()
    size = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return value, size


def measure(n: int, rng: random.Random, rounds: int, sub_changes: int) -> dict[str, Any]:
    from hpwsn.topicexpr import parse
    from hpwsn.wsn import TopicRef
    from hpwsn_site import state
    from subscriptions import selectors as subsel
    from subscriptions import services as subs
    from subscriptions.models import Subscription
    from topics import changes
    from topics import selectors as topsel
    from topics import services as topics
    from topics.acl import Principal, check_subscribe_expression
    from topics.models import Topic

    r = state.get_redis()
    r.flushdb()
    r.set(state.EPOCH, repr(time.time()))
    paths = populate_topics(n)
    populate_subscriptions(paths, n, rng)
    out: dict[str, Any] = {"n": n}

    # Full builds: what every process did after any change (the baselines).
    # As a process builds them (changes.built: the cyclic garbage collector paused meanwhile).
    out["tree_full_s"] = min(timed(lambda: changes.built(topsel._load)) for _ in range(rounds))
    out["index_full_s"] = min(timed(lambda: changes.built(subsel._build)) for _ in range(rounds))

    def feed(kind: str) -> changes.ChangeFeed[Any]:
        if kind == changes.TOPIC:
            return changes.ChangeFeed(
                kind=kind, version_key=state.VERSION_TOPICS, build=topsel._load, apply=topsel._apply
            )
        return changes.ChangeFeed(
            kind=kind, version_key=state.VERSION_SUBS, build=subsel._build, apply=subsel._apply
        )

    # Another process's feeds, built once, then woken by each change.
    other_tree, other_index = feed(changes.TOPIC), feed(changes.SUBSCRIPTION)
    other_tree.get(max_age=0)
    index = other_index.get(max_age=0)
    leaves = [t for t in Topic.objects.filter(path__in=rng.sample(paths, 50)).values_list("pk")]
    apply_topic = []
    for i, (pk,) in enumerate(leaves):
        topics.topic_update(topic_id=pk, changes={"priority": i % 9})
        apply_topic.append(timed(lambda: other_tree.get(max_age=0)))
    # Each subscription paused, then each resumed.
    sub_ids = [
        str(s) for s in Subscription.objects.values_list("id", flat=True)[: sub_changes // 2]
    ]
    apply_sub = []
    for i, sid in enumerate(sub_ids * 2):
        subs.subscription_set_state(subscription_id=sid, paused=i < len(sub_ids))
        apply_sub.append(timed(lambda: other_index.get(max_age=0)))
    assert other_tree.rebuilds == 1, "a topic change was not applied as a delta"
    assert other_index.rebuilds == 1, "a subscription change was not applied as a delta"
    out["tree_apply"] = apply_topic
    out["index_apply"] = apply_sub

    # Subscribe through the service, as a non-admin member of the roots' group.
    user = Principal(name="bench-user", groups=frozenset({GROUP}))
    topsel.topic_tree(max_age=0)
    allowed = [p for p in paths if not p.startswith(paths[len(paths) // 2])]
    exprs = [e for e in expressions(allowed, 400, rng)]
    subscribe_s, refused = [], 0
    rebuilds = topsel._tree.rebuilds + subsel._index.rebuilds
    for i, (text, dialect, _path) in enumerate(exprs):

        def one(text: str = text, dialect: str = dialect, i: int = i) -> None:
            subs.subscription_create(
                consumer_address=f"http://127.0.0.1:9/s{n}/{i}",
                topic=TopicRef(text=text, dialect=dialect, nsmap={}),
                content=None,
                initial_termination_time=None,
                soap_version="1.1",
                use_raw=False,
                base_url="http://bench",
                principal=user,
            )

        t0 = time.perf_counter()
        try:
            one()
        except Exception:  # refused: a pattern that reaches the subtree the user may not read
            refused += 1
        subscribe_s.append(time.perf_counter() - t0)
    out["subscribe"] = subscribe_s
    out["subscribe_rebuilds"] = topsel._tree.rebuilds + subsel._index.rebuilds - rebuilds
    out["refused"] = refused

    tree = topsel.topic_tree(max_age=0)
    parsed = [parse(text, dialect, {}) for text, dialect, _p in exprs[:100]]
    acl_new, acl_old = [], []
    for expr in parsed:  # alternately, so a drift of the shared machine hits both
        t0 = time.perf_counter()
        with contextlib.suppress(Exception):  # refusals cost the same walk
            check_subscribe_expression(tree, expr, user)
        acl_new.append(time.perf_counter() - t0)
        acl_old.append(timed(lambda expr=expr: acl_every_topic(tree, expr, user)))
    out["acl_new"], out["acl_old"] = acl_new, acl_old

    # Lookups: a fresh index (cold memo), then the same topics again (warm). Built and kept as a
    # process keeps its first build (topics.changes.built, then kept: out of the collector's
    # reach), after a full collection of what the phases before left; the baseline's matcher
    # with it.
    index = changes.built(subsel._build)
    linear = LinearMatcher()
    for entry_id, (expr, path, _group, _xk) in index._placed.items():
        if expr is not None:
            linear.add(entry_id, expr, tuple(path.split(":")) if path else None)
    sample = [tuple(p.split(":")) for p in rng.sample(paths, min(2000, len(paths)))]
    gc.collect()
    changes.kept(replaced=False)
    collections = _collections()
    cold = [timed(lambda t=t: index.matching(None, t)) for t in sample]
    out["lookup_collections"] = _collections() - collections
    warm = [timed(lambda t=t: index.matching(None, t)) for t in sample]
    linear_cold = [timed(lambda t=t: linear.match(None, t)) for t in sample[:200]]
    out["lookup_cold"], out["lookup_warm"], out["lookup_linear"] = cold, warm, linear_cold
    out["matches"] = statistics.mean(len(index.matching(None, t)) for t in sample)
    for t in sample[:200]:
        assert {e.id for e in index._matcher.match(None, t)} == set(linear.match(None, t)), t

    # Memory: what the tree and the index hold, per topic and per subscription.
    index = linear = None  # type: ignore[assignment]
    gc.unfreeze()  # the index's reference cycles can go now
    _tree, tree_bytes = memory_of(topsel._load)
    _index, index_bytes = memory_of(subsel._build)
    out["tree_bytes"] = tree_bytes / len(_tree)
    out["index_bytes"] = index_bytes / len(_index)
    return out


def same_filter(count: int, rounds: int) -> tuple[float, float]:
    """Seconds to evaluate one message's filters for `count` subscriptions with one XPath
    filter: (shared, one compiled object per subscription)."""
    from dispatch.filters import FilterRun
    from subscriptions.selectors import SubEntry, SubscriptionIndex, _content_filter

    index = SubscriptionIndex()
    payload = (
        b'<wsnt:Topic Dialect="x">Plant</wsnt:Topic>'
        b"<wsnt:Message><reading><level>5</level></reading></wsnt:Message>"
    )
    text = "boolean(//level[. > 3])"

    def entries(shared: bool) -> list[SubEntry]:
        out = []
        for i in range(count):
            f = index.xpath_filter(text, {})[1] if shared else _content_filter(text, {})
            out.append(
                SubEntry(
                    id=str(i), mode="push", consumer_address=f"http://127.0.0.1:9/c{i}",
                    reference_address="", pull_point_id=None, soap_version="1.1",
                    use_raw=False, signing_secret="", paused=False, termination_ts=None,
                    content_filter=f,
                )
            )  # fmt: skip
        return out

    shared, alone = entries(True), entries(False)

    def run(batch: list[SubEntry]) -> None:
        filters = FilterRun()
        assert all(filters.passes(e, b"n1", payload) for e in batch)

    shared_s = min(timed(lambda: run(shared)) for _ in range(rounds))
    alone_s = min(timed(lambda: run(alone)) for _ in range(rounds))
    return shared_s, alone_s


def wide_fanout(count: int, rounds: int) -> tuple[float, float, float]:
    """One Notify matching `count` subscriptions: seconds until every one is queued and on the
    ready list (one fan-out batch, in process), of which the wake-up (one RPUSH); and the
    wake-up as it was before (one `pump.delay` Celery task per subscription) in the same run."""
    from dispatch import reliable
    from dispatch.fanout import fanout_run
    from dispatch.models import StoredMessage
    from dispatch.ready import pumps_ready
    from dispatch.tasks import pump
    from hpwsn_site import state
    from subscriptions.models import Subscription
    from subscriptions.selectors import subscription_index
    from topics.selectors import topic_tree
    from topics.services import topic_create

    r = state.get_redis()
    r.flushdb()
    StoredMessage.objects.all().delete()
    Subscription.objects.all().delete()
    topic_create(path="Wide")
    Subscription.objects.bulk_create(
        [
            Subscription(
                consumer_address=f"http://127.0.0.1:{9000 + i % 100}/c/{i}",
                topic_expression="Wide",
                topic_dialect="http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple",
                topic_path="Wide",
                dedup_key=uuid.uuid4().hex,
            )
            for i in range(count)
        ],
        batch_size=5000,
    )
    r.set(state.EPOCH, repr(time.time()))
    r.set(state.FANOUT_SEQ, reliable.log_head())
    # Built before the clock starts, after the markers (a new epoch makes a process rebuild), as
    # in a running worker.
    state.bump(state.VERSION_SUBS)
    subscription_index()
    topic_tree()
    ids = [str(i) for i in Subscription.objects.values_list("id", flat=True)]
    best = float("inf")
    for _ in range(rounds):
        reliable.messages_store(
            messages=[
                StoredMessage(
                    notification_id=uuid.uuid4().hex, topic_path="Wide",
                    payload=b"<wsnt:Message><x/></wsnt:Message>", accepted_at=time.time(),
                )
            ]
        )  # fmt: skip
        r.delete(state.READY, state.SCHED)
        seconds = timed(lambda: fanout_run(linger=0, max_run=60, max_batches=1))
        assert r.llen(state.READY) == count, "not every subscription was made ready"
        best = min(best, seconds)
    r.delete(state.READY)
    wake = min(timed(lambda: pumps_ready(r, ids)) for _ in range(rounds))
    r.delete(state.READY)
    before = timed(lambda: [pump.delay(sid) for sid in ids])
    r.delete("celery")  # the tasks just sent: no worker reads this Redis
    r.flushdb()
    return best, wake, before


def load_topics(n: int) -> tuple[float, float]:
    from topics import changes
    from topics import selectors as topsel

    populate_topics(n)
    gc.collect()
    seconds = timed(lambda: changes.built(topsel._load))  # as a process loads it at start-up
    tree, size = memory_of(topsel._load)
    return seconds, size / len(tree)


def ms(s: float) -> str:
    """Milliseconds from 1 ms up; microseconds below, with a decimal under 100 µs (a p99 of
    19.6 µs and one of 20.4 µs are on either side of the 20 µs goal)."""
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs" if s < 1e-4 else f"{s * 1e6:.0f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--load-topics", type=int, default=0, help="also time a tree this big")
    parser.add_argument("--same-filter", type=int, default=10_000)
    parser.add_argument("--wide", type=int, default=10_000, help="subscriptions of one Notify")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--changes", type=int, default=100, help="subscription changes applied per size"
    )
    parser.add_argument("--seed", type=int, default=14)
    args = parser.parse_args()
    django_setup(args.database_url, args.redis_url)
    rng = random.Random(args.seed)
    results = [measure(n, rng, args.rounds, args.changes) for n in args.sizes]

    def row(label: str, cell: Callable[[dict[str, Any]], str]) -> None:
        print(f"| {label} | " + " | ".join(cell(r) for r in results) + " |")

    print(
        "| what (N topics, N subscriptions) | " + " | ".join(f"{r['n']:,}" for r in results) + " |"
    )
    print("| --- |" + " --- |" * len(results))
    row(
        "topic tree: full reload (before: after any topic change, every process)",
        lambda r: f"{r['tree_full_s']:.3f} s",
    )
    row(
        "topic tree: one topic change applied in another process, p50 / p99",
        lambda r: f"{ms(pct(r['tree_apply'], 0.5))} / {ms(pct(r['tree_apply'], 0.99))}",
    )
    row(
        "subscription index: full rebuild (before: after any subscription change)",
        lambda r: f"{r['index_full_s']:.3f} s",
    )
    row(
        "subscription index: one change applied in another process, p50 / p99",
        lambda r: f"{ms(pct(r['index_apply'], 0.5))} / {ms(pct(r['index_apply'], 0.99))}",
    )
    row(
        "Subscribe (non-admin, service), p50 / p99",
        lambda r: f"{ms(pct(r['subscribe'], 0.5))} / {ms(pct(r['subscribe'], 0.99))}",
    )
    row(
        "its access check, p50: walk / every topic (before)",
        lambda r: f"{ms(statistics.median(r['acl_new']))} / {ms(statistics.median(r['acl_old']))}",
    )
    row(
        "topic lookup p99: first (cold) / again (warm) / first, scanning wildcards (before)",
        lambda r: (
            f"{ms(pct(r['lookup_cold'], 0.99))} / {ms(pct(r['lookup_warm'], 0.99))} / "
            f"{ms(pct(r['lookup_linear'], 0.99))}"
        ),
    )
    row("collector runs during the first lookups", lambda r: f"{r['lookup_collections']}")
    row("subscriptions a looked-up topic has (mean)", lambda r: f"{r['matches']:.0f}")
    row("memory per topic / per subscription",
        lambda r: f"{r['tree_bytes']:.0f} B / {r['index_bytes']:.0f} B")  # fmt: skip
    shared_s, alone_s = same_filter(args.same_filter, args.rounds)
    print(
        f"\n{args.same_filter:,} subscriptions with the same XPath filter, one message: "
        f"{ms(shared_s)} shared, {ms(alone_s)} one evaluation each ({alone_s / shared_s:.0f}x)"
    )
    if args.wide:
        queued, wake, before = wide_fanout(args.wide, args.rounds)
        print(
            f"one Notify matching {args.wide:,} subscriptions: all queued and ready in "
            f"{ms(queued)} (one fan-out batch); their wake-up {ms(wake)} (one RPUSH) against "
            f"{ms(before)} for one Celery task each, as before ({before / wake:.0f}x)"
        )
    if args.load_topics:
        seconds, per_topic = load_topics(args.load_topics)
        print(
            f"start-up load of {args.load_topics:,} topics: {seconds:.1f} s, "
            f"{per_topic:.0f} B per topic"
        )
    refused = ", ".join(f"{r['refused']}" for r in results)
    rebuilt = ", ".join(f"{r['subscribe_rebuilds']}" for r in results)
    print(
        f"\n{os.cpu_count()} CPUs, PostgreSQL and Redis on 127.0.0.1; full builds: best of "
        f"{args.rounds}; changes applied: 50 topic and {args.changes // 2 * 2} subscription "
        f"changes per size; Subscribe: 400 calls per size (refused, reaching the closed subtree: "
        f"{refused}; full rebuilds during them: {rebuilt}); lookups over 2,000 topics"
    )
    state_flush()


def state_flush() -> None:
    from hpwsn_site import state

    state.get_redis().flushdb()


if __name__ == "__main__":
    main()
