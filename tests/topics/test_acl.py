"""Topic access rules: inheritance, groups, anonymous callers, admins, wildcard subscriptions."""

from __future__ import annotations

import pytest
from lxml import etree

from hpwsn import errors, ns, topicexpr
from topics.acl import (
    ANONYMOUS,
    Principal,
    check_publish,
    check_subscribe,
    check_subscribe_expression,
    split_groups,
)
from topics.tree import ROOT_POLICY, Policy, TopicNode, TopicTree

PUBLISHER = Principal("publisher1", frozenset({"alarm-publishers"}))
SUBSCRIBER = Principal("subscriber1", frozenset({"alarm-subscribers"}))
ADMIN = Principal("admin1", frozenset({"hpwsn-admins"}))
NOBODY = Principal("analyst1", frozenset({"hpwsn-analysts"}))


def tree(own: dict[str, dict[str, object]]) -> TopicTree:
    """A tree whose nodes inherit their parents' policies, as topics.selectors builds it."""
    nodes: dict[tuple[str, ...], TopicNode] = {}
    for i, path in enumerate(sorted(own, key=lambda p: p.count(":"))):
        names = tuple(path.split(":"))
        parent = nodes.get(names[:-1])
        policy = (parent.policy if parent else ROOT_POLICY).inherit(own[path])
        nodes[names] = TopicNode(id=i, names=names, root_namespace=None, policy=policy)
    return TopicTree(nodes.values())


ALARMS = tree(
    {
        "ALL": {"anonymous_publish": True, "anonymous_subscribe": True},
        "ALL:ALARM": {
            "anonymous_publish": False,
            "anonymous_subscribe": False,
            "publish_groups": ("alarm-publishers",),
            "subscribe_groups": ("alarm-subscribers",),
        },
        "ALL:ALARM:ALARM1": {},
        "ALL:ALARM:ALARM1:ALARM11": {},
        "ALL:OPEN": {},
        "SECRET": {"subscribe_groups": ("alarm-subscribers",)},
        "SECRET:X": {},
    }
)


def expr(text: str, dialect: str = ns.DIALECT_SIMPLE) -> topicexpr.TopicExpression:
    return topicexpr.parse(text, dialect, {})


def test_the_top_of_the_tree_allows_nobody_but_admins() -> None:
    with pytest.raises(errors.NotAuthorized):
        check_publish(ROOT_POLICY, ANONYMOUS, "X")
    with pytest.raises(errors.NotAuthorized):
        check_subscribe(ROOT_POLICY, PUBLISHER, "X")
    check_publish(ROOT_POLICY, ADMIN, "X")
    check_subscribe(ROOT_POLICY, ADMIN, "X")


def test_a_child_inherits_its_parents_groups_and_anonymous_setting() -> None:
    node = ALARMS.get("ALL:ALARM:ALARM1:ALARM11")
    assert node is not None

    check_publish(node.policy, PUBLISHER, node.path)
    with pytest.raises(errors.NotAuthorized):
        check_publish(node.policy, SUBSCRIBER, node.path)
    with pytest.raises(errors.NotAuthorized):
        check_publish(node.policy, ANONYMOUS, node.path)


def test_an_authenticated_caller_may_do_what_an_anonymous_one_may() -> None:
    node = ALARMS.get("ALL:OPEN")
    assert node is not None

    check_publish(node.policy, ANONYMOUS, node.path)
    check_publish(node.policy, NOBODY, node.path)


def test_a_star_group_admits_every_authenticated_caller_but_not_anonymous_ones() -> None:
    policy = Policy(publish_groups=("*",))

    check_publish(policy, NOBODY, "T")
    with pytest.raises(errors.NotAuthorized):
        check_publish(policy, ANONYMOUS, "T")


def test_a_denial_names_the_principal_the_operation_and_the_topic() -> None:
    node = ALARMS.get("ALL:ALARM:ALARM1")
    assert node is not None

    with pytest.raises(errors.NotAuthorized) as caught:
        check_publish(node.policy, SUBSCRIBER, node.path)

    message = caught.value.message
    assert "subscriber1" in message
    assert "publish" in message
    assert "ALL:ALARM:ALARM1" in message
    detail = etree.fromstring(f"<d>{caught.value.detail_xml}</d>")
    texts = {etree.QName(el).localname: el.text for el in detail}
    assert texts == {
        "Principal": "subscriber1",
        "Operation": "publish",
        "Topic": "ALL:ALARM:ALARM1",
    }


def test_an_anonymous_denial_says_so_in_its_detail() -> None:
    with pytest.raises(errors.NotAuthorized) as caught:
        check_publish(ROOT_POLICY, ANONYMOUS, "X")

    detail = etree.fromstring(f"<d>{caught.value.detail_xml}</d>")
    assert detail[0].get("anonymous") == "true"


def test_group_lists_are_case_insensitive_and_deduplicated() -> None:
    assert split_groups(" Alarm-Publishers, alarm-publishers ,,ops") == ("alarm-publishers", "ops")


def test_subscribing_to_a_subtree_needs_permission_on_every_topic_below() -> None:
    # ALL allows anonymous subscriptions, ALL:ALARM does not: ALL covers ALL:ALARM.
    with pytest.raises(errors.NotAuthorized) as caught:
        check_subscribe_expression(ALARMS, expr("ALL"), ANONYMOUS)

    assert "'ALL:ALARM'" in caught.value.message
    check_subscribe_expression(ALARMS, expr("ALL:OPEN"), ANONYMOUS)
    check_subscribe_expression(ALARMS, expr("ALL:ALARM"), SUBSCRIBER)


def test_a_wildcard_is_judged_at_its_concrete_prefix_and_every_topic_it_covers() -> None:
    check_subscribe_expression(ALARMS, expr("ALL/ALARM//*", ns.DIALECT_FULL), SUBSCRIBER)
    with pytest.raises(errors.NotAuthorized):
        check_subscribe_expression(ALARMS, expr("ALL//*", ns.DIALECT_FULL), ANONYMOUS)
    with pytest.raises(errors.NotAuthorized):
        check_subscribe_expression(ALARMS, expr("ALL/ALARM//*", ns.DIALECT_FULL), PUBLISHER)


def test_a_wildcard_without_concrete_prefix_is_judged_at_the_top_of_the_tree() -> None:
    # //ALARM1 matches only topics SUBSCRIBER may read today, but could match future roots.
    with pytest.raises(errors.NotAuthorized) as caught:
        check_subscribe_expression(ALARMS, expr("//ALARM1", ns.DIALECT_FULL), SUBSCRIBER)

    assert "//ALARM1" in caught.value.message
    with pytest.raises(errors.NotAuthorized):
        check_subscribe_expression(ALARMS, None, SUBSCRIBER)


def test_admins_may_subscribe_to_everything() -> None:
    check_subscribe_expression(ALARMS, None, ADMIN)
    check_subscribe_expression(ALARMS, expr("//*", ns.DIALECT_FULL), ADMIN)
    check_subscribe_expression(ALARMS, expr("SECRET"), ADMIN)


def test_each_alternative_of_a_union_must_be_allowed() -> None:
    with pytest.raises(errors.NotAuthorized) as caught:
        check_subscribe_expression(ALARMS, expr("ALL/OPEN|SECRET", ns.DIALECT_FULL), ANONYMOUS)

    assert "'SECRET'" in caught.value.message
