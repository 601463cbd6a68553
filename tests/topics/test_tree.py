from hpwsn import ns
from hpwsn.topicexpr import parse
from topics.tree import Matcher, TopicNode, TopicTree


def _tree() -> TopicTree:
    paths = ["ALL", "ALL:ALARM", "ALL:ALARM:ALARM1", "Object", "Object:Tool"]
    nodes = [TopicNode(i, tuple(p.split(":")), "urn:obj" if p.startswith("Object") else None)
             for i, p in enumerate(paths)]  # fmt: skip
    return TopicTree(nodes)


def test_a_root_with_a_namespace_only_resolves_in_that_namespace():
    tree = _tree()
    assert tree.resolve("urn:obj", ("Object", "Tool"), False) is not None
    assert tree.resolve("urn:other", ("Object", "Tool"), False) is None
    assert tree.resolve("urn:other", ("Object", "Tool"), True) is not None  # colon path
    assert tree.resolve("urn:anything", ("ALL",), False) is not None  # root without namespace


def test_the_matcher_walks_ancestors_and_wildcards():
    m = Matcher()
    m.add("all", parse("ALL", ns.DIALECT_SIMPLE, {}), ("ALL",))
    m.add("alarm1", parse("ALL:ALARM:ALARM1", ns.DIALECT_SIMPLE, {}), ("ALL", "ALARM", "ALARM1"))
    m.add("wild", parse("ALL/*", ns.DIALECT_FULL, {}), None)
    assert set(m.match(None, ("ALL",))) == {"all"}
    assert set(m.match(None, ("ALL", "ALARM"))) == {"all", "wild"}
    assert set(m.match(None, ("ALL", "ALARM", "ALARM1", "X"))) == {"all", "alarm1", "wild"}
    assert list(m.match(None, ("Object",))) == []


def test_matching_cost_does_not_grow_with_the_number_of_topics():
    m = Matcher()
    for i in range(100_000):
        m.add(i, parse(f"T{i}", ns.DIALECT_SIMPLE, {}), (f"T{i}",))
    # 10^5 subscriptions on distinct roots: a lookup touches only the path's own ancestors.
    assert list(m.match(None, ("T99999", "child"))) == [99999]


def test_a_child_inherits_every_policy_value_it_does_not_set():
    from topics.tree import ROOT_POLICY

    parent = ROOT_POLICY.inherit({"reliability": "fast", "ttl_seconds": 30, "ordered": None})
    child = parent.inherit({"priority": 9, "reliability": "", "retry_schedule": ()})
    assert (child.reliability, child.ttl_seconds, child.priority) == ("fast", 30, 9)
    assert child.ordered is True  # from the root
    assert ROOT_POLICY.reliability == "reliable"
