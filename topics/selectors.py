"""Reads of the topic tree, kept in memory and rebuilt when its shared version moves."""

from __future__ import annotations

from typing import Any

from hpwsn_site import state
from topics.acl import split_groups
from topics.models import Topic
from topics.tree import ROOT_POLICY, TopicNode, TopicTree

POLICY_FIELDS = (
    "reliability",
    "ordered",
    "retry_schedule",
    "priority",
    "ttl_seconds",
    "fragment_size",
    "partial_delivery",
    "auto_create_children",
    "publish_groups",
    "subscribe_groups",
    "anonymous_publish",
    "anonymous_subscribe",
    "require_registration",
)
BOOL_POLICY_FIELDS = frozenset(
    {
        "ordered",
        "partial_delivery",
        "auto_create_children",
        "anonymous_publish",
        "anonymous_subscribe",
        "require_registration",
    }
)


def _own_policy(row: dict[str, Any]) -> dict[str, object]:
    own = {f: row[f] for f in POLICY_FIELDS}
    raw = str(own["retry_schedule"] or "")
    own["retry_schedule"] = tuple(float(x) for x in raw.split(",") if x.strip())
    for groups in ("publish_groups", "subscribe_groups"):
        own[groups] = split_groups(str(own[groups] or ""))
    return own


def _load() -> TopicTree:
    rows = list(Topic.objects.values("id", "path", "namespace", *POLICY_FIELDS))
    # Parents before children, so one pass resolves every inherited policy.
    rows.sort(key=lambda row: str(row["path"]).count(":"))
    by_names: dict[tuple[str, ...], TopicNode] = {}
    for row in rows:
        names = tuple(str(row["path"]).split(":"))
        parent = by_names.get(names[:-1])
        by_names[names] = TopicNode(
            id=int(row["id"]),
            names=names,
            root_namespace=parent.root_namespace if parent else (row["namespace"] or None),
            policy=(parent.policy if parent else ROOT_POLICY).inherit(_own_policy(row)),
        )
    return TopicTree(by_names.values())


_tree = state.VersionedCache(state.VERSION_TOPICS, _load)


def topic_tree(*, max_age: float = 1.0) -> TopicTree:
    """The process's topic tree, reloaded when the shared version moved (checked each max_age s)."""
    return _tree.get(max_age=max_age)


def topic_tree_cached() -> TopicTree | None:
    """The tree as last loaded, without any I/O (for the async hot path)."""
    return _tree.peek()


def topic_tree_is_fresh(*, max_age: float = 1.0) -> bool:
    return _tree.is_fresh(max_age=max_age)
