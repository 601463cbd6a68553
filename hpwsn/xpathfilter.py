"""WSN MessageContent filters in XPath 1.0, compiled so that no subscriber can run unbounded work.

A filter is evaluated by the fan-out on every message of its topic, inside the worker that serves
every other subscriber too. lxml compiles XPath with EXSLT regular expressions (`re:test`, in
Python's `re`: a bad pattern raises, a backtracking one hangs) and, for any prefix the caller binds
to an EXSLT namespace, libexslt's string, math, set and date functions (`str:padding(1e9)`).
So a filter here:

- is compiled with `regexp=False` and may call only the XPath 1.0 core functions, unprefixed:
  no extension function of any namespace, no variables;
- has at most `max_chars` characters;
- passes a static cost check. Every location step can select O(n) nodes of an n-node message, so
  a predicate is evaluated O(n) times; a predicate that itself walks O(n) nodes makes the filter
  quadratic, and one nested inside another cubic (`//*[following::*[preceding::*]]` held a worker
  20 s on a 12 KB message). Inside a predicate, the steps that may walk the whole document
  (`following`, `preceding`, their `-sibling` forms, and absolute paths `/...`, `//...`) are
  refused; steps bounded by the depth of the document (`descendant`, `ancestor`, relative `.//`)
  are allowed at one level of predicate nesting, not inside each other; a path inside a predicate
  may not go up and down again (`../*` visits every sibling).

Evaluation is bounded by the size of the message, which the broker checks before evaluating.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from lxml import etree

CORE_FUNCTIONS = frozenset(
    {
        "last", "position", "count", "local-name", "namespace-uri", "name",
        "string", "concat", "starts-with", "contains", "substring-before", "substring-after",
        "substring", "string-length", "normalize-space", "translate",
        "boolean", "not", "true", "false", "lang",
        "number", "sum", "floor", "ceiling", "round",
    }
)  # fmt: skip
NODE_TYPES = frozenset({"node", "text", "comment", "processing-instruction"})
OPERATOR_NAMES = frozenset({"and", "or", "div", "mod"})
# Steps that may visit every node of the document from one context node.
WIDE_AXES = frozenset({"following", "preceding", "following-sibling", "preceding-sibling"})
# Steps that visit at most (size of a subtree) or (depth) nodes: n * depth summed over n contexts.
DEEP_AXES = frozenset({"descendant", "descendant-or-self", "ancestor", "ancestor-or-self"})
UP_AXES = frozenset({"parent", "ancestor", "ancestor-or-self"})

Filter = Callable[[etree._Element], object]

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<literal>"[^"]*"|'[^']*')
    | (?P<number>\d+(?:\.\d*)?|\.\d+)
    | (?P<op>//|::|\.\.|!=|<=|>=|[/\[\]()@,|+\-=<>*.])
    | (?P<var>\$)
    | (?P<name>[^\W\d][\w.\-]*(?::(?:[^\W\d][\w.\-]*|\*))?)
    )""",
    re.VERBOSE,
)
# After these tokens an operand starts: a `/` or `//` there begins an absolute path.
_OPERAND_START = {
    None,
    "[",
    "(",
    ",",
    "|",
    "+",
    "-",
    "=",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
} | OPERATOR_NAMES


class FilterRejected(ValueError):
    """The expression is refused; `cost` tells a cost refusal from a syntax one."""

    def __init__(self, message: str, *, cost: bool = False) -> None:
        super().__init__(message)
        self.cost = cost


def _tokens(text: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    end = len(text.rstrip())
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise FilterRejected(f"unexpected character {text[pos]!r} at position {pos}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def check(text: str, *, max_chars: int) -> None:
    """Refuse an expression that is too long, calls a non-core function, or can go quadratic."""
    if len(text) > max_chars:
        raise FilterRejected(
            f"the expression has {len(text)} characters; at most {max_chars} are allowed",
            cost=True,
        )
    tokens = _tokens(text)
    # One entry per open predicate: does the predicate chain around it already walk a subtree?
    stack: list[bool] = []
    deep_here = False  # a depth-bounded step at the current predicate level
    went_up = False  # the path being read inside a predicate stepped up (.., parent::, ancestor::)
    prev: str | None = None
    for i, (kind, value) in enumerate(tokens):
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else None
        inside = bool(stack)
        if kind == "var":
            raise FilterRejected("variables are not defined in MessageContent filters")
        if kind == "name" and nxt == "(" and value not in NODE_TYPES:
            if ":" in value:
                raise FilterRejected(
                    f"'{value}()' is an extension function; only XPath 1.0 core functions "
                    "may be called"
                )
            if value not in CORE_FUNCTIONS and value not in OPERATOR_NAMES:
                raise FilterRejected(f"'{value}()' is not an XPath 1.0 core function")
        if kind == "name" and nxt == "::":
            if inside and value in WIDE_AXES:
                raise FilterRejected(
                    f"the axis {value}:: inside a predicate visits the whole document once per "
                    "node the predicate is tried on (quadratic cost)",
                    cost=True,
                )
            if value in DEEP_AXES and inside:
                if any(stack):
                    raise FilterRejected(
                        f"the axis {value}:: inside nested predicates that already walk a subtree",
                        cost=True,
                    )
                deep_here = True
        if inside and (value == ".." or (kind == "name" and nxt == "::" and value in UP_AXES)):
            went_up = True
        elif inside and kind == "op" and value in ("/", "//") and went_up and nxt != "@":
            # Up, then down again: every node of the level above, e.g. all siblings (`../*`),
            # once per node the predicate is tried on.
            raise FilterRejected(
                "a path that goes up ('..', parent::, ancestor::) and down again inside a "
                "predicate visits the siblings of every node (quadratic cost)",
                cost=True,
            )
        elif value in _OPERAND_START or value in ("]", ")"):
            went_up = False
        if kind == "op" and value in ("/", "//") and prev in _OPERAND_START and inside:
            raise FilterRejected(
                f"an absolute path ('{value}...') inside a predicate is evaluated over the whole "
                "document once per node the predicate is tried on (quadratic cost)",
                cost=True,
            )
        if kind == "op" and value == "//" and inside:
            if any(stack):
                raise FilterRejected(
                    "'//' inside nested predicates that already walk a subtree", cost=True
                )
            deep_here = True
        if value == "[" and kind == "op":
            stack.append(deep_here or (bool(stack) and stack[-1]))
            deep_here = False
        elif value == "]" and kind == "op":
            if not stack:
                raise FilterRejected("unbalanced ']'")
            deep_here = stack.pop()
        prev = value if kind in ("op",) or (kind == "name" and value in OPERATOR_NAMES) else kind
    if stack:
        raise FilterRejected("unbalanced '['")


def compile_filter(text: str, nsmap: Mapping[str, str], *, max_chars: int) -> Filter:
    """A callable evaluating the filter on a message element, or FilterRejected saying why."""
    check(text, max_chars=max_chars)
    try:
        return etree.XPath(
            text,
            namespaces={k: v for k, v in nsmap.items() if k},
            regexp=False,
            smart_strings=False,
        )
    except etree.XPathError as exc:
        raise FilterRejected(f"not a valid XPath 1.0 expression: {exc}") from None
