"""The pattern trie, the matcher's memo and the access check agree with the expressions' own
`covers` over random patterns, topics and changes (property-based)."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpwsn import errors, ns, topicexpr
from topics.acl import ANONYMOUS, Principal, check_subscribe_expression, may_subscribe
from topics.tree import ROOT_POLICY, Matcher, TopicNode, TopicTree
from topics.trie import PatternTrie

NSMAP = {"p": "urn:p", "q": "urn:q"}
NAME = st.sampled_from(["A", "B", "C"])
STEP = st.sampled_from(["A", "B", "C", "*", "."])
ROOT_NS = st.sampled_from([None, "urn:p", "urn:q"])
TOPIC = st.lists(NAME, min_size=1, max_size=5).map(tuple)
Names = tuple[str, ...]


@st.composite
def full_expression(draw: st.DrawFn) -> topicexpr.TopicExpression:
    alternatives = []
    for _ in range(draw(st.integers(1, 2))):
        text = "//" if draw(st.booleans()) else ""
        first = draw(NAME | st.just("*"))
        prefix = draw(st.sampled_from(["", "p:", "q:"]))
        text += prefix + first
        for _ in range(draw(st.integers(0, 3))):
            text += draw(st.sampled_from(["/", "//"])) + draw(STEP)
        alternatives.append(text)
    return topicexpr.parse("|".join(alternatives), ns.DIALECT_FULL, NSMAP)


@settings(max_examples=300, deadline=None)
@given(
    exprs=st.lists(full_expression(), min_size=1, max_size=8),
    removed=st.sets(st.integers(0, 7)),
    topics=st.lists(st.tuples(ROOT_NS, TOPIC), min_size=1, max_size=10),
)
def test_the_trie_finds_exactly_the_patterns_that_cover_a_topic(
    exprs: list[topicexpr.TopicExpression],
    removed: set[int],
    topics: list[tuple[str | None, tuple[str, ...]]],
) -> None:
    trie = PatternTrie()
    for i, expr in enumerate(exprs):
        trie.add(i, expr.patterns)
    for i in removed:
        trie.remove(i)
    live = [i for i in range(len(exprs)) if i not in removed]
    for root_ns, names in topics:
        expected = {i for i in live if exprs[i].covers(root_ns, names)}
        assert set(trie.match(root_ns, names)) == expected, (root_ns, names)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 4),  # key
            st.one_of(st.none(), full_expression()),  # None: remove
            st.lists(st.tuples(ROOT_NS, TOPIC), max_size=4),
        ),
        max_size=12,
    ),
    max_states=st.sampled_from([50_000, 3]),
    primed=st.booleans(),
)
def test_the_walks_states_follow_every_change(
    steps: list[tuple[int, topicexpr.TopicExpression | None, list[tuple[str | None, Names]]]],
    max_states: int,
    primed: bool,
) -> None:
    # Lookups between changes file the walk's states (or a build works them all out); each
    # change must refresh those it makes wrong, and a lookup past the states' limit walks
    # without them.
    trie = PatternTrie()
    trie.MAX_STATES = max_states
    live: dict[int, topicexpr.TopicExpression] = {}
    for key, expr, lookups in steps:
        trie.remove(key)
        live.pop(key, None)
        if expr is not None:
            trie.add(key, expr.patterns)
            live[key] = expr
        if primed:
            trie.prime()
        for root_ns, names in [*lookups, *lookups]:  # the second time through filed states
            expected = {k for k, e in live.items() if e.covers(root_ns, names)}
            assert set(trie.match(root_ns, names)) == expected, (root_ns, names)


def test_states_filed_while_another_thread_changes_the_trie_answer_as_the_trie_does() -> None:
    """Lookups in four threads file states while a fifth adds and removes patterns. Once the
    changes stop, every topic is looked up again through the states filed meanwhile: each answer
    is the patterns' own."""
    texts = ["A/B", "A//C", "A/*/C", "B//*", "A/B//C", "*/C", "//B/C", "C/A/*"]
    patterns = [topicexpr.parse(t, ns.DIALECT_FULL, {}) for t in texts]
    topics = [t for depth in (1, 2, 3) for t in itertools.product("ABCD", repeat=depth)]
    trie = PatternTrie()
    stop = threading.Event()
    errors_seen: list[BaseException] = []

    def look() -> None:
        try:
            while not stop.is_set():
                for topic in topics:
                    trie.match(None, topic)
        except BaseException as exc:  # pragma: no cover - reported below
            errors_seen.append(exc)

    readers = [threading.Thread(target=look) for _ in range(4)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns within a change and a lookup
    for thread in readers:
        thread.start()
    rng = random.Random(5)
    live: dict[int, topicexpr.TopicExpression] = {}
    try:
        for _ in range(500):
            key = rng.randrange(len(patterns))
            if key in live:
                trie.remove(key)
                del live[key]
            else:
                trie.add(key, patterns[key].patterns)
                live[key] = patterns[key]
    finally:
        stop.set()
        for thread in readers:
            thread.join()
        sys.setswitchinterval(switch)
    assert errors_seen == []
    for topic in topics:
        expected = {k for k, e in live.items() if e.covers(None, topic)}
        assert set(trie.match(None, topic)) == expected, topic


def test_removing_every_pattern_leaves_an_empty_trie() -> None:
    trie = PatternTrie()
    for i, text in enumerate(["A//B/*", "A//B/C", "A//.", "*/A"]):
        trie.add(i, topicexpr.parse(text, ns.DIALECT_FULL, {}).patterns)
    for i in range(4):
        trie.remove(i)
    assert trie.match(None, ("A", "B", "C")) == []
    assert trie._top.empty()


CHANGE = st.tuples(
    st.integers(0, 5),  # subscription key
    st.one_of(st.none(), full_expression(), TOPIC),  # None: unsubscribe; a tuple: concrete
)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(CHANGE, st.lists(st.tuples(ROOT_NS, TOPIC), max_size=3)), max_size=12),
    limits=st.sampled_from([(Matcher.MEMO_MAX, Matcher.FORGOT_MAX), (4, 3)]),
)
def test_the_memo_never_answers_with_what_a_change_made_stale(
    steps: list[tuple[tuple[int, object], list[tuple[str | None, tuple[str, ...]]]]],
    limits: tuple[int, int],
) -> None:
    # Each add gives its key a new value: a lookup must answer with the value of the last add,
    # once per key (a key of two alternatives may be filed at two nodes of the trie). With small
    # limits the memo also starts again often (too many topics, too many prefixes forgotten).
    values: dict[int, tuple[int, int]] = {}
    matcher = Matcher(resolve=values.__getitem__)
    matcher.MEMO_MAX, matcher.FORGOT_MAX = limits
    live: dict[int, tuple[topicexpr.TopicExpression, tuple[str, ...] | None]] = {}
    for n, ((key, what), lookups) in enumerate(steps):
        if what is None:
            matcher.remove(key)
            live.pop(key, None)
        elif isinstance(what, tuple):
            expr = topicexpr.parse(":".join(what), ns.DIALECT_COLON, {})
            matcher.remove(key)
            values[key] = (key, n)
            matcher.add(key, expr, what)
            live[key] = (expr, what)
        else:
            assert isinstance(what, topicexpr.TopicExpression)
            matcher.remove(key)
            values[key] = (key, n)
            matcher.add(key, what, None)
            live[key] = (what, None)
        for root_ns, names in lookups:
            expected = [
                values[k]
                for k, (expr, exact) in live.items()
                if (names[: len(exact)] == exact if exact else expr.covers(root_ns, names))
            ]
            assert sorted(matcher.match(root_ns, names)) == sorted(expected)


@pytest.mark.parametrize("looked_up_before", [False, True])
def test_a_change_made_while_a_lookup_reads_is_not_hidden_by_its_answer(
    looked_up_before: bool,
) -> None:
    # Pump threads look topics up while another thread applies changes: an answer worked out
    # from the subscriptions before a change must not be remembered past it. Here the change
    # comes while the lookup reads the values of the keys filed at its topic, and files a key
    # above it, where the lookup has looked already.
    changed: list[str] = []
    matcher: Matcher

    def resolve(key: str) -> str:
        if key == "old" and not changed:
            changed.append(key)
            matcher.add("new", topicexpr.parse("X", ns.DIALECT_COLON, {}), ("X",))
        return key.upper()

    matcher = Matcher(resolve=resolve)
    if looked_up_before:  # something is remembered already: the change stamps its prefix
        matcher.add("z", topicexpr.parse("Z", ns.DIALECT_COLON, {}), ("Z",))
        assert list(matcher.match(None, ("Z",))) == ["Z"]
    matcher.add("old", topicexpr.parse("X:Y", ns.DIALECT_COLON, {}), ("X", "Y"))

    first = sorted(matcher.match(None, ("X", "Y")))
    assert changed  # the change came during the lookup

    assert first in (["OLD"], ["NEW", "OLD"])  # before or after the change: either is right
    assert sorted(matcher.match(None, ("X", "Y"))) == ["NEW", "OLD"]  # after it: the new key


def test_an_answer_filed_as_the_memo_starts_again_does_not_hold() -> None:
    # Another thread starts the memo again (a pattern that can reach any topic) between a
    # lookup's last look at the count of forgets and the filing of its answer: the answer, worked
    # out before that change, goes into the new memo, and must not be given again.
    matcher = Matcher()
    matcher.add("old", topicexpr.parse("X", ns.DIALECT_COLON, {}), ("X",))
    calls = []

    class Memo(dict):  # type: ignore[type-arg]
        def get(self, key, default=None):  # type: ignore[no-untyped-def]
            calls.append(key)
            if len(calls) == 2:  # the lookup files its answer: the change comes now
                matcher.add("any", topicexpr.parse("*", ns.DIALECT_FULL, {}), None)
            return super().get(key, default)

    matcher._memo = Memo()
    assert list(matcher.match(None, ("X",))) == ["old"]  # worked out before the change
    assert len(calls) == 2

    assert sorted(matcher.match(None, ("X",))) == ["any", "old"]


def test_removing_every_concrete_subscription_leaves_no_place_behind() -> None:
    matcher = Matcher()
    paths = [("A",), ("A", "B"), ("A", "B", "C"), ("A", "D"), ("E", "F")]
    for i, names in enumerate(paths):
        matcher.add(i, topicexpr.parse(":".join(names), ns.DIALECT_COLON, {}), names)
    assert sorted(matcher.match(None, ("A", "B", "C"))) == [0, 1, 2]
    for i in (2, 0, 4, 1):
        matcher.remove(i)
    assert list(matcher.match(None, ("A", "B", "C"))) == []
    assert list(matcher.match(None, ("A", "D"))) == [3]
    matcher.remove(3)
    assert matcher._exact == {}


def test_a_key_filed_beside_ones_already_looked_up_is_found() -> None:
    # The values are kept per node of the trie and per exact topic: a key filed at a place a
    # lookup has read must be found by the next lookup, and one removed from it no more.
    values = {k: k.upper() for k in ("w1", "w2", "e1", "e2")}
    matcher = Matcher(resolve=values.__getitem__)
    wild = topicexpr.parse("A//*", ns.DIALECT_FULL, {})
    exact = topicexpr.parse("A", ns.DIALECT_COLON, {})
    matcher.add("w1", wild, None)
    matcher.add("e1", exact, ("A",))
    assert sorted(matcher.match(None, ("A", "B"))) == ["E1", "W1"]
    matcher.add("w2", wild, None)
    matcher.add("e2", exact, ("A",))
    assert sorted(matcher.match(None, ("A", "C"))) == ["E1", "E2", "W1", "W2"]
    matcher.remove("w1")
    matcher.remove("e1")
    assert sorted(matcher.match(None, ("A", "D"))) == ["E2", "W2"]


# ---------------------------------------------------------------- access check

SUBSCRIBER = Principal("s1", frozenset({"subs"}))
RULES = st.sampled_from(
    [
        {},
        {},
        {"anonymous_subscribe": True},
        {"subscribe_groups": ("subs",)},
        {"subscribe_groups": ("other",), "anonymous_subscribe": False},
    ]
)


@st.composite
def policy_tree(draw: st.DrawFn) -> TopicTree:
    paths = draw(st.sets(TOPIC, min_size=1, max_size=12))
    full = {p[:k] for p in paths for k in range(1, len(p) + 1)}
    nodes: dict[tuple[str, ...], TopicNode] = {}
    for i, names in enumerate(sorted(full, key=len)):
        parent = nodes.get(names[:-1])
        policy = (parent.policy if parent else ROOT_POLICY).inherit(draw(RULES))
        root_ns = parent.root_namespace if parent else draw(ROOT_NS)
        nodes[names] = TopicNode(id=i, names=names, root_namespace=root_ns, policy=policy)
    return TopicTree(nodes.values())


@settings(max_examples=300, deadline=None)
@given(
    tree=policy_tree(),
    expr=full_expression(),
    principal=st.sampled_from([ANONYMOUS, SUBSCRIBER]),
)
def test_a_subscribe_allowed_covers_no_existing_topic_the_caller_may_not_read(
    tree: TopicTree, expr: topicexpr.TopicExpression, principal: Principal
) -> None:
    denied_topics = [
        node
        for node in tree.by_names.values()
        if not may_subscribe(node.policy, principal)
        and expr.covers(node.root_namespace, node.names)
    ]
    try:
        check_subscribe_expression(tree, expr, principal)
    except errors.NotAuthorized:
        return
    assert denied_topics == []


def test_a_change_of_rule_deep_in_the_tree_is_found_under_a_wildcard() -> None:
    nodes = [TopicNode(0, ("R",), None, ROOT_POLICY.inherit({"anonymous_subscribe": True}))]
    parent = nodes[0]
    for depth in range(1, 8):
        own = {"anonymous_subscribe": False} if depth == 7 else {}
        parent = TopicNode(depth, (*parent.names, f"N{depth}"), None, parent.policy.inherit(own))
        nodes.append(parent)
    tree = TopicTree(nodes)
    check_subscribe_expression(tree, topicexpr.parse("R/N1/*/Q", ns.DIALECT_FULL, {}), ANONYMOUS)
    with pytest.raises(errors.NotAuthorized) as caught:
        check_subscribe_expression(tree, topicexpr.parse("R//N5", ns.DIALECT_FULL, {}), ANONYMOUS)
    assert "R:N1:N2:N3:N4:N5:N6:N7" in caught.value.message
    tree.drop(nodes[-1].names)  # the boundary goes with its topic
    check_subscribe_expression(tree, topicexpr.parse("R//N5", ns.DIALECT_FULL, {}), ANONYMOUS)


_COUNT_LEFT = """
import gc
from hpwsn import ns, topicexpr
from topics.tree import Matcher

matcher = Matcher()
matcher.add("w", topicexpr.parse("A//*", ns.DIALECT_FULL, {}), None)
matcher.add("e", topicexpr.parse("A:B", ns.DIALECT_COLON, {}), ("A", "B"))
assert sorted(matcher.match(None, ("A", "B", "C"))) == ["e", "w"]
names = ("A", "B", "D")
gc.disable()
before = len(gc.get_objects())
found = matcher.match(None, names)
del found
print(len(gc.get_objects()) - before)
assert sorted(matcher.match(None, names)) == ["e", "w"]  # from the memo
assert sorted(matcher.match(None, ("A", "B"))) == ["e", "w"]  # a node of the memo too
"""


def test_a_first_lookup_beside_one_already_looked_up_leaves_one_object_to_the_collector() -> None:
    """A first lookup's tail is Python's cyclic collector, which runs after a number of new
    objects: a topic whose parent's node is in the memo leaves only its groups behind for the
    collector to track (before: a node, its groups and the answer, three). Counted in a process
    of its own: the other threads of this one allocate too."""
    done = subprocess.run(
        [sys.executable, "-c", _COUNT_LEFT],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        check=True,
    )
    assert done.stdout.split() == ["1"]
