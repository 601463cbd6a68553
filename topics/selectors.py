"""Reads of the topic tree, kept in memory and rebuilt when its shared version moves."""

from __future__ import annotations

import time
from typing import Any

from hpwsn_site import state
from topics.models import Topic
from topics.tree import ROOT_POLICY, TopicNode, TopicTree

_cache: dict[str, object] = {"tree": None, "version": None, "checked": 0.0}


POLICY_FIELDS = (
    "reliability",
    "ordered",
    "retry_schedule",
    "priority",
    "ttl_seconds",
    "fragment_size",
    "partial_delivery",
    "auto_create_children",
)


def _own_policy(row: dict[str, Any]) -> dict[str, object]:
    own = {f: row[f] for f in POLICY_FIELDS}
    raw = str(own["retry_schedule"] or "")
    own["retry_schedule"] = tuple(float(x) for x in raw.split(",") if x.strip())
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


def topic_tree(*, max_age: float = 1.0) -> TopicTree:
    """The process's topic tree, reloaded when the shared version moved (checked each max_age s)."""
    now = time.monotonic()
    tree = _cache["tree"]
    if tree is None or now - float(_cache["checked"]) >= max_age:  # type: ignore[arg-type]
        version = state.get_redis().get(state.VERSION_TOPICS)
        if tree is None or version != _cache["version"]:
            # Read the version first: a change racing with the load bumps it again and reloads.
            _cache["tree"] = tree = _load()
            _cache["version"] = version
        _cache["checked"] = now
    assert isinstance(tree, TopicTree)
    return tree


def topic_tree_cached() -> TopicTree | None:
    """The tree as last loaded, without any I/O (for the async hot path)."""
    tree = _cache["tree"]
    return tree if isinstance(tree, TopicTree) else None


def topic_tree_is_fresh(*, max_age: float = 1.0) -> bool:
    return time.monotonic() - float(_cache["checked"]) < max_age  # type: ignore[arg-type]
