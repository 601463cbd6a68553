"""The in-memory topic tree and subscription matcher. Pure Python: no Django imports.

Matching cost does not depend on the number of topics: a topic's subscribers are the exact
subscribers of its ancestors-or-self (a walk of at most 16 dict lookups) plus the wildcard
subscriptions that cover it, memoised per topic until the index is rebuilt.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, replace

from hpwsn.topicexpr import TopicExpression


@dataclass(frozen=True, slots=True)
class Policy:
    """A topic's effective policy: its own settings over those inherited from its ancestors."""

    reliability: str = "reliable"
    ordered: bool = True
    retry_schedule: tuple[float, ...] = ()  # empty: the broker's default schedule
    priority: int = 4
    ttl_seconds: int = 0  # 0: kept for the broker's retention period
    fragment_size: int = 0  # 0: never split
    partial_delivery: bool = False
    auto_create_children: bool = False
    # Access control (topics.acl). Secure by default: at the top of the tree nobody but the
    # admins may publish or subscribe until a topic's policy says who may.
    publish_groups: tuple[str, ...] = ()  # "*" = any authenticated principal
    subscribe_groups: tuple[str, ...] = ()
    anonymous_publish: bool = False
    anonymous_subscribe: bool = False
    # WS-BrokeredNotification: Notify only from a publisher registered for the topic.
    require_registration: bool = False

    def inherit(self, own: dict[str, object]) -> Policy:
        """This policy with the values a child sets itself (None / "" / () mean inherit)."""
        changes = {k: v for k, v in own.items() if v not in (None, "", ())}
        return replace(self, **changes) if changes else self  # type: ignore[arg-type]


ROOT_POLICY = Policy()


@dataclass(frozen=True, slots=True)
class TopicNode:
    id: int
    names: tuple[str, ...]
    root_namespace: str | None
    policy: Policy = ROOT_POLICY

    @property
    def path(self) -> str:
        return ":".join(self.names)


class TopicTree:
    def __init__(self, nodes: Iterable[TopicNode]) -> None:
        self.by_names: dict[tuple[str, ...], TopicNode] = {n.names: n for n in nodes}

    def __len__(self) -> int:
        return len(self.by_names)

    def resolve(
        self, root_ns: str | None, names: tuple[str, ...], any_ns: bool
    ) -> TopicNode | None:
        """The node an concrete expression names, honouring the root's namespace."""
        node = self.by_names.get(names)
        if node is None:
            return None
        if any_ns or node.root_namespace is None or root_ns in (None, node.root_namespace):
            # An unprefixed name (root_ns None) selects the root by name whatever its namespace.
            return node
        return None

    def get(self, path: str) -> TopicNode | None:
        return self.by_names.get(tuple(path.split(":")))

    def nearest_existing(self, names: tuple[str, ...]) -> TopicNode | None:
        """The deepest existing ancestor of a topic that does not exist (auto-create)."""
        for k in range(len(names) - 1, 0, -1):
            node = self.by_names.get(names[:k])
            if node is not None:
                return node
        return None


class Matcher:
    """Maps topics to the keys of the subscriptions that cover them."""

    def __init__(self) -> None:
        self._exact: dict[tuple[str, ...], list[Hashable]] = {}
        self._wild: list[tuple[Hashable, TopicExpression]] = []
        self._memo: dict[tuple[str | None, tuple[str, ...]], tuple[Hashable, ...]] = {}

    def add(
        self, key: Hashable, expression: TopicExpression, exact: tuple[str, ...] | None
    ) -> None:
        if exact is not None:
            self._exact.setdefault(exact, []).append(key)
        else:
            self._wild.append((key, expression))
        self._memo.clear()

    def match(self, root_ns: str | None, names: tuple[str, ...]) -> tuple[Hashable, ...]:
        memo_key = (root_ns, names)
        found = self._memo.get(memo_key)
        if found is None:
            keys: list[Hashable] = []
            for k in range(1, len(names) + 1):
                keys.extend(self._exact.get(names[:k], ()))
            keys.extend(key for key, expr in self._wild if expr.covers(root_ns, names))
            found = tuple(dict.fromkeys(keys))
            if len(self._memo) > 200_000:
                self._memo.clear()
            self._memo[memo_key] = found
        return found
