"""Topic expressions indexed by their steps, so a lookup never scans them. Pure Python.

`PatternTrie` files every path pattern of the wildcard (Full dialect) subscriptions under its
steps: patterns that begin alike share nodes, a `/x` step is an entry of its node's `plain`
table under `x`, a `//x` step one of its `desc` table, `*` and `.` are entries under those
names. Finding the patterns that cover a topic runs the patterns as one automaton over the
topic's names: at each name it looks up that name and `*` in the tables of the nodes it is at, so
the cost is the topic's depth times the nodes alive at once plus the matches, whatever the
number of patterns (thesis 4.4.6: matching independent of the size of the tree and of the
subscriptions). The automaton's states are kept (a lazy deterministic automaton, `_State`), so
a lookup reads one state a name: its cost is the topic's depth plus the matches.

`steps_advance` runs one pattern the same way over the topic tree (topics/acl.py), a name at a
time. Both follow `hpwsn.topicexpr._match` exactly; tests/topics/test_trie.py checks them
against it over random patterns and topics.
"""

from __future__ import annotations

import threading
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


class _State:
    """A state of the walk over a topic's names: the nodes alive after some names, and the
    nodes whose `//` tables are kept open. `keyed` are the alive nodes that patterns end at;
    `after` the state each name met so far leads to, among the names the tables hold (`names`),
    and `other` the state any other name leads to (through `*` edges only)."""

    __slots__ = ("active", "after", "keyed", "loops", "names", "other")

    def __init__(self, active: tuple[_Node, ...], loops: tuple[_Node, ...]) -> None:
        self.active = active
        self.loops = loops
        self.refresh()

    def refresh(self) -> None:
        """Forget what followed from its nodes' tables (one of them changed); the names they
        hold are read again when next needed (under the trie's lock)."""
        self.rekey()
        self.names: frozenset[str] | None = None
        self.after: dict[str, _State] = {}
        self.other: _State | None = None

    def held(self) -> frozenset[str]:
        """The names its tables hold."""
        if self.names is None:
            names = {name for node in self.active for name in node.plain}
            names.update(name for node in self.loops for name in node.desc)
            self.names = frozenset(names)
        return self.names

    def rekey(self) -> None:
        """The keys of one of its nodes changed."""
        self.keyed = tuple(node for node in self.active if node.keys)

    def nodes(self) -> set[_Node]:
        return {*self.active, *self.loops}

    def key(self) -> tuple[frozenset[_Node], frozenset[_Node]]:
        return _state_key(self.active, self.loops)


def _state_key(
    active: Iterable[_Node], loops: Iterable[_Node]
) -> tuple[frozenset[_Node], frozenset[_Node]]:
    """What a state is interned by: its nodes alive and its tables kept open, in any order."""
    return frozenset(active), frozenset(loops)


class _Walks:
    """The states lookups have met, interned by their nodes, and the states each node is in
    (a change of a node's tables or keys refreshes those, and only those)."""

    def __init__(self) -> None:
        self.states: dict[tuple[frozenset[_Node], frozenset[_Node]], _State] = {}
        self.starts: dict[str | None, _State] = {}  # by the root's namespace: the first name
        self.by_node: dict[_Node, set[_State]] = {}

    def file(self, state: _State) -> None:
        for node in state.nodes():
            self.by_node.setdefault(node, set()).add(state)

    def refresh(
        self, tables: Iterable[_Node], keys: Iterable[_Node], dropped: Iterable[_Node]
    ) -> None:
        """After a change: the states of the nodes whose tables changed start again, those of
        the nodes whose keys changed count them again, and those of the nodes gone are
        forgotten (no state reaches them any more)."""
        for node in dropped:
            for state in self.by_node.pop(node, ()):
                self.states.pop(state.key(), None)
                for other in state.nodes():
                    self.by_node.get(other, set()).discard(state)
        for node in keys:
            for state in self.by_node.get(node, ()):
                state.rekey()
        for node in tables:
            for state in self.by_node.get(node, ()):
                state.refresh()


class PatternTrie:
    """Path patterns by key; `match(root_ns, names)` gives the keys of those covering a topic."""

    MAX_STATES = 50_000  # past it, a lookup that meets a new state walks without them

    def __init__(self) -> None:
        self._top = _Node(None, (False, "", None))
        self._ends: dict[Hashable, list[_Node]] = {}
        self._selfs = 0  # patterns with a `.` step
        self.shared = 0  # keys with more than one pattern: their nodes may hold the same key
        # The walk's states met by lookups (match_nodes). A lookup that meets a new one, and a
        # change, hold the lock: the states are filed from a trie no change is halfway through.
        self._walks = _Walks()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._ends)

    def add(self, key: Hashable, patterns: Iterable[PathPattern]) -> None:
        with self._lock:
            self._add(key, patterns)

    def _add(self, key: Hashable, patterns: Iterable[PathPattern]) -> None:
        tables: set[_Node] = set()  # nodes given an edge
        keys: set[_Node] = set()
        ends = self._ends.setdefault(key, [])
        self.shared -= len(ends) > 1
        for pattern in patterns:
            self._selfs += any(step.name == SELF for step in pattern.steps)
            node = self._top
            constraint = root_constraint(pattern)
            for i, step in enumerate(pattern.steps):
                c = constraint if i == 0 else None
                table = node.desc if step.descendant else node.plain
                if step.descendant and not table:
                    # A `//` table opened: a state is told by the tables it keeps open, and the
                    # states this node was alive in on the way to them kept none of it.
                    self._walks = _Walks()
                by_ns = table.setdefault(step.name, {})
                child = by_ns.get(c)
                if child is None:
                    child = by_ns[c] = _Node(node, (step.descendant, step.name, c))
                    tables.add(node)
                node = child
            node.keys[key] = None
            node.memo = None
            keys.add(node)
            ends.append(node)
        self.shared += len(ends) > 1
        self._walks.refresh(tables, keys, ())

    def nodes(self) -> Iterable[_Node]:
        """Every node some pattern ends at (once each)."""
        return dict.fromkeys(node for ends in self._ends.values() for node in ends)

    def remove(self, key: Hashable) -> None:
        with self._lock:
            self._remove(key)

    def _remove(self, key: Hashable) -> None:
        tables: set[_Node] = set()  # nodes an edge was taken from
        keys: set[_Node] = set()
        dropped: list[_Node] = []
        ends = self._ends.pop(key, [])
        self.shared -= len(ends) > 1
        for node in ends:
            self._selfs -= _has_self(node)
            node.keys.pop(key, None)
            node.memo = None
            keys.add(node)
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
                dropped.append(node)
                node = node.parent
                tables.add(node)
        self._walks.refresh(tables, keys, dropped)

    def match(self, root_ns: str | None, names: tuple[str, ...]) -> list[Hashable]:
        """Keys of the patterns that select the topic or one of its ancestors."""
        found: dict[Hashable, None] = {}
        for node in self.match_nodes(root_ns, names):
            found.update(node.keys)
        return list(found)

    def match_nodes(self, root_ns: str | None, names: tuple[str, ...]) -> list[_Node]:
        """The nodes whose keys select the topic or one of its ancestors, each once. A key is
        at one of them only, unless `shared` (a key of several patterns).

        The walk's states are kept as lookups meet them (a lazy deterministic automaton): a
        state is the set of nodes alive after some names with the `//` tables kept open, and the
        state a name leads to is worked out once, then read in one step. Topics that differ only
        in names no pattern tells apart go through the same states, so a first lookup costs a
        read per name. A build works out every state (`prime`); a change works out again the
        states of the nodes whose tables it changed (and only counts again the keys of the
        states of a node whose keys it changed), and starts them all again when it opens a `//`
        table. Patterns with `.` steps keep the walk (`_walk`): their closure makes a state
        of more than its nodes.
        """
        if self._selfs or not names:
            return self._walk(root_ns, names)
        state = self._walks.starts.get(root_ns) or self._advance(root_ns, names, -1)
        found: list[_Node] = []
        for i, name in enumerate(names):
            if state is None:  # too many states: this lookup walks
                return self._walk(root_ns, names)
            if not (state.active or state.loops):
                break  # nothing alive: no later name selects anything
            nxt = state.after.get(name)
            if nxt is None:
                held = state.names  # None: not read again since a change
                nxt = state.other if held is not None and name not in held else None
            if nxt is None:
                nxt = self._advance(root_ns, names, i)
                if nxt is None:
                    return self._walk(root_ns, names)
            state = nxt
            found += state.keyed
        return list(dict.fromkeys(found)) if len(found) > 1 else found

    def _advance(self, root_ns: str | None, names: tuple[str, ...], i: int) -> _State | None:
        """The state the names up to `names[i]` lead to, with the states before it filed on the
        way (a lookup that meets a state not filed yet; under the lock, so that no change is
        halfway through)."""
        with self._lock:
            walks = self._walks
            state = walks.starts.get(root_ns)
            if state is None:
                top = self._top
                state = walks.starts[root_ns] = _State((top,), (top,) if top.desc else ())
                walks.file(state)
            for depth, name in enumerate(names[: i + 1]):
                mentioned = name in state.held()
                nxt = state.after.get(name) if mentioned else state.other
                if nxt is None:
                    if len(walks.states) >= self.MAX_STATES:
                        return None
                    nxt = self._step(walks, state, name, root_ns, depth == 0)
                    if mentioned:
                        state.after[name] = nxt
                    else:
                        state.other = nxt
                state = nxt
            return state

    def prime(self) -> None:
        """Work out every state the walk can reach, so that first lookups after a build read
        them: from the first name (for a root in no namespace and in each namespace a pattern
        asks of a root), each name a state's tables hold, and any other name."""
        if self._selfs:
            return
        with self._lock:
            walks = self._walks
            top = self._top
            namespaces: set[str | None] = {None}
            for table in (top.plain, top.desc):
                for by_ns in table.values():
                    namespaces.update(by_ns)
            todo: list[_State] = []
            for root_ns in namespaces:
                start = walks.starts.get(root_ns)
                if start is None:
                    start = walks.starts[root_ns] = _State((top,), (top,) if top.desc else ())
                    walks.file(start)
                todo += self._expand(walks, start, root_ns, True)
            seen = set(todo)
            while todo and len(walks.states) < self.MAX_STATES:
                for state in self._expand(walks, todo.pop(), None, False):
                    if state not in seen:
                        seen.add(state)
                        todo.append(state)

    def _expand(
        self, walks: _Walks, state: _State, root_ns: str | None, first: bool
    ) -> list[_State]:
        """File the state every name leads to from `state`; returns them."""
        for name in state.held():
            if name != ANY and name not in state.after:
                state.after[name] = self._step(walks, state, name, root_ns, first)
        if state.other is None:
            state.other = self._step(walks, state, "", root_ns, first)  # no table holds ""
        return [*state.after.values(), state.other]

    def _step(
        self, walks: _Walks, state: _State, name: str, root_ns: str | None, first: bool
    ) -> _State:
        """The state a name leads to from `state` (one object per set of nodes alive, however
        many paths reach it)."""
        nxt: list[_Node] = []
        tables = [node.plain for node in state.active if node.plain]
        tables += [node.desc for node in state.loops]
        for table in tables:
            _reach(table, name, root_ns, first, nxt)
        loops = tuple(dict.fromkeys([*state.loops, *(node for node in nxt if node.desc)]))
        key = _state_key(nxt, loops)
        after = walks.states.get(key)
        if after is None:
            after = walks.states[key] = _State(tuple(nxt), loops)
            walks.file(after)
        return after

    def _walk(self, root_ns: str | None, names: tuple[str, ...]) -> list[_Node]:
        """`match_nodes` without the states kept: the nodes alive, a name at a time.

        No node is alive twice at one name: each has one edge from one parent, and a parent's
        `//` table is followed once a name however often the parent was reached.
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
                if node.plain:
                    _reach(node.plain, name, root_ns, i == 0, nxt)
            for table in loops.values():
                _reach(table, name, root_ns, i == 0, nxt)
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


def _reach(
    table: dict[str, dict[str | None, _Node]],
    name: str,
    root_ns: str | None,
    first: bool,
    into: list[_Node],
) -> None:
    """The children a name reaches through one table: by the name and by `*`. Past the first name
    no namespace is checked (only a step meeting the root is held to one)."""
    if first:
        _follow(table, name, root_ns, into)
        return
    by_ns = table.get(name)
    if by_ns is not None:
        into.extend(by_ns.values())
    by_ns = table.get(ANY)
    if by_ns is not None:
        into.extend(by_ns.values())


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
