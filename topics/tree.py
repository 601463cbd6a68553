"""The in-memory topic tree and subscription matcher. Pure Python: no Django imports.

Matching cost does not depend on the number of topics nor on the number of subscriptions: a
topic's subscribers are the exact subscribers of its ancestors-or-self (a walk of at most 16 dict
lookups) plus the wildcard subscriptions whose patterns the trie (topics/trie.py) finds for it,
memoised per topic. A change forgets the memo of the topics it may affect only.

Both are changed in place, a node or a subscription at a time, as the change log
(topics/changes.py) tells every process what changed.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any

from hpwsn.topicexpr import ANY, SELF, Step, TopicExpression
from topics.trie import PatternTrie


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


Names = tuple[str, ...]
# What decides who may subscribe at a topic (topics.acl.may_subscribe).
Rule = tuple[tuple[str, ...], bool]


def subscribe_rule(policy: Policy) -> Rule:
    return (policy.subscribe_groups, policy.anonymous_subscribe)


class TopicTree:
    """The topics by their names, with what the access check needs to skip whole subtrees.

    A *boundary* is a topic whose subscribe rule differs from its parent's (a root: from the top
    of the tree's). Every topic has the rule of its nearest boundary ancestor-or-self, so a
    subtree without a boundary below its top is uniform. `marked(names)` lists the children of a
    topic that are boundaries or have one below; topics/acl.py walks only those.
    """

    def __init__(self, nodes: Iterable[TopicNode] = ()) -> None:
        self.by_names: dict[Names, TopicNode] = {}
        self._kids: dict[Names, dict[str, None]] = {}  # () holds the roots
        self._boundaries: set[Names] = set()  # as counted when each was put
        self._bcount: dict[Names, int] = {}  # boundaries in the subtree, where any
        self._marks: dict[Names, dict[str, None]] = {}  # children with _bcount > 0
        for node in sorted(nodes, key=lambda n: len(n.names)):
            self.put(node)

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

    # ------------------------------------------------------------ structure

    def children(self, names: Names) -> dict[str, None]:
        """Names of the children of a topic (of the roots for `()`)."""
        return self._kids.get(names, {})

    def marked(self, names: Names) -> dict[str, None]:
        """Children of a topic (roots for `()`) that are boundaries or have one below."""
        return self._marks.get(names, {})

    def is_boundary(self, node: TopicNode) -> bool:
        parent = self.by_names.get(node.names[:-1]) if len(node.names) > 1 else None
        above = parent.policy if parent is not None else ROOT_POLICY
        if node.policy is above:  # inherited whole: most topics of a large tree
            return False
        return subscribe_rule(node.policy) != subscribe_rule(above)

    def subtree(self, names: Names) -> list[Names]:
        """The names of a topic and of every descendant, parents first."""
        if names not in self.by_names:
            return []
        out = [names]
        for names_ in out:
            out.extend((*names_, kid) for kid in self._kids.get(names_, ()))
        return out

    def put(self, node: TopicNode) -> None:
        """Add or replace a node; its parent must be in the tree already (or it is a root)."""
        names = node.names
        parent = names[:-1]
        old = self.by_names.get(names)
        self.by_names[names] = node
        if old is None:
            self._kids.setdefault(parent, {})[names[-1]] = None
        boundary = self.is_boundary(node)
        if boundary != (names in self._boundaries):
            if boundary:
                self._boundaries.add(names)
            else:
                self._boundaries.discard(names)
            self._count(names, +1 if boundary else -1)

    def drop(self, names: Names) -> None:
        """Remove a leaf (drop a subtree deepest first)."""
        node = self.by_names.get(names)
        if node is None:
            return
        if names in self._boundaries:
            self._boundaries.discard(names)
            self._count(names, -1)
        del self.by_names[names]
        self._kids.pop(names, None)
        parent = names[:-1]
        kids = self._kids.get(parent)
        if kids is not None:
            kids.pop(names[-1], None)
            if not kids:
                del self._kids[parent]

    def _count(self, names: Names, delta: int) -> None:
        for k in range(len(names), 0, -1):
            prefix = names[:k]
            n = self._bcount.get(prefix, 0) + delta
            if n > 0:
                self._bcount[prefix] = n
            else:
                self._bcount.pop(prefix, None)
            if (n > 0) != (n - delta > 0):  # the prefix became marked, or stopped being
                marks = self._marks.setdefault(prefix[:-1], {})
                if n > 0:
                    marks[prefix[-1]] = None
                else:
                    marks.pop(prefix[-1], None)
                    if not marks:
                        del self._marks[prefix[:-1]]


MemoKey = tuple[str | None, Names]


class Matches(Sequence[Any]):
    """What a lookup found: the shared tuples of the places that cover the topic, read through
    without being copied into one (a first lookup then costs no work per match)."""

    __slots__ = ("_groups", "_len")

    def __init__(self, groups: tuple[tuple[Any, ...], ...]) -> None:
        self._groups = groups
        self._len = -1  # counted when first asked: a first lookup need not touch every group

    def __len__(self) -> int:
        if self._len < 0:
            self._len = sum(map(len, self._groups))
        return self._len

    def __iter__(self) -> Iterator[Any]:
        return chain.from_iterable(self._groups)

    def __getitem__(self, i: Any) -> Any:
        return tuple(self)[i]

    def __repr__(self) -> str:
        return f"Matches({tuple(self)!r})"


# The memo: what each topic matched (the groups of a `Matches`), by its root's namespace and its
# path, with the count of forgets it was made after. A forget does not look for the topics it
# covers: it stamps its prefix in a tree of the prefixes forgotten (`_Forgot`, a dict of names
# whose key None, never a name, holds the count at its last forget), and a topic's entry holds
# only if no prefix of its path was stamped after it was made. Python's cyclic collector runs
# after a number of new objects, and its runs are what a first lookup's tail is made of: the
# entry's key is a string and its count an int, which the collector does not count, so a first
# lookup leaves one object, its groups (a tree of names left one dict per new name above the
# topic as well, twice as many runs). The `Matches` answered is made anew at each lookup and
# lives as long as its caller holds it.
_Forgot = dict[str | None, Any]


class _Place(dict[str, "_Place"]):
    """The concrete subscriptions of a topic, in a tree of names: a node is the table of its
    children by name, so a lookup reads one entry a name of the topic."""

    __slots__ = ("filed", "memo")

    def __init__(self) -> None:
        super().__init__()
        self.filed: dict[Hashable, None] = {}  # the keys filed at this topic
        self.memo: tuple[Any, ...] | None = None  # the values of `filed`, until they change

    def places(self) -> Iterator[_Place]:
        """This node and every node below it that keys are filed at."""
        stack = [self]
        while stack:
            node = stack.pop()
            if node.filed:
                yield node
            stack.extend(node.values())


class Matcher:
    """Maps topics to the keys of the subscriptions that cover them.

    With `resolve`, a match gives the values of the keys (resolve(key)) rather than the keys,
    and the memo holds those: a topic met again costs one entry of the memo and a look at the
    prefixes forgotten since, however many match. The caller changes a key's value only between
    its remove() and add(), which forget the memo of every topic the key covers.
    """

    MEMO_MAX = 200_000
    FORGOT_MAX = 20_000  # prefixes stamped before the memo starts again

    def __init__(self, resolve: Callable[[Any], Any] | None = None) -> None:
        self._resolve = resolve
        self._exact = _Place()
        self._wild = PatternTrie()
        self._placed: dict[Hashable, tuple[TopicExpression, Names | None]] = {}
        # By the namespace of the topic's root: its entries by path, and the count of forgets each
        # was made after (one pair, so that a memo started again meanwhile is never half read).
        self._memo: dict[str | None, tuple[dict[str, tuple[Any, ...]], dict[str, int]]] = {}
        self._memo_size = 0
        self._forgets = 0
        self._cleared = 0  # the count of forgets when the memo last started again
        self._forgot: _Forgot = {}
        self._forgot_size = 0

    def __len__(self) -> int:
        return len(self._placed)

    def add(
        self, key: Hashable, expression: TopicExpression, exact: tuple[str, ...] | None
    ) -> None:
        if key in self._placed:
            self.remove(key)
        self._placed[key] = (expression, exact)
        if exact is not None:
            place = self._exact
            for name in exact:
                nxt = place.get(name)
                if nxt is None:
                    nxt = place[name] = _Place()
                place = nxt
            place.filed[key] = None
            place.memo = None
        else:
            self._wild.add(key, expression.patterns)
        self._forget(expression, exact)

    def remove(self, key: Hashable) -> None:
        placed = self._placed.pop(key, None)
        if placed is None:
            return
        expression, exact = placed
        if exact is not None:
            path = [self._exact]
            for name in exact:
                path.append(path[-1][name])
            place = path.pop()
            del place.filed[key]
            place.memo = None
            # Drop the places nothing is filed at or under any more (churn of unique topics
            # would otherwise grow the tree for ever).
            for name in reversed(exact):
                if place.filed or place:
                    break
                place = path.pop()
                del place[name]
        else:
            self._wild.remove(key)
        self._forget(expression, exact)

    def prime(self) -> None:
        """Resolve the values of every place keys are filed at now, and work out the pattern
        trie's states, so that the first lookups after a build do neither (a change later
        resolves only the place and the states it touches, when next looked up)."""
        for place in self._exact.places():
            place.memo = self._values(place.filed)
        for node in self._wild.nodes():
            node.memo = self._values(node.keys)
        self._wild.prime()

    def match(self, root_ns: str | None, names: tuple[str, ...]) -> Matches:
        path = ":".join(names)
        tables = self._memo.get(root_ns)
        if tables is not None:
            found = tables[0].get(path)
            if found is not None and self._holds(names, tables[1].get(path, -1)):
                return Matches(found)
        made = self._forgets  # before the walk: a forget meanwhile makes the entry stale
        nodes = self._wild.match_nodes(root_ns, names)
        if self._wild.shared and len(nodes) > 1:  # a key of several patterns: count it once
            keys: dict[Hashable, None] = {}
            place: _Place | None = self._exact
            for name in names:
                place = place.get(name)  # type: ignore[union-attr]
                if place is None:
                    break
                keys.update(place.filed)
            for node in nodes:
                keys.update(node.keys)
            groups: tuple[tuple[Any, ...], ...] = (self._values(keys),)
        else:
            groups = tuple(self._groups(names, nodes))
        self._remember(root_ns, path, groups, made)
        return Matches(groups)

    def _groups(self, names: Names, nodes: list[Any]) -> list[tuple[Any, ...]]:
        """The values of the keys at each place a key is filed at that covers the topic (an
        exact ancestor-or-self, a node of the trie), kept per place until its keys change: a
        first lookup joins a few shared tuples instead of resolving every match."""
        groups: list[tuple[Any, ...]] = []
        place: _Place | None = self._exact
        for name in names:
            place = place.get(name)  # type: ignore[union-attr]
            if place is None:
                break
            if place.filed:
                if place.memo is None:
                    place.memo = self._values(place.filed)
                groups.append(place.memo)
        for node in nodes:
            if node.memo is None:
                node.memo = self._values(node.keys)
            groups.append(node.memo)
        return groups

    def _values(self, keys: Iterable[Hashable]) -> tuple[Any, ...]:
        return tuple(keys) if self._resolve is None else tuple(map(self._resolve, keys))

    def _holds(self, names: Names, made: int) -> bool:
        """Whether the memo did not start again, nor any prefix of the topic was forgotten, after
        its entry was made."""
        if made < self._cleared:
            return False
        node: Any = self._forgot
        for name in names:
            node = node.get(name)
            if node is None:
                return True
            if node[None] > made:
                return False
        return True

    def _remember(
        self, root_ns: str | None, path: str, groups: tuple[tuple[Any, ...], ...], made: int
    ) -> None:
        if self._memo_size >= self.MEMO_MAX:
            self._memo_clear()
        if made < self._cleared:  # computed before the memo started again: it would not hold
            return
        tables = self._memo.get(root_ns)
        if tables is None:
            tables = self._memo[root_ns] = ({}, {})
        entries, made_at = tables
        if path not in entries:
            self._memo_size += 1
        made_at[path] = made
        entries[path] = groups

    def _memo_clear(self) -> None:
        self._memo, self._memo_size = {}, 0
        self._forgot, self._forgot_size = {}, 0
        self._forgets += 1
        self._cleared = self._forgets

    def _forget(self, expression: TopicExpression, exact: Names | None) -> None:
        """Forget the memo of every topic the subscription may cover.

        A concrete one covers the subtree of its topic; a pattern one lies under the names its
        steps begin with (ALL:ALARM for ALL/ALARM//*). Each such prefix is stamped with a new
        count of forgets, and an entry made before it no longer holds. A pattern that begins
        with `*` or `//` can cover any topic, so it forgets the whole memo, as does a tree of
        prefixes grown past FORGOT_MAX (churn over many topics).
        """
        if not self._memo_size:  # nothing to forget (a build); a lookup under way keeps nothing
            self._forgets += 1
            self._cleared = self._forgets
            return
        prefixes = (
            [exact] if exact is not None else [fixed_names(p.steps) for p in expression.patterns]
        )
        if not all(prefixes) or self._forgot_size >= self.FORGOT_MAX:
            self._memo_clear()
            return
        self._forgets += 1
        for prefix in prefixes:
            node = self._forgot
            for name in prefix:
                nxt = node.get(name)
                if nxt is None:
                    nxt = node[name] = {None: 0}
                    self._forgot_size += 1
                node = nxt
            node[None] = self._forgets


def fixed_names(steps: Iterable[Step]) -> Names:
    """The names a pattern's leading `/name` steps spell: every topic it selects lies in their
    subtree (empty when it begins with `*` or `//`)."""
    out: list[str] = []
    for step in steps:
        if step.descendant or step.name in (ANY, SELF):
            break
        out.append(step.name)
    return tuple(out)
