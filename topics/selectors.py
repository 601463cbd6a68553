"""Reads of the topic tree, kept in memory and current by the change log (topics/changes.py)."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import Q

from hpwsn_site import state
from topics import changes
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


def _own_policy(values: tuple[Any, ...]) -> dict[str, object]:
    own = dict(zip(POLICY_FIELDS, values, strict=True))
    raw = str(own["retry_schedule"] or "")
    own["retry_schedule"] = tuple(float(x) for x in raw.split(",") if x.strip())
    for groups in ("publish_groups", "subscribe_groups"):
        own[groups] = split_groups(str(own[groups] or ""))
    return own


_ROW_FIELDS = ("id", "path", "namespace", *POLICY_FIELDS)
_UNSET = len(POLICY_FIELDS)


def _nodes(rows: list[tuple[Any, ...]], above: dict[tuple[str, ...], TopicNode]) -> list[TopicNode]:
    """Nodes of the rows (values of _ROW_FIELDS), parents first, each inheriting from its parent
    (in `above` or rows)."""
    # Parents before children, so one pass resolves every inherited policy.
    rows.sort(key=lambda row: row[1].count(":"))
    nodes: list[TopicNode] = []
    by_path = {node.path: node for node in above.values()}
    for row in rows:
        path = row[1]
        parent_path, _, name = path.rpartition(":")
        parent = by_path.get(parent_path) if parent_path else None
        # Share the parent's name strings (a million topics repeat few names).
        names = (*parent.names, name) if parent is not None else tuple(path.split(":"))
        values = row[3:]
        # Most topics set no policy of their own: NULL or "" in every policy column.
        if values.count(None) + values.count("") == _UNSET:
            policy = parent.policy if parent is not None else ROOT_POLICY
        else:
            policy = (parent.policy if parent else ROOT_POLICY).inherit(_own_policy(values))
        node = TopicNode(
            id=row[0],
            names=names,
            root_namespace=parent.root_namespace if parent else (row[2] or None),
            policy=policy,
        )
        above[names] = by_path[path] = node
        nodes.append(node)
    return nodes


def _load() -> TopicTree:
    rows = list(Topic.objects.values_list(*_ROW_FIELDS))
    return TopicTree(_nodes(rows, {}))


# The query of one topic's subtree, compiled once per database: a process applying a topic change
# spent more on the ORM's compilation of it than on the query itself (as for subscriptions,
# subscriptions/selectors.py). The values it selects need no conversion.
_SUBTREE_SQL: dict[str, str] = {}


def _subtree_rows(path: str) -> list[tuple[Any, ...]]:
    sql = _SUBTREE_SQL.get(connection.vendor)
    if sql is None:
        query = (
            Topic.objects.filter(Q(path=path) | Q(path__startswith=path + ":"))
            .order_by()
            .values_list(*_ROW_FIELDS)
            .query
        )
        sql = _SUBTREE_SQL[connection.vendor] = query.sql_with_params()[0]
    # The parameters as the ORM makes them: the path, and the pattern of `startswith`.
    like = f"{connection.ops.prep_for_like_query(path + ':')}%"
    with connection.cursor() as cursor:
        cursor.execute(sql, [path, like])
        return [tuple(row) for row in cursor.fetchall()]


def _apply(tree: TopicTree, paths: list[str], _carried: dict[str, str]) -> bool:
    """Load again the subtrees of these topics (created, edited, moved away or deleted)."""
    for path in sorted(paths, key=lambda p: p.count(":")):
        names = tuple(path.split(":"))
        rows = _subtree_rows(path)
        above: dict[tuple[str, ...], TopicNode] = {}
        if len(names) > 1:
            parent = tree.by_names.get(names[:-1])
            if parent is None and rows:
                return False  # its parent is unknown here: this tree missed something
            if parent is not None:
                above[parent.names] = parent
        before = tree.subtree(names)
        nodes = _nodes(rows, above)
        if any(len(n.names) > 1 and n.names[:-1] not in above for n in nodes):
            return False
        # Replace first, then remove: a reader on another thread never misses a topic that stays.
        for node in nodes:
            tree.put(node)
        kept = {n.names for n in nodes}
        for gone in reversed(before):
            if gone not in kept:
                tree.drop(gone)
    return True


_tree = changes.ChangeFeed(
    kind=changes.TOPIC, version_key=state.VERSION_TOPICS, build=_load, apply=_apply
)


def topic_tree(*, max_age: float = 1.0) -> TopicTree:
    """The process's topic tree, with the changes of the log applied (checked each max_age s)."""
    return _tree.get(max_age=max_age)


def topic_tree_cached() -> TopicTree | None:
    """The tree as last loaded, without any I/O (for the async hot path)."""
    return _tree.peek()


def topic_tree_is_fresh(*, max_age: float = 1.0) -> bool:
    return _tree.is_fresh(max_age=max_age)
