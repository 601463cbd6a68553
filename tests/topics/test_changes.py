"""The change log keeps every process's topic tree and subscription index equal to a full
rebuild, whatever the changes (property-based, through the real services and database), and a
process that missed entries finds out and rebuilds."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, connections, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpwsn import ns
from hpwsn.wsn import TopicRef
from hpwsn_site import state
from subscriptions import cascades
from subscriptions import selectors as sub_selectors
from subscriptions import services as subs
from subscriptions.filters import SQL
from subscriptions.models import Subscription
from topics import changes
from topics import selectors as topic_selectors
from topics import services as topics
from topics.acl import Principal
from topics.models import Topic
from topics.tree import TopicTree

pytestmark = pytest.mark.django_db

ADMIN = Principal(name="admin1", groups=frozenset({"hpwsn-admins"}))
TREE = ("Plant:Hall:Press", "Plant:Hall:Lathe", "Plant:Yard", "Depot:Gate")
NAMES = st.sampled_from(["Plant", "Hall", "Press", "Lathe", "Yard", "Depot", "Gate", "Dock"])
EXPRESSIONS = st.sampled_from(
    [
        ("Plant", None),
        ("Plant:Hall:Press", None),
        ("Depot:Gate", None),
        ("Plant/*", ns.DIALECT_FULL),
        ("Plant//Press", ns.DIALECT_FULL),
        ("//Gate|Plant/Yard", ns.DIALECT_FULL),
        ("*/Hall//.", ns.DIALECT_FULL),
        (None, None),
    ]
)
FILTERS = st.sampled_from(
    [None, ("boolean(//level)", None), ("//level > 3", None), ("level > 3", SQL), ("x = 'a'", SQL)]
)


@pytest.fixture
def own_markers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An epoch marker, change counters and copy of the newest entries of this test's own (so
    versions are trusted, and entries of transactions rolled back after a test stay out)."""
    tag = uuid.uuid4().hex
    names = ("EPOCH", "TOPIC_CHANGES", "SUBSCRIPTION_CHANGES", "CHANGES_RECENT", "CHANGES_CARRIED")
    keys = {name: f"{state.PREFIX}test:{tag}:{name}" for name in names}
    for name, key in keys.items():
        monkeypatch.setattr(state, name, key)
    r = state.get_redis()
    # An epoch of its own too: a process-wide feed that an earlier test left at the same markers
    # would take its value for current and not read the database again.
    r.set(state.EPOCH, tag)
    yield
    r.delete(*keys.values())


def _feeds() -> tuple[changes.ChangeFeed[TopicTree], changes.ChangeFeed[Any]]:
    return (
        changes.ChangeFeed(
            kind=changes.TOPIC,
            version_key=state.VERSION_TOPICS,
            build=topic_selectors._load,
            apply=topic_selectors._apply,
        ),
        changes.ChangeFeed(
            kind=changes.SUBSCRIPTION,
            version_key=state.VERSION_SUBS,
            build=sub_selectors._build,
            apply=sub_selectors._apply,
        ),
    )


def _entries_read(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """From now on, what each check of a feed read of the entries' copies (None: the markers
    alone)."""
    reads: list[Any] = []
    real = changes.changes_poll

    def counted(**kwargs: Any) -> Any:
        found = real(**kwargs)
        reads.append(found[1])
        return found

    monkeypatch.setattr(changes, "changes_poll", counted)
    return reads


def tree_view(tree: TopicTree) -> dict[str, object]:
    return {
        "nodes": {n.names: (n.id, n.root_namespace, n.policy) for n in tree.by_names.values()},
        "kids": tree._kids,
        "boundaries": tree._boundaries,
        "bcount": tree._bcount,
        "marks": tree._marks,
    }


def index_view(index: Any, tree: TopicTree) -> dict[str, object]:
    def entry(e: Any) -> tuple[object, ...]:
        return (e.mode, e.consumer_address, e.paused, e.termination_ts, e.topic_path, e.created_ts,
                e.content_filter is not None)  # fmt: skip

    group_of = {id(g): k for k, g in index._group_index.items()}
    topics_ = [*tree.by_names, ("Plant", "Other", "Gate"), ("Dock",)]
    return {
        "by_id": {i: entry(e) for i, e in index.by_id.items()},
        "per_consumer": index.per_consumer,
        "groups": {k: set(m) for k, m in index._members.items()},
        "xpaths": {k: n for k, (_f, n) in index.xpaths.items()},
        "matching": {t: sorted(e.id for e in index.matching(None, t)) for t in topics_},
        "filter_groups": {
            t: sorted(group_of[id(g)] for g in index.filter_groups(None, t)) for t in topics_
        },
    }


@contextlib.contextmanager
def woken(capture: Callable[..., Any]) -> Iterator[None]:
    """Run the on-commit callbacks of the services called inside (the wake-ups)."""
    with capture(execute=True):
        yield


Op = tuple[str, Any, Any, Any]
OPS = st.one_of(
    st.tuples(st.just("subscribe"), EXPRESSIONS, FILTERS, st.integers(0, 3)),
    st.tuples(
        st.sampled_from(["renew", "pause", "resume", "suspend", "unsubscribe"]),
        st.integers(0, 20),
        st.none(),
        st.none(),
    ),
    st.tuples(
        st.just("topic_create"), st.lists(NAMES, min_size=1, max_size=3), st.none(), st.none()
    ),
    st.tuples(st.just("topic_update"), st.integers(0, 20), st.booleans(), st.none()),
    st.tuples(st.just("topic_rename"), st.integers(0, 20), NAMES, st.none()),
    st.tuples(
        st.just("topic_delete"), st.integers(0, 20), st.sampled_from(["keep", "delete"]), st.none()
    ),
)


def run(op: Op, counter: Iterator[int]) -> None:
    kind, a, b, c = op
    sub_ids = [
        str(i) for i in Subscription.objects.order_by("created_at").values_list("id", flat=True)
    ]
    topic_ids = list(Topic.objects.order_by("path").values_list("id", flat=True))
    if kind == "subscribe":
        text, dialect = a
        content = None
        if b is not None:
            content = TopicRef(text=b[0], dialect=b[1], nsmap={})
        with contextlib.suppress(Exception):  # a topic renamed or deleted away: refused
            subs.subscription_create(
                consumer_address=f"http://127.0.0.1:9/c{c}/{next(counter)}",
                topic=TopicRef(text=text, dialect=dialect, nsmap={}) if text else None,
                content=content,
                initial_termination_time=None,
                soap_version="1.1",
                use_raw=False,
                base_url="http://testserver",
                principal=ADMIN,
            )
    elif kind in ("renew", "pause", "resume", "suspend", "unsubscribe") and sub_ids:
        sub_id = sub_ids[a % len(sub_ids)]
        if kind == "renew":
            subs.subscription_renew(subscription_id=sub_id, termination_time="PT1H")
        elif kind in ("pause", "resume"):
            subs.subscription_set_state(subscription_id=sub_id, paused=kind == "pause")
        elif kind == "suspend":
            subs.subscription_suspend(subscription_id=sub_id)
        else:
            subs.subscription_delete(subscription_id=sub_id)
    elif kind == "topic_create":
        topics.topic_create(path=":".join(a))
    elif kind.startswith("topic_") and topic_ids:
        topic_id = topic_ids[a % len(topic_ids)]
        if kind == "topic_update":
            topics.topic_update(topic_id=topic_id, changes={"anonymous_subscribe": b})
        elif kind == "topic_rename":
            with contextlib.suppress(Exception):  # the name is taken
                cascades.topic_rename(topic_id=topic_id, name=b)
        else:
            cascades.topic_delete(topic_id=topic_id, subscriptions=b)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(OPS, min_size=1, max_size=14))
def test_the_changes_applied_equal_a_full_rebuild(
    ops: list[Op], own_markers: None, django_capture_on_commit_callbacks: Any
) -> None:
    for path in TREE:
        topics.topic_create(path=path)
    tree_feed, index_feed = _feeds()
    tree_feed.get(max_age=0)
    index_feed.get(max_age=0)
    counter = itertools.count()
    for op in ops:
        with woken(django_capture_on_commit_callbacks):
            run(op, counter)
        tree = tree_feed.get(max_age=0)
        index = index_feed.get(max_age=0)
        rebuilt_tree = topic_selectors._load()
        assert tree_view(tree) == tree_view(rebuilt_tree), op
        assert index_view(index, tree) == index_view(sub_selectors._build(), tree), op
    # Everything came as deltas: neither feed rebuilt after its first build.
    assert (tree_feed.rebuilds, index_feed.rebuilds) == (1, 1)
    # Leave no rows to the next example (they share the test's transaction).
    Subscription.objects.all().delete()
    Topic.objects.all().delete()


def _subscribe(path: str, dialect: str | None = None, **options: Any) -> str:
    """A Subscribe as an admin; `options` replace the service's arguments below."""
    arguments = {
        "consumer_address": f"http://127.0.0.1:9/{uuid.uuid4().hex}",
        "topic": TopicRef(text=path, dialect=dialect, nsmap={}),
        "content": None,
        "initial_termination_time": None,
        "soap_version": "1.1",
        "use_raw": False,
        "base_url": "http://testserver",
        "principal": ADMIN,
    }
    sub, _created = subs.subscription_create(**{**arguments, **options})
    return str(sub.id)


def test_an_index_built_from_the_rows_has_resolved_every_place_before_its_first_lookup(
    own_markers: None,
) -> None:
    """A process that builds its index reads a topic's subscriptions first from the places'
    resolved entries, not by resolving each subscription at its first lookup."""
    for path in TREE:
        topics.topic_create(path=path)
    ids = {_subscribe("Plant"), _subscribe("Plant:Hall:Press")}
    ids.add(_subscribe("Plant//Press", ns.DIALECT_FULL))
    index = sub_selectors._build()

    def refuse(key: object) -> object:
        raise AssertionError(f"resolved at a lookup: {key}")

    index._matcher._resolve = refuse
    assert {e.id for e in index.matching(None, ("Plant", "Hall", "Press"))} == ids


def test_a_process_that_missed_entries_finds_the_gap_and_rebuilds(
    own_markers: None, django_capture_on_commit_callbacks: Any
) -> None:
    topics.topic_create(path="Plant:Hall")
    _tree, feed = _feeds()
    first = _subscribe("Plant:Hall")
    assert set(feed.get(max_age=0).by_id) == {first}

    with woken(django_capture_on_commit_callbacks):
        missed = _subscribe("Plant")
        second = _subscribe("Plant:Hall")
    # The entry of `missed` is pruned before this process read it, from the log and its copy.
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM topics_change WHERE key = %s", [missed])
    r = state.get_redis()
    r.zrem(
        state.CHANGES_RECENT,
        *[m for m in r.zrange(state.CHANGES_RECENT, 0, -1) if missed in m.decode()],
    )

    index = feed.get(max_age=0)

    assert feed.rebuilds == 2
    assert set(index.by_id) == {first, missed, second}
    assert {e.id for e in index.matching(None, ("Plant", "Hall"))} == {first, missed, second}


def test_a_built_index_is_out_of_the_collectors_reach_and_a_rebuild_frees_the_one_before(
    own_markers: None,
) -> None:
    """No collection scans a process's index again once it is built; a rebuild leaves nothing
    of the index before it behind (its pattern trie holds reference cycles)."""
    topics.topic_create(path="Plant:Hall")
    ids = {_subscribe("Plant//Hall", ns.DIALECT_FULL) for _ in range(20)}
    _tree, feed = _feeds()

    def entries_tracked() -> int:
        """Entries of these subscriptions the collector sees (frozen ones are out of its view)."""
        return sum(isinstance(o, sub_selectors.SubEntry) and o.id in ids for o in gc.get_objects())

    gc.collect()  # after which a rebuild of an earlier test has let the objects be frozen again
    try:
        index = feed.get(max_age=0)
        assert len(index.matching(None, ("Plant", "Hall"))) == 20
        assert entries_tracked() == 0

        for _ in range(3):
            state.get_redis().delete(state.EPOCH)  # as after a Redis that lost its data
            index = feed.get(max_age=0)
            assert len(index.matching(None, ("Plant", "Hall"))) == 20
        assert feed.rebuilds == 4
        gc.collect()  # the process's next full collection (the test held each old index)
        assert entries_tracked() == 0
    finally:
        gc.unfreeze()
    # Back in view: none of the three indexes before is left as garbage only the collector frees.
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, sub_selectors.SubEntry) and o.id in ids]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == []


def test_a_feed_is_woken_by_changes_of_its_own_kind_only(
    own_markers: None, django_capture_on_commit_callbacks: Any, django_assert_num_queries: Any
) -> None:
    topics.topic_create(path="Plant:Hall")
    tree_feed, sub_feed = _feeds()
    tree_feed.get(max_age=0)
    sub_feed.get(max_age=0)

    with woken(django_capture_on_commit_callbacks):
        sub_id = _subscribe("Plant:Hall")
    with django_assert_num_queries(0):  # the topic tree does not read the log for it
        tree_feed.get(max_age=0)
    assert sub_id in sub_feed.get(max_age=0).by_id

    with woken(django_capture_on_commit_callbacks):
        topics.topic_create(path="Plant:Yard")
    assert tree_feed.get(max_age=0).get("Plant:Yard") is not None


def test_a_feed_whose_kind_has_no_entry_yet_reads_none_of_the_others(
    own_markers: None, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No topic changed since Redis started: the topics' wake-up counter is absent, as the tree's
    feed last saw it. Subscribes do not make the tree's check read their entries (a Subscribe
    checks the tree, and the check read up to a page of other entries each time)."""
    topics.topic_create(path="Plant:Hall")  # in the log, no wake-up sent
    tree_feed, _subs = _feeds()
    tree_feed.get(max_age=0)
    with woken(django_capture_on_commit_callbacks):
        for _ in range(3):
            _subscribe("Plant:Hall")
    assert not state.get_redis().exists(state.TOPIC_CHANGES)
    reads = _entries_read(monkeypatch)
    assert tree_feed.get(max_age=0).get("Plant:Hall") is not None
    assert reads == [None]  # the markers alone
    assert tree_feed.rebuilds == 1


def test_a_topic_change_loads_its_own_subtree_only(
    own_markers: None, django_capture_on_commit_callbacks: Any, django_assert_num_queries: Any
) -> None:
    """The subtree's query is compiled once, not by the ORM at each change: `_` in a name is a
    name, not the LIKE wildcard (Plant_Hall's change does not reload PlantXHall's subtree)."""
    for path in ("Plant_Hall:Press", "PlantXHall:Press", "Plant_Hall2"):
        topics.topic_create(path=path)
    tree_feed, _index = _feeds()
    tree_feed.get(max_age=0)
    before = {names: node for names, node in tree_feed.get(max_age=0).by_names.items()}

    with woken(django_capture_on_commit_callbacks):
        topics.topic_update(
            topic_id=Topic.objects.get(path="Plant_Hall").pk, changes={"priority": 7}
        )
    with django_assert_num_queries(1):  # the subtree's rows
        tree = tree_feed.get(max_age=0)

    changed = {n for n, node in tree.by_names.items() if node is not before.get(n)}
    assert changed == {("Plant_Hall",), ("Plant_Hall", "Press")}
    assert tree.get("Plant_Hall:Press").policy.priority == 7  # type: ignore[union-attr]
    assert tree.get("PlantXHall:Press").policy.priority != 7  # type: ignore[union-attr]
    assert tree_feed.rebuilds == 1


def test_a_lost_wake_up_is_made_up_for_by_the_next_poll(
    own_markers: None, django_capture_on_commit_callbacks: Any
) -> None:
    topics.topic_create(path="Plant:Hall")
    _tree, feed = _feeds()
    assert len(feed.get(max_age=0)) == 0
    sub_id = _subscribe("Plant:Hall")  # committed without its wake-up (Redis was away)

    assert len(feed.get(max_age=0)) == 0  # not told yet
    feed.polled -= changes.POLL_S
    assert set(feed.get(max_age=0).by_id) == {sub_id}
    assert feed.rebuilds == 1


def test_a_redis_that_lost_its_data_makes_every_process_rebuild(
    own_markers: None, django_capture_on_commit_callbacks: Any
) -> None:
    topics.topic_create(path="Plant:Hall")
    _tree, feed = _feeds()
    with woken(django_capture_on_commit_callbacks):
        sub_id = _subscribe("Plant:Hall")
    assert set(feed.get(max_age=0).by_id) == {sub_id}

    state.get_redis().delete(state.EPOCH, state.SUBSCRIPTION_CHANGES)
    assert set(feed.get(max_age=0).by_id) == {sub_id}

    assert feed.rebuilds == 2


def test_a_redis_that_cannot_be_reached_serves_the_tree_from_the_database(
    own_markers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Sentinel failover or a restart: the publish path still finds its topics."""
    import redis

    topics.topic_create(path="Plant:Hall")
    tree_feed, _feed = _feeds()
    assert tree_feed.get(max_age=0).get("Plant:Hall") is not None

    def away(**_kwargs: Any) -> Any:
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(changes, "changes_poll", away)
    topics.topic_create(path="Plant:Yard")

    tree = tree_feed.get(max_age=0)

    assert tree.get("Plant:Yard") is not None  # built again from the database


def test_a_topic_policy_change_reaches_the_subtree_and_the_access_check(
    own_markers: None, django_capture_on_commit_callbacks: Any
) -> None:
    topics.topic_create(path="Plant:Hall:Press")
    tree_feed, _index = _feeds()
    assert tree_feed.get(max_age=0).get("Plant:Hall:Press").policy.anonymous_subscribe is False  # type: ignore[union-attr]

    with woken(django_capture_on_commit_callbacks):
        topics.topic_update(
            topic_id=Topic.objects.get(path="Plant").pk, changes={"anonymous_subscribe": True}
        )
    tree = tree_feed.get(max_age=0)

    assert tree.get("Plant:Hall:Press").policy.anonymous_subscribe is True  # type: ignore[union-attr]
    assert tree_feed.rebuilds == 1
    assert tree.marked(()) == {"Plant": None}


def _race(writers: int, each: int, write: Callable[[int, int], None]) -> None:
    """write(n, i) for each i < each, in `writers` threads started together, each thread on its
    own database connection; fails with the first error any of them met."""
    errors: list[BaseException] = []
    start = threading.Barrier(writers)

    def run(n: int) -> None:
        try:
            start.wait()
            for i in range(each):
                write(n, i)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.django_db(transaction=True)
def test_entries_written_at_once_by_many_connections_are_numbered_without_holes() -> None:
    """Writers racing on the log (each its own connection and transaction) never take the same
    number nor leave a hole: a feed would read a hole as a pruned entry and rebuild."""
    writers, each = 4, 25

    def write(n: int, i: int) -> None:
        with transaction.atomic():
            changes.change_record(kind=changes.SUBSCRIPTION, keys=[f"w{n}-{i}", f"x{n}-{i}"])

    _race(writers, each, write)
    entries = changes.changes_after(1)
    assert [e[0] for e in entries] == list(range(1, 2 * writers * each + 1))
    assert len({e[2] for e in entries}) == 2 * writers * each


@pytest.mark.django_db
def test_the_logs_lock_and_the_append_are_one_round_trip() -> None:
    """On PostgreSQL the advisory lock and the numbered insert go to the server together (the
    race above shows that the insert still counts the entries of the lock's earlier holders)."""
    from django.test.utils import CaptureQueriesContext

    if connection.vendor != "postgresql":
        pytest.skip("the advisory lock is PostgreSQL's")
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        changes.change_record(kind=changes.SUBSCRIPTION, keys=["one-trip"])
    sent = [q["sql"] for q in queries.captured_queries if "topics_change" in q["sql"]]
    assert len(sent) == 1
    assert sent[0].startswith("SELECT pg_advisory_xact_lock(")
    assert [e[2] for e in changes.changes_after(1)][-1] == "one-trip"


def test_a_check_that_finds_nothing_changed_waits_for_no_other_thread(
    own_markers: None, django_capture_on_commit_callbacks: Any, django_assert_num_queries: Any
) -> None:
    """The pump threads of a worker check the subscription index before every run: with nothing
    changed they neither read the database nor queue behind the thread that holds the feed."""
    topics.topic_create(path="Plant:Hall")
    _tree, feed = _feeds()
    with woken(django_capture_on_commit_callbacks):
        sub_id = _subscribe("Plant:Hall")
    index = feed.get(max_age=0)
    got: list[Any] = []

    with feed._lock:  # another thread is catching up, or rebuilding
        checker = threading.Thread(target=lambda: got.append(feed.get(max_age=0)))
        with django_assert_num_queries(0):
            checker.start()
            checker.join(timeout=5)
        assert got == [index]
    assert sub_id in got[0].by_id


def test_a_woken_process_takes_the_new_entries_from_redis_not_from_the_log(
    own_markers: None, django_capture_on_commit_callbacks: Any, django_assert_num_queries: Any
) -> None:
    topics.topic_create(path="Plant:Hall")
    _tree, feed = _feeds()
    feed.get(max_age=0)
    with woken(django_capture_on_commit_callbacks):
        sub_id = _subscribe("Plant:Hall")

    # No query: its entry came with the wake-up, and carried the subscription's state.
    with django_assert_num_queries(0):
        assert sub_id in feed.get(max_age=0).by_id
    assert feed.rebuilds == 1


def _entry_fields(entry: Any) -> dict[str, object]:
    fields = dataclasses.asdict(dataclasses.replace(entry, content_filter=None))
    return {**fields, "filtered": entry.content_filter is not None}


def test_a_carried_subscription_is_the_one_its_row_gives(
    own_markers: None, django_capture_on_commit_callbacks: Any, django_assert_num_queries: Any
) -> None:
    """Every field the index reads, from the state an entry carried and from the row: a push
    subscription with every option set, and a pull one."""
    topics.topic_create(path="Plant:Hall")
    pull_point = subs.pull_point_create(base_url="http://testserver", principal=ADMIN)
    _tree, feed = _feeds()
    feed.get(max_age=0)
    with woken(django_capture_on_commit_callbacks):
        pushed = _subscribe(
            "Plant//*",
            ns.DIALECT_FULL,
            content=TopicRef(text="boolean(//level)", dialect=None, nsmap={}),
            initial_termination_time="PT5M",
            soap_version="1.2",
            use_raw=True,
        )
        subs.subscription_set_state(subscription_id=pushed, paused=True)
        pulled = _subscribe("Plant:Hall", consumer_address=pull_point.address)
    with django_assert_num_queries(0):
        index = feed.get(max_age=0)
    from_rows = sub_selectors._build()
    for sub_id in (pushed, pulled):
        assert _entry_fields(index.by_id[sub_id]) == _entry_fields(from_rows.by_id[sub_id])
    # The copies keep their format, apart from what they carry: a process of the version before
    # reads them as before (and then reads the rows).
    copy = re.compile(rf"\d+\|{changes.SUBSCRIPTION}\|[^|]+\|[0-9a-f-]{{36}}")
    r = state.get_redis()
    assert all(copy.fullmatch(m.decode()) for m in r.zrange(state.CHANGES_RECENT, 0, -1))
    assert len(r.zrange(state.CHANGES_CARRIED, 0, -1)) == 3  # two Subscribes and a pause
    carried = index.by_id[pushed]
    assert carried.paused
    assert carried.use_raw
    assert carried.termination_ts is not None
    assert carried.content_filter is not None
    assert carried.soap_version == "1.2"
    assert index.by_id[pulled].pull_point_id == str(pull_point.id)


def test_a_subscription_with_a_signing_secret_carries_nothing_to_redis(
    own_markers: None, django_capture_on_commit_callbacks: Any, django_assert_num_queries: Any
) -> None:
    topics.topic_create(path="Plant:Hall")
    _tree, feed = _feeds()
    feed.get(max_age=0)
    secret = "s3cret-" + "x" * 40
    with woken(django_capture_on_commit_callbacks):
        sub_id = _subscribe("Plant:Hall", signing_secret=secret)
    r = state.get_redis()
    copies = r.zrange(state.CHANGES_RECENT, 0, -1)
    carried = r.zrange(state.CHANGES_CARRIED, 0, -1)
    assert [m for m in copies if sub_id.encode() in m]  # its entry's copy, naming it
    assert not [m for m in carried if sub_id.encode() in m]  # and nothing carried for it
    assert not [m for m in copies + carried if secret.encode() in m]
    with django_assert_num_queries(1):  # its row
        assert feed.get(max_age=0).by_id[sub_id].signing_secret == secret


def test_what_the_copies_carry_is_trimmed_with_them(
    own_markers: None, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    topics.topic_create(path="Plant:Hall")
    monkeypatch.setattr(changes, "RECENT_KEEP", 3)
    with woken(django_capture_on_commit_callbacks):
        for _ in range(6):
            _subscribe("Plant:Hall")
    r = state.get_redis()
    kept = [int(n) for _m, n in r.zrange(state.CHANGES_RECENT, 0, -1, withscores=True)]
    carried = [int(n) for _m, n in r.zrange(state.CHANGES_CARRIED, 0, -1, withscores=True)]
    assert len(kept) == 3
    assert carried == kept


@pytest.mark.django_db(transaction=True)
def test_writers_racing_on_one_subscription_leave_woken_processes_with_its_row(
    own_markers: None,
) -> None:
    """Each write's entry carries the state its own transaction committed, in the log's order:
    applied one after the other from the copies, the last is the row's."""
    topics.topic_create(path="Plant:Hall")
    sub_id = _subscribe("Plant:Hall")
    _tree, feed = _feeds()
    feed.get(max_age=0)
    each = 15

    def write(n: int, i: int) -> None:
        if i % 3 == 2:
            subs.subscription_set_state(subscription_id=sub_id, paused=n % 2 == 0)
        else:
            until = f"PT{10 + n * each + i}M"
            subs.subscription_renew(subscription_id=sub_id, termination_time=until)

    _race(4, each, write)
    reads: list[int] = []
    real = sub_selectors._rows
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sub_selectors, "_rows", lambda ids: reads.append(len(ids)) or real(ids))
        entry = feed.get(max_age=0).by_id[sub_id]
    assert reads == []
    assert feed.rebuilds == 1
    row = Subscription.objects.get(id=sub_id)
    assert row.termination_time is not None
    assert entry.termination_ts == row.termination_time.timestamp()
    assert entry.paused == (row.state != Subscription.State.ACTIVE)


def test_a_woken_process_reads_the_markers_and_the_entries_in_one_round_trip(
    own_markers: None, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The markers that showed the change came with the entries' copies, and are the ones
    applied: the thread does not read them again once it holds the feed (unless another thread
    brought it up to date meanwhile)."""
    topics.topic_create(path="Plant:Hall")
    _tree, feed = _feeds()
    feed.get(max_age=0)
    with woken(django_capture_on_commit_callbacks):
        sub_id = _subscribe("Plant:Hall")
    reads = _entries_read(monkeypatch)
    assert sub_id in feed.get(max_age=0).by_id
    assert len(reads) == 1
    assert [key for _n, _kind, key, _at, _c in reads[0]] == [sub_id]
    assert feed.rebuilds == 1

    assert sub_id in feed.get(max_age=0).by_id
    assert reads[1] is None  # nothing new: the markers alone


def test_a_copy_that_is_not_the_logs_entry_is_found_at_the_next_read_of_the_log(
    own_markers: None, django_capture_on_commit_callbacks: Any
) -> None:
    """A copy in Redis that outlived its database (restored from a backup, numbering its entries
    again) names other keys under the same numbers: the next read of the log finds it out, even
    when the entries applied after it are right."""
    topics.topic_create(path="Plant:Hall")
    _tree, feed = _feeds()
    feed.get(max_age=0)
    with woken(django_capture_on_commit_callbacks):
        first = _subscribe("Plant:Hall")
        second = _subscribe("Plant:Hall")
    r = state.get_redis()
    member, number = r.zrange(state.CHANGES_RECENT, 0, 0, withscores=True)[0]
    assert first in member.decode()
    forged = f"{int(number)}|{changes.SUBSCRIPTION}|2001-01-01T00:00:00+00:00|{uuid.uuid4()}"
    r.zrem(state.CHANGES_RECENT, member)
    r.zadd(state.CHANGES_RECENT, {forged: number})

    index = feed.get(max_age=0)
    assert second in index.by_id
    assert first not in index.by_id  # the copy was believed
    feed.polled -= changes.POLL_S

    assert {first, second} <= set(feed.get(max_age=0).by_id)
    assert feed.rebuilds == 2
