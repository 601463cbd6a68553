"""Topic expressions indexed by their steps, so a lookup never scans them. Pure Python.

`PatternTrie` files every path pattern of the wildcard (Full dialect) subscriptions under its
steps: patterns that begin alike share nodes, a `/x` step is an entry of its node's `plain`
table under `x`, a `//x` step one of its `desc` table, `*` and `.` are entries under those
names. Finding the patterns that cover a topic runs the patterns as one automaton over the
topic's names: at each name it looks up that name and `*` in the tables of the nodes it is at, so
the cost is the topic's depth times the nodes alive at once plus the matches, whatever the
number of patterns (thesis 4.4.6: matching independent of the size of the tree and of the
subscriptions).

`steps_advance` runs one pattern the same way over the topic tree (topics/acl.py), a name at a
time. Both follow `hpwsn.topicexpr._match` exactly; tests/topics/test_trie.py checks them
against it over random patterns and topics.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from hpwsn.topicexpr import ANY, SELF, PathPattern, Step


def root_constraint(pattern: PathPattern) -> str | None:
    """The namespace a pattern's first step asks of a root (None: any)."""
    if pattern.any_namespace:
        return None
    return pattern.steps[0].namespace


def ns_ok(constraint: str | None, root_ns: str | None) -> bool:
    # A root that declares no namespace matches an expression in any namespace.
    return constraint is None or root_ns is None or constraint == root_ns


class _Node:
    __slots__ = ("desc", "edge", "keys", "memo", "parent", "plain")

    def __init__(self, parent: _Node | None, edge: tuple[bool, str, str | None]) -> None:
        # Edges by name; at the top node also by the namespace the first step asks for.
        self.plain: dict[str, dict[str | None, _Node]] = {}
        self.desc: dict[str, dict[str | None, _Node]] = {}
        self.keys: dict[Hashable, None] = {}  # patterns that end here (insertion ordered)
        # What a caller derives from `keys` (topics/tree.py: their values), kept until they change.
        self.memo: tuple[object, ...] | None = None
        self.parent = parent
        self.edge = edge  # (descendant, name, namespace) from the parent

    def empty(self) -> bool:
        return not (self.keys or self.plain or self.desc)


class PatternTrie:
    """Path patterns by key; `match(root_ns, names)` gives the keys of those covering a topic."""

    def __init__(self) -> None:
        self._top = _Node(None, (False, "", None))
        self._ends: dict[Hashable, list[_Node]] = {}
        self._selfs = 0  # patterns with a `.` step
        self.shared = 0  # keys with more than one pattern: their nodes may hold the same key

    def __len__(self) -> int:
        return len(self._ends)

    def add(self, key: Hashable, patterns: Iterable[PathPattern]) -> None:
        ends = self._ends.setdefault(key, [])
        self.shared -= len(ends) > 1
        for pattern in patterns:
            self._selfs += any(step.name == SELF for step in pattern.steps)
            node = self._top
            constraint = root_constraint(pattern)
            for i, step in enumerate(pattern.steps):
                c = constraint if i == 0 else None
                table = node.desc if step.descendant else node.plain
                by_ns = table.setdefault(step.name, {})
                child = by_ns.get(c)
                if child is None:
                    child = by_ns[c] = _Node(node, (step.descendant, step.name, c))
                node = child
            node.keys[key] = None
            node.memo = None
            ends.append(node)
        self.shared += len(ends) > 1

    def nodes(self) -> Iterable[_Node]:
        """Every node some pattern ends at (once each)."""
        return dict.fromkeys(node for ends in self._ends.values() for node in ends)

    def remove(self, key: Hashable) -> None:
        ends = self._ends.pop(key, [])
        self.shared -= len(ends) > 1
        for node in ends:
            self._selfs -= _has_self(node)
            node.keys.pop(key, None)
            node.memo = None
            # Drop the nodes nothing ends at or passes through any more (churn of unique names
            # would otherwise grow the trie for ever).
            while node.parent is not None and node.empty():
                descendant, name, c = node.edge
                table = node.parent.desc if descendant else node.parent.plain
                by_ns = table.get(name, {})
                if by_ns.get(c) is not node:
                    break  # unlinked already (two alternatives ending at one node)
                del by_ns[c]
                if not by_ns:
                    del table[name]
                node = node.parent

    def match(self, root_ns: str | None, names: tuple[str, ...]) -> list[Hashable]:
        """Keys of the patterns that select the topic or one of its ancestors."""
        found: dict[Hashable, None] = {}
        for node in self.match_nodes(root_ns, names):
            found.update(node.keys)
        return list(found)

    def match_nodes(self, root_ns: str | None, names: tuple[str, ...]) -> list[_Node]:
        """The nodes whose keys select the topic or one of its ancestors, each once. A key is
        at one of them only, unless `shared` (a key of several patterns).

        No node is alive twice at one name: each has one edge from one parent, and a parent's
        `//` table is followed once a name however often the parent was reached. Past the first
        name no namespace is checked (only a step meeting the root is held to one), so the
        tables are read inline there: a first lookup is this walk, a name at a time.
        """
        found: dict[_Node, None] = {}
        active: list[_Node] = [self._top]
        loops: dict[_Node, dict[str, dict[str | None, _Node]]] = {}  # `//` tables kept open
        sticky: set[_Node] = set()  # reached through `//.`: alive at every later position
        for i, name in enumerate(names):
            nxt: list[_Node] = []
            for node in active:
                if node.desc:
                    loops[node] = node.desc
                if not node.plain:
                    continue
                if i == 0:
                    _follow(node.plain, name, root_ns, nxt)
                    continue
                by_ns = node.plain.get(name)
                if by_ns is not None:
                    nxt.extend(by_ns.values())
                by_ns = node.plain.get(ANY)
                if by_ns is not None:
                    nxt.extend(by_ns.values())
            for table in loops.values():
                if i == 0:
                    _follow(table, name, root_ns, nxt)
                    continue
                by_ns = table.get(name)
                if by_ns is not None:
                    nxt.extend(by_ns.values())
                by_ns = table.get(ANY)
                if by_ns is not None:
                    nxt.extend(by_ns.values())
            if self._selfs:  # only patterns with `.` steps need the closure
                closed: set[_Node] = set()
                for node in (*nxt, *sticky):
                    self._closure(node, closed, sticky)
                nxt = list(closed)
            active = nxt
            for node in active:
                if node.keys:
                    found[node] = None
        return list(found)

    @staticmethod
    def _closure(node: _Node, into: set[_Node], sticky: set[_Node]) -> None:
        # `.` selects the node itself; `//.` the node and every descendant of it.
        stack = [node]
        while stack:
            n = stack.pop()
            if n in into:
                continue
            into.add(n)
            for child in n.plain.get(SELF, {}).values():
                stack.append(child)
            for child in n.desc.get(SELF, {}).values():
                sticky.add(child)
                stack.append(child)


def _has_self(node: _Node) -> bool:
    """Whether the path from the top to this node has a `.` step."""
    at: _Node | None = node
    while at is not None and at.parent is not None:
        if at.edge[1] == SELF:
            return True
        at = at.parent
    return False


def _follow(
    table: dict[str, dict[str | None, _Node]], name: str, root_ns: str | None, into: list[_Node]
) -> None:
    """The first name: an edge is followed when its namespace admits the root's."""
    for key in (name, ANY):
        by_ns = table.get(key)
        if by_ns is None:
            continue
        for c, child in by_ns.items():
            if ns_ok(c, root_ns):  # topicexpr._ns_ok
                into.append(child)


# ---------------------------------------------------------------- one pattern over the tree


def _closure_states(steps: tuple[Step, ...], states: Iterable[int]) -> frozenset[int]:
    out: set[int] = set()
    stack = list(states)
    while stack:
        si = stack.pop()
        if si in out:
            continue
        out.add(si)
        if si < len(steps) and steps[si].name == SELF:
            stack.append(si + 1)
    return frozenset(out)


def steps_start(pattern: PathPattern) -> frozenset[int]:
    """The states of a pattern before any name (indexes of the step to match next)."""
    return _closure_states(pattern.steps, (0,))


def steps_advance(
    pattern: PathPattern, states: frozenset[int], name: str, depth: int, root_ns: str | None
) -> frozenset[int]:
    """The states after the name at `depth` (0: a root, whose namespace is `root_ns`)."""
    steps = pattern.steps
    nxt: list[int] = []
    constraint = root_constraint(pattern)
    for si in states:
        if si == len(steps):
            continue
        step = steps[si]
        if step.descendant:
            nxt.append(si)  # `//` may pass over this name
        if step.name == SELF:
            continue
        if (step.name == ANY or step.name == name) and (
            depth > 0 or si > 0 or ns_ok(constraint, root_ns)
        ):
            nxt.append(si + 1)
    return _closure_states(steps, nxt)


def steps_accept(pattern: PathPattern, states: frozenset[int]) -> bool:
    """Whether the pattern selects the topic these states were reached at."""
    return len(pattern.steps) in states


def steps_open(pattern: PathPattern, states: frozenset[int], children: Iterable[str]) -> bool:
    """Whether the pattern may still select a child not among `children` (one created later)."""
    steps = pattern.steps
    known: set[str] | None = None
    for si in states:
        if si == len(steps):
            continue
        step = steps[si]
        if step.descendant or step.name in (ANY, SELF):
            return True
        if known is None:
            known = set(children)
        if step.name not in known:
            return True
    return False
