"""WS-Topics expressions (Simple, Concrete, Full) and the thesis's colon paths.

A topic is identified by its root namespace and the tuple of names from the root down
(`("ALL", "ALARM", "ALARM1")`). Subscriptions cover whole subtrees (thesis 4.4.6, 5.3.3.5):
a pattern covers a topic when it matches the topic or any of its ancestors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hpwsn import ns

_NCNAME = r"[^\W\d][\w.\-]*"
_NCNAME_RE = re.compile(rf"^{_NCNAME}$")
_QNAME_RE = re.compile(rf"^(?:({_NCNAME}):)?({_NCNAME})$")

MAX_DEPTH = 16
ANY = "*"
SELF = "."


class TopicExpressionError(ValueError):
    """The expression is syntactically wrong or uses an undeclared prefix."""


class UnknownDialectError(ValueError):
    """The dialect URI is not one we implement."""


@dataclass(frozen=True, slots=True)
class Step:
    descendant: bool  # reached by "//" rather than "/"
    name: str  # an NCName, ANY or SELF
    namespace: str | None = None  # only meaningful on a root step


@dataclass(frozen=True, slots=True)
class PathPattern:
    steps: tuple[Step, ...]
    any_namespace: bool = False  # colon paths carry no namespace and match every root

    @property
    def is_concrete(self) -> bool:
        return all(not s.descendant and s.name not in (ANY, SELF) for s in self.steps)

    def matches(self, root_ns: str | None, names: tuple[str, ...]) -> bool:
        """True when this pattern selects exactly the topic `names`."""
        return _match(self, root_ns, names, 0, 0)

    def covers(self, root_ns: str | None, names: tuple[str, ...]) -> bool:
        """True when this pattern selects the topic or one of its ancestors (subtree semantics)."""
        return any(self.matches(root_ns, names[:k]) for k in range(1, len(names) + 1))


@dataclass(frozen=True, slots=True)
class TopicExpression:
    dialect: str
    text: str
    patterns: tuple[PathPattern, ...]

    @property
    def is_concrete(self) -> bool:
        return len(self.patterns) == 1 and self.patterns[0].is_concrete

    def concrete(self) -> tuple[str | None, tuple[str, ...], bool]:
        """(root namespace, names, any_namespace) of a concrete expression."""
        if not self.is_concrete:
            raise TopicExpressionError(f"'{self.text}' is not a concrete topic path")
        pattern = self.patterns[0]
        return (
            pattern.steps[0].namespace,
            tuple(s.name for s in pattern.steps),
            pattern.any_namespace,
        )

    def covers(self, root_ns: str | None, names: tuple[str, ...]) -> bool:
        return any(p.covers(root_ns, names) for p in self.patterns)

    def canonical(self) -> str:
        """A namespace-resolved form, equal for equal expressions whatever their prefixes."""
        parts = []
        for p in self.patterns:
            text = "".join(("//" if s.descendant else "/") + s.name for s in p.steps)
            root_ns = "*" if p.any_namespace else (p.steps[0].namespace or "")
            parts.append(f"{{{root_ns}}}{text}")
        return "|".join(sorted(parts))


def _ns_ok(step: Step, pattern: PathPattern, root_ns: str | None) -> bool:
    # A root that declares no namespace matches an expression in any namespace.
    return pattern.any_namespace or root_ns is None or step.namespace in (None, root_ns)


def _match(p: PathPattern, root_ns: str | None, names: tuple[str, ...], si: int, ni: int) -> bool:
    if si == len(p.steps):
        return ni == len(names)
    step = p.steps[si]
    if step.name == SELF:
        if step.descendant:
            return any(_match(p, root_ns, names, si + 1, k) for k in range(ni, len(names) + 1))
        return _match(p, root_ns, names, si + 1, ni)
    candidates = range(ni, len(names)) if step.descendant else range(ni, min(ni + 1, len(names)))
    for k in candidates:
        if k == 0 and not _ns_ok(step, p, root_ns):
            continue
        if (step.name == ANY or step.name == names[k]) and _match(p, root_ns, names, si + 1, k + 1):
            return True
    return False


def parse(text: str | None, dialect: str | None, nsmap: Mapping[Any, str]) -> TopicExpression:
    """Parse a topic expression; prefixes resolve through `nsmap` (the namespaces in scope)."""
    expr = (text or "").strip()
    if not expr:
        raise TopicExpressionError("the topic expression is empty")
    if len(expr) > 4096:
        raise TopicExpressionError("the topic expression is longer than 4096 characters")
    dialect = (dialect or "").strip() or _guess_dialect(expr)
    return _parse_cached(expr, dialect, tuple(sorted((k or "", v) for k, v in nsmap.items())))


@lru_cache(maxsize=4096)
def _parse_cached(expr: str, dialect: str, nsitems: tuple[tuple[str, str], ...]) -> TopicExpression:
    nsmap = dict(nsitems)
    if dialect == ns.DIALECT_COLON:
        patterns: tuple[PathPattern, ...] = (_colon_path(expr),)
    elif dialect == ns.DIALECT_SIMPLE:
        patterns = (_simple_or_colon(expr, nsmap, allow_children=False),)
    elif dialect == ns.DIALECT_CONCRETE:
        patterns = (_simple_or_colon(expr, nsmap, allow_children=True),)
    elif dialect == ns.DIALECT_FULL:
        patterns = tuple(_full_path(alt.strip(), nsmap) for alt in expr.split("|"))
    else:
        raise UnknownDialectError(f"topic expression dialect '{dialect}' is not supported")
    return TopicExpression(dialect=dialect, text=expr, patterns=patterns)


def _guess_dialect(expr: str) -> str:
    if any(c in expr for c in "/*|"):
        return ns.DIALECT_FULL
    return ns.DIALECT_SIMPLE


def _colon_path(expr: str) -> PathPattern:
    names = expr.split(":")
    for name in names:
        if not _NCNAME_RE.match(name):
            raise TopicExpressionError(f"'{name}' in '{expr}' is not a valid topic name")
    if len(names) > MAX_DEPTH:
        raise TopicExpressionError(f"'{expr}' is deeper than {MAX_DEPTH} levels")
    return PathPattern(steps=tuple(_child_step(n) for n in names), any_namespace=True)


@lru_cache(maxsize=65536)
def _child_step(name: str) -> Step:
    """One Step per topic name, shared by every expression that names it (10^5 subscriptions
    would otherwise hold a Step and a copy of the name each)."""
    return Step(False, name)


def _qname(token: str, nsmap: Mapping[str, str], expr: str) -> tuple[str | None, str]:
    m = _QNAME_RE.match(token)
    if not m:
        raise TopicExpressionError(f"'{token}' in '{expr}' is not a valid topic name")
    prefix, local = m.group(1), m.group(2)
    if prefix is None:
        return nsmap.get("") or None, local
    if prefix not in nsmap:
        raise TopicExpressionError(f"prefix '{prefix}' in '{expr}' is not declared")
    return nsmap[prefix], local


def _simple_or_colon(expr: str, nsmap: Mapping[str, str], *, allow_children: bool) -> PathPattern:
    head, _, rest = expr.partition("/")
    prefix = head.split(":", 1)[0] if ":" in head else None
    # The thesis writes paths with colons (ALL:ALARM:ALARM1); a leading segment that is not a
    # declared prefix means a colon path, not a QName.
    if "/" not in expr and (head.count(":") > 1 or (prefix is not None and prefix not in nsmap)):
        return _colon_path(expr)
    if rest and not allow_children:
        raise TopicExpressionError(f"'{expr}' has child steps, which the Simple dialect forbids")
    root_ns, root = _qname(head, nsmap, expr)
    steps = [Step(False, root, root_ns)]
    for token in rest.split("/") if rest else []:
        if token in ("", ANY, SELF) or any(c in token for c in "*|"):
            raise TopicExpressionError(f"'{expr}' is not a concrete path ('{token}')")
        steps.append(Step(False, _qname(token, nsmap, expr)[1]))
    if len(steps) > MAX_DEPTH:
        raise TopicExpressionError(f"'{expr}' is deeper than {MAX_DEPTH} levels")
    return PathPattern(steps=tuple(steps))


def _full_path(path: str, nsmap: Mapping[str, str]) -> PathPattern:
    if not path:
        raise TopicExpressionError("an alternative of the expression is empty")
    steps: list[Step] = []
    i, n = 0, len(path)
    descendant = False
    if path.startswith("//"):
        descendant, i = True, 2
    elif path.startswith("/"):
        raise TopicExpressionError(f"'{path}' must not start with a single '/'")
    while i <= n:
        j = path.find("/", i)
        j = n if j < 0 else j
        token = path[i:j]
        if not token:
            raise TopicExpressionError(f"'{path}' has an empty step")
        if token == SELF:
            steps.append(Step(descendant, SELF))
        elif token == ANY or token.endswith(":*"):
            root_ns = None
            if token != ANY:
                root_ns = _qname(token[:-2] + ":x", nsmap, path)[0]
            steps.append(Step(descendant, ANY, root_ns if not steps else None))
        else:
            qns, local = _qname(token, nsmap, path)
            steps.append(Step(descendant, local, qns if not steps else None))
        if j >= n:
            break
        if path.startswith("//", j):
            descendant, i = True, j + 2
        else:
            descendant, i = False, j + 1
        if i >= n:
            raise TopicExpressionError(f"'{path}' ends with '/'")
    if steps[0].name == SELF:
        raise TopicExpressionError(f"'{path}' cannot start with '.'")
    if len(steps) > MAX_DEPTH * 2:
        raise TopicExpressionError(f"'{path}' has too many steps")
    return PathPattern(steps=tuple(steps))


def split_colon_path(text: str) -> tuple[str, ...]:
    """The names of a colon path (ALL:ALARM:ALARM1), validated."""
    return tuple(s.name for s in _colon_path(text.strip()).steps)
