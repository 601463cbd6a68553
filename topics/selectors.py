"""Reads of the topic tree, kept in memory and rebuilt when its shared version moves."""

from __future__ import annotations

import time

from hpwsn_site import state
from topics.models import Topic
from topics.tree import TopicNode, TopicTree

_cache: dict[str, object] = {"tree": None, "version": None, "checked": 0.0}


def _load() -> TopicTree:
    rows = list(Topic.objects.values_list("id", "path", "namespace", "parent_id"))
    root_ns = {path: ns for _id, path, ns, parent in rows if parent is None}
    nodes = []
    for topic_id, path, _ns, _parent in rows:
        names = tuple(path.split(":"))
        nodes.append(
            TopicNode(id=topic_id, names=names, root_namespace=root_ns.get(names[0]) or None)
        )
    return TopicTree(nodes)


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
