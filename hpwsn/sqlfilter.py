"""The SQL-like content filter (`urn:hpwsn:2026:filter:sql`): seed 002's grammar and JMS selectors.

A filter is the WHERE clause of a query over one message: comparisons, BETWEEN, IN, LIKE ... ESCAPE,
IS [NOT] NULL, AND/OR/NOT, arithmetic, `%0`..`%99` parameters and seed 002's `strlike(field, 'text',
maxDistance)` edit-distance match. It is parsed once (lark, LALR) and compiled into nested closures,
so evaluating it per message is a few Python calls, not a tree walk (seed 002's figure 4: the filter
must stay cheap as expressions grow).

Semantics follow JMS 1.1 section 3.8.1: three-valued logic (a missing field is NULL; a comparison
with NULL is unknown; unknown does not match), and values of different types never compare equal
(a comparison of unlike types is false, not an error). Payload values read from XML are untyped
text: they take the type of what they are compared with (a number when compared with a number and
when the text is one), as XPath does with untyped nodes; JSON values keep their JSON type.

Pure: no Django. `compile_filter` is what Subscribe (SOAP) and a REST edge call.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lxml import etree, objectify

DIALECT = "urn:hpwsn:2026:filter:sql"

MAX_LENGTH = 10_000  # characters of filter text; longer is refused before parsing
MAX_NODES = 1_000  # nodes of the parsed tree
MAX_PARAMETERS = 100  # %0 .. %99


class Untyped(str):
    """Text read from an XML payload: typed by what it is compared with."""

    __slots__ = ()


Value = None | bool | int | float | str


@dataclass(frozen=True, slots=True)
class Property:
    """A message property a filter names with `$`; its type is fixed."""

    name: str
    kind: str  # "num" | "str"
    doc: str


PROPERTIES: dict[str, Property] = {
    p.name: p
    for p in (
        Property("$topic", "str", "the topic's colon path, e.g. 'ALL:ALARM:ALARM1'"),
        Property("$producer", "str", "the wsa:Address of the Notify's ProducerReference"),
        Property("$priority", "num", "the topic policy's priority"),
        Property("$publishTime", "num", "when the broker accepted it, in ms since the epoch"),
        Property("$size", "num", "the size in bytes of what is inside wsnt:Message"),
    )
}


class FilterError(ValueError):
    """A filter that cannot be compiled: where (1-based column) and what was expected there."""

    def __init__(self, message: str, *, position: int, expected: Sequence[str] = ()) -> None:
        self.position = position
        self.expected = list(expected)
        self.reason = message
        where = f"at column {position}: " if position else ""
        wanted = f" (expected {_one_of(self.expected)})" if self.expected else ""
        super().__init__(f"{where}{message}{wanted}")


def _one_of(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else "one of " + ", ".join(items)


# ----------------------------------------------------------------------------- grammar

_GRAMMAR = r"""
?start: or_
?or_: and_ | or_ _OR and_ -> or_op
?and_: not_ | and_ _AND not_ -> and_op
?not_: pred | _NOT not_ -> not_op
?pred: sum
     | sum COMPOP sum -> compare
     | sum NEG? _BETWEEN sum _AND sum -> between
     | sum NEG? _IN "(" item ("," item)* ")" -> in_
     | sum NEG? _LIKE STRING (_ESCAPE STRING)? -> like
     | sum _IS NEG? _NULL -> is_null
?sum: product | sum ADDOP product -> arith
?product: unary | product MULOP unary -> arith
?unary: atom | ADDOP unary -> neg
?atom: literal
     | PARAM -> param
     | FIELD -> field
     | "(" or_ ")"
     | _STRLIKE "(" sum "," sum "," sum ")" -> strlike
?item: literal | PARAM -> param | ADDOP literal -> neg
literal: NUMBER | STRING | TRUE | FALSE
NEG: "NOT"i
_OR: "OR"i
_AND: "AND"i
_NOT: "NOT"i
_BETWEEN: "BETWEEN"i
_IN: "IN"i
_LIKE: "LIKE"i
_ESCAPE: "ESCAPE"i
_IS: "IS"i
_NULL: "NULL"i
TRUE: "TRUE"i
FALSE: "FALSE"i
_STRLIKE: "strlike"i
COMPOP: "=" | "<>" | "<=" | ">=" | "<" | ">"
ADDOP: "+" | "-"
MULOP: "*" | "/"
PARAM: /%[0-9]{1,2}(?![0-9])/
NUMBER: /([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?/
STRING: /'([^']|'')*'/
// JMS 3.8.1.1: the reserved words are no identifiers ("x > AND" is an error, not a field).
_NO_KEYWORD: /(?!(?i:and|or|not|between|in|like|escape|is|null|true|false)(?![A-Za-z0-9_]))/
FIELD: _NO_KEYWORD /\$?[A-Za-z_][A-Za-z0-9_]*(\.@?[A-Za-z_][A-Za-z0-9_]*)*/
%ignore /\s+/
"""

_PARSER = Lark(_GRAMMAR, parser="lalr", propagate_positions=True, maybe_placeholders=False)

# What a user reads in "expected ...", by terminal.
_TERMINALS = {
    "NUMBER": "a number",
    "STRING": "a 'string'",
    "TRUE": "TRUE",
    "FALSE": "FALSE",
    "PARAM": "a %N parameter",
    "FIELD": "a field name",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "COMPOP": "a comparison (= <> < > <= >=)",
    "ADDOP": "'+' or '-'",
    "MULOP": "'*' or '/'",
    "NEG": "NOT",
    "_NOT": "NOT",
    "_OR": "OR",
    "_AND": "AND",
    "_BETWEEN": "BETWEEN",
    "_IN": "IN",
    "_LIKE": "LIKE",
    "_ESCAPE": "ESCAPE",
    "_IS": "IS",
    "_NULL": "NULL",
    "_STRLIKE": "strlike(",
    "$END": "the end of the filter",
}


def _expected(names: set[str]) -> list[str]:
    return sorted({_TERMINALS.get(n, n) for n in names})


@lru_cache(maxsize=4096)
def _parse(text: str) -> Tree[Token]:
    # One expression usually serves many subscribers with their own parameters: parse it once.
    if len(text) > MAX_LENGTH:
        raise FilterError(f"the filter is longer than {MAX_LENGTH} characters", position=1)
    if not text.strip():
        raise FilterError("the filter is empty", position=1, expected=["an expression"])
    try:
        tree = _PARSER.parse(text)
    except UnexpectedEOF as exc:
        raise FilterError(
            "the filter ends too early",
            position=len(text) + 1,
            expected=_expected({str(t) for t in exc.expected}),
        ) from None
    except UnexpectedToken as exc:
        got = "end of the filter" if exc.token.type == "$END" else f"'{exc.token}'"
        column = len(text) + 1 if exc.token.type == "$END" else exc.column
        raise FilterError(
            f"unexpected {got}", position=column, expected=_expected(exc.expected)
        ) from None
    except UnexpectedCharacters as exc:
        raise FilterError(
            f"unexpected character '{text[exc.pos_in_stream or 0]}'",
            position=exc.column,
            expected=_expected(exc.allowed or set()),
        ) from None
    except UnexpectedInput as exc:  # pragma: no cover - the three above are all lark raises
        raise FilterError(str(exc), position=getattr(exc, "column", 0) or 0) from None
    nodes = sum(1 for _ in tree.iter_subtrees())
    if nodes > MAX_NODES:
        raise FilterError(f"the filter has more than {MAX_NODES} nodes", position=1)
    return tree


# ----------------------------------------------------------------------------- messages


class Message:
    """One notification as filters see it; payload fields are looked up once and cached.

    `element` is the wsnt:Message element (its first element child is the XML payload; text
    that is a JSON object is a JSON payload). Several thousand filters may read one Message, so
    a field costs one dictionary lookup after the first filter read it.
    """

    __slots__ = ("_cache", "_json", "_root", "element")

    def __init__(
        self,
        element: Any = None,
        json_body: Any = None,
        properties: Mapping[str, Value] | None = None,
    ) -> None:
        self.element = element  # lxml element of wsnt:Message, or None
        # Properties are read from the same table as cached payload fields: one lookup either way.
        self._cache: dict[str, Value] = dict(properties) if properties else {}
        self._json: Any = json_body if json_body is not None else _UNREAD
        self._root: Any = _UNREAD  # the XML payload's root element

    def get(self, path: str) -> Value:
        value = self._cache.get(path, _UNREAD)
        if value is not _UNREAD:
            return value  # type: ignore[return-value]
        value = None if path[0] == "$" else self._payload(path)
        self._cache[path] = value
        return value

    def _payload(self, path: str) -> Value:
        body = self._json
        if body is _UNREAD:
            body = self._json = _json_body_of(self.element)
        if body is not None:
            return _json_value(body, path.split("."))
        if self.element is None:
            return None
        root = self._root
        if root is _UNREAD:
            root = self._root = next(self.element.iterchildren(_ELEMENTS), None)
        return _xml_value(self.element, root, path)


_UNREAD = object()
_ELEMENTS: Any = etree.Element  # iterchildren(tag=etree.Element): elements only, no comments


def _json_body_of(element: Any) -> Any:
    """The JSON object a wsnt:Message holds as text, or None (then its payload is XML)."""
    if element is None or len(element):
        return None
    text = (element.text or "").strip()
    if not text.startswith("{"):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


@lru_cache(maxsize=4096)
def _xml_path(path: str) -> tuple[Any, Any, tuple[str, ...], str | None]:
    """A dotted field as two ObjectPaths (the payload root's namespace below the root, and no
    namespace), the same steps by local name, and an attribute name."""
    parts = path.split(".")
    attribute = parts.pop()[1:] if parts[-1][0] == "@" else None
    qualified = objectify.ObjectPath(".".join(parts))
    unqualified = objectify.ObjectPath(".".join([parts[0], *("{}" + p for p in parts[1:])]))
    return qualified, unqualified, tuple("{*}" + p for p in parts), attribute


def _xml_value(message: Any, root: Any, path: str) -> Value:
    # The first name is the payload's root element, then children by local name; `@name` is an
    # attribute. The element read is the first along a path of elements in the payload root's
    # namespace, else the first along a path of elements in no namespace below the root (the
    # two common ways of writing XML), else the first of each name in any namespace. ObjectPath
    # walks the first two in C; the walk by local name, called from Python step by step, is the
    # last resort.
    qualified, unqualified, steps, attribute = _xml_path(path)
    node = None
    if root is not None:
        node = qualified(root, None)
        if node is None and root.tag[0] == "{":
            node = unqualified(root, None)
    if node is None:
        node = message
        for step in steps:
            node = next(node.iterchildren(step), None)
            if node is None:
                return None
    if attribute is not None:
        value = node.get(attribute)
        if value is None:  # a namespaced attribute: by its local name
            value = next((v for k, v in node.attrib.items() if _local(k) == attribute), None)
        return None if value is None else Untyped(value.strip())
    text = node.text if not len(node) else "".join(node.itertext())
    return Untyped((text or "").strip())


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _json_value(body: Any, parts: list[str]) -> Value:
    node = body
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if isinstance(node, bool | int | float | str):
        return node
    return None  # null, an object or an array is not a value a filter compares


# ----------------------------------------------------------------------------- value semantics

_NUMBER_TEXT = re.compile(r"\s*[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\s*")


def as_number(value: Value) -> int | float | None:
    """The number a value stands for, or None: numbers, and untyped text that spells one."""
    t = type(value)
    if t is int or t is float:
        return value  # type: ignore[return-value]
    if t is Untyped:
        return _number_of_text(str(value))
    return None


@lru_cache(maxsize=65_536)
def _number_of_text(text: str) -> int | float | None:
    # Cached: the same XML text meets many numeric filters of one fan-out, and the values a
    # field takes repeat across messages.
    if not _NUMBER_TEXT.fullmatch(text):
        return None
    text = text.strip()
    if not any(c in text for c in ".eE"):
        return int(text)
    number = float(text)
    return number if math.isfinite(number) else None


def as_bool(value: Value) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, Untyped):
        low = value.strip().lower()
        if low in ("true", "false"):
            return low == "true"
    return None


def _is_number(value: Value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _unify(a: Value, b: Value) -> tuple[Value, Value] | None:
    """Both values in one type, or None when their types are unlike (JMS: then unequal)."""
    if isinstance(a, Untyped) or isinstance(b, Untyped):
        if isinstance(a, Untyped) and isinstance(b, Untyped):
            return str(a), str(b)
        typed = b if isinstance(a, Untyped) else a
        if _is_number(typed):
            na, nb = as_number(a), as_number(b)
            return None if na is None or nb is None else (na, nb)
        if isinstance(typed, bool):
            ba, bb = as_bool(a), as_bool(b)
            return None if ba is None or bb is None else (ba, bb)
        return str(a), str(b)
    if _is_number(a) and _is_number(b):
        return a, b
    if isinstance(a, bool) and isinstance(b, bool):
        return a, b
    if isinstance(a, str) and isinstance(b, str):
        return a, b
    return None


def compare(op: str, a: Value, b: Value) -> bool | None:
    """`a op b` in three-valued logic: None when either side is NULL."""
    if a is None or b is None:
        return None
    pair = _unify(a, b)
    if pair is None:
        return False
    x, y = pair
    if op == "=":
        return x == y
    if op == "<>":
        return x != y
    if isinstance(x, bool):
        return False  # booleans are only equal or not (JMS)
    if op == "<":
        return x < y  # type: ignore[operator]
    if op == ">":
        return x > y  # type: ignore[operator]
    if op == "<=":
        return x <= y  # type: ignore[operator]
    return x >= y  # type: ignore[operator]


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
}


def compare_with(op: str, c: Value) -> Callable[[Value], bool | None]:
    """`x op c` for a constant `c`, specialised to c's type: the answers of compare(op, x, c)
    with fewer steps, as most filters compare a field with a constant."""
    test = _OPS[op]
    if c is None:
        return lambda _x: None
    if isinstance(c, bool):
        if op not in ("=", "<>"):
            return lambda x: None if x is None else False

        def with_bool(x: Value) -> bool | None:
            if x is None:
                return None
            b = as_bool(x)
            return False if b is None else test(b, c)

        return with_bool
    if isinstance(c, int | float):

        def with_number(x: Value) -> bool | None:
            if x is None:
                return None
            t = type(x)
            if t is int or t is float:
                return test(x, c)
            if t is Untyped:
                n = as_number(x)
                return False if n is None else test(n, c)
            return False

        return with_number

    def with_text(x: Value) -> bool | None:
        if x is None:
            return None
        return test(x, c) if isinstance(x, str) else False  # XML text (Untyped) is text here

    return with_text


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


# strlike compares values of at most this many characters; a longer one makes it NULL (unknown):
# the distance of two 256 KiB values held a worker for hours in the fan-out.
STRLIKE_MAX_CHARS = 4096


def edit_distance(a: str, b: str, limit: int) -> int:
    """Levenshtein distance, or `limit + 1` when it exceeds `limit` (seed 002 strlike).

    Myers' bit-parallel algorithm (Hyyro's formulation for the global distance): one pass over
    `b` with `a`'s columns as the bits of integers, len(b) steps of a few operations on
    len(a)-bit numbers, where the table of distances costs len(a) * len(b) Python steps.
    """
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    if not a or not b:
        return min(len(a) + len(b), limit + 1)
    peq: dict[str, int] = {}
    for i, ch in enumerate(a):
        peq[ch] = peq.get(ch, 0) | (1 << i)
    mask, high = (1 << len(a)) - 1, 1 << (len(a) - 1)
    pv, mv, score = mask, 0, len(a)
    for ch in b:
        eq = peq.get(ch, 0)
        xv = eq | mv
        xh = (((eq & pv) + pv) ^ pv) | eq
        ph = mv | (~(xh | pv) & mask)
        mh = pv & xh
        if ph & high:
            score += 1
        elif mh & high:
            score -= 1
        ph = ((ph << 1) | 1) & mask
        mh = (mh << 1) & mask
        pv = mh | (~(xv | ph) & mask)
        mv = ph & xv
    return min(score, limit + 1)


def like_matcher(pattern: str, escape: str | None) -> Callable[[str], bool]:
    """A LIKE pattern (`%` any run, `_` one character, `escape` quotes the next) as a predicate
    on the whole string.

    Not one regular expression: `%a%a%a%a%a%a%b` as `.*a.*a.*...b` backtracks, and took 30 s
    on 80 characters (hours on 160) in the fan-out that serves every subscriber. The pattern is
    cut at its `%`s into pieces of fixed length instead; the first must match at the start, the
    last at the end, and each one between at its leftmost place after the one before (leftmost is
    always right for `%`), so a test costs at most the value's length times the pattern's.
    """
    pieces: list[list[str]] = [[]]
    chars = iter(pattern)
    for ch in chars:
        if escape is not None and ch == escape:
            nxt = next(chars, None)
            if nxt is None:
                raise ValueError("the pattern ends with its escape character")
            pieces[-1].append(re.escape(nxt))
        elif ch == "%":
            pieces.append([])
        elif ch == "_":
            pieces[-1].append(".")
        else:
            pieces[-1].append(re.escape(ch))
    # Each piece matches exactly as many characters as it has items.
    compiled = [(re.compile("".join(p), re.DOTALL), len(p)) for p in pieces]
    if len(compiled) == 1:
        whole = compiled[0][0]
        return lambda v: whole.fullmatch(v) is not None
    (head, head_len), middle, (tail, tail_len) = compiled[0], compiled[1:-1], compiled[-1]

    def match(v: str) -> bool:
        end = len(v) - tail_len
        if end < head_len or head.match(v) is None or tail.match(v, end) is None:
            return False
        pos = head_len
        for piece, size in middle:
            if size == 0:
                continue
            found = piece.search(v, pos, end)
            if found is None:
                return False
            pos = found.end()
        return True

    return match


def parameter_from_text(text: str) -> Value:
    """A parameter given as text (SOAP): a number, a 'quoted string', TRUE/FALSE, else the text."""
    raw = text.strip()
    if re.fullmatch(r"'([^']|'')*'", raw):
        return raw[1:-1].replace("''", "'")
    if raw.upper() in ("TRUE", "FALSE"):
        return raw.upper() == "TRUE"
    number = as_number(Untyped(raw))
    return number if number is not None else text


# ----------------------------------------------------------------------------- compilation

Eval = Callable[[Message], Value]


@dataclass(frozen=True, slots=True)
class Predicate:
    """A conjunct an index can use: `field op value` (op: =, <, <=, >, >=) or `field IN values`."""

    field: str
    op: str  # "=", "in", "<", "<=", ">", ">="
    values: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class CompiledFilter:
    """A compiled filter: call it with a Message; True means the message matches."""

    text: str
    parameters: tuple[Value, ...]
    evaluate: Eval
    predicates: tuple[Predicate, ...]  # conjuncts that must hold for a match (for indexing)
    fields: frozenset[str]
    # The whole filter is its one predicate (`field = c`, `field IN (...)`, `field > c`): an
    # index that found it under that predicate need not evaluate it.
    sole: bool = False

    def __call__(self, message: Message) -> bool:
        return self.evaluate(message) is True


@dataclass(frozen=True, slots=True)
class _Node:
    fn: Eval
    kind: str  # "num" | "str" | "bool" | "any" (a payload field: its type is the payload's)
    const: bool = False
    value: Value = None
    field: str | None = None


def _column(tree: Tree[Token] | Token) -> int:
    if isinstance(tree, Token):
        return tree.column or 0
    return getattr(tree.meta, "column", 0) or 0


class _Compiler:
    def __init__(self, parameters: Sequence[Value], *, allow_payload: bool) -> None:
        self.parameters = parameters
        self.allow_payload = allow_payload
        self.fields: set[str] = set()

    def node(self, t: Tree[Token] | Token) -> _Node:
        if isinstance(t, Token):  # pragma: no cover - every token sits under a rule
            raise FilterError(f"unexpected '{t}'", position=_column(t))
        return getattr(self, "n_" + str(t.data))(t)

    def boolean(self, t: Tree[Token] | Token) -> _Node:
        n = self.node(t)
        if n.kind not in ("bool", "any"):
            raise FilterError(
                f"a {_KIND_NAMES[n.kind]} is not a condition",
                position=_column(t),
                expected=["a condition (a comparison, LIKE, IN, BETWEEN, IS NULL, ...)"],
            )
        if n.kind == "bool":
            return n
        get = n.fn
        return _Node(lambda m: as_bool(get(m)), "bool")

    def operand(self, t: Tree[Token] | Token, *, allowed: tuple[str, ...], what: str) -> _Node:
        n = self.node(t)
        if n.kind != "any" and n.kind not in allowed:
            raise FilterError(
                f"{what} cannot take a {_KIND_NAMES[n.kind]}",
                position=_column(t),
                expected=[" or ".join(_KIND_NAMES[k] for k in allowed)],
            )
        return n

    # -- leaves

    def n_literal(self, t: Tree[Token]) -> _Node:
        tok = t.children[0]
        assert isinstance(tok, Token)
        if tok.type == "NUMBER":
            text = str(tok)
            value: Value = float(text) if any(c in text for c in ".eE") else int(text)
            if isinstance(value, float) and not math.isfinite(value):
                raise FilterError(f"the number {text} is out of range", position=_column(tok))
        elif tok.type == "STRING":
            value = str(tok)[1:-1].replace("''", "'")
        else:
            value = tok.type == "TRUE"
        return _const(value)

    def n_param(self, t: Tree[Token]) -> _Node:
        tok = t.children[0]
        index = int(str(tok)[1:])
        if index >= len(self.parameters):
            raise FilterError(
                f"parameter {tok} has no value ({len(self.parameters)} given)",
                position=_column(tok),
                expected=[f"at most %{len(self.parameters) - 1}" if self.parameters else "no %N"],
            )
        value = self.parameters[index]
        if value is not None and not isinstance(value, bool | int | float | str):
            raise FilterError(
                f"parameter {tok} is not a number, string or boolean", position=_column(tok)
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise FilterError(f"parameter {tok} is not a finite number", position=_column(tok))
        return _const(value)

    def n_field(self, t: Tree[Token]) -> _Node:
        tok = t.children[0]
        name = str(tok)
        if name[0] == "$":
            prop = PROPERTIES.get(name)
            if prop is None:
                raise FilterError(
                    f"unknown message property {name}",
                    position=_column(tok),
                    expected=list(PROPERTIES),
                )
            kind = prop.kind
        else:
            if not self.allow_payload:
                raise FilterError(
                    f"'{name}' is not a producer property",
                    position=_column(tok),
                    expected=list(PROPERTIES),
                )
            kind = "any"
        self.fields.add(name)
        return _Node(lambda m: m.get(name), kind, field=name)

    # -- arithmetic

    def n_neg(self, t: Tree[Token]) -> _Node:
        sign = str(t.children[0])
        inner = self.operand(t.children[1], allowed=("num",), what=f"unary '{sign}'")
        get = inner.fn
        if sign == "+":
            fn: Eval = lambda m: as_number(get(m))  # noqa: E731
        else:

            def fn(m: Message) -> Value:
                n = as_number(get(m))
                return None if n is None else -n

        return _fold(_Node(fn, "num"), inner)

    def n_arith(self, t: Tree[Token]) -> _Node:
        op = str(t.children[1])
        left = self.operand(t.children[0], allowed=("num",), what=f"'{op}'")
        right = self.operand(t.children[2], allowed=("num",), what=f"'{op}'")
        lf, rf = left.fn, right.fn
        apply = _ARITH[op]

        def fn(m: Message) -> Value:
            a = as_number(lf(m))
            if a is None:
                return None
            b = as_number(rf(m))
            if b is None:
                return None
            return apply(a, b)

        return _fold(_Node(fn, "num"), left, right)

    # -- predicates

    def n_compare(self, t: Tree[Token]) -> _Node:
        op = str(t.children[1])
        left, right = self.node(t.children[0]), self.node(t.children[2])
        self._comparable(left, right, op, t.children[2])
        lf, rf = left.fn, right.fn
        if left.const != right.const:  # a value against a constant: specialised
            node, test = (
                (left, compare_with(op, right.value))
                if right.const
                else (right, compare_with(_FLIP_OP[op], left.value))
            )
            name, get = node.field, node.fn
            if name is not None:
                fn: Eval = lambda m: test(m.get(name))  # noqa: E731
            else:
                fn = lambda m: test(get(m))  # noqa: E731
        else:
            fn = lambda m: compare(op, lf(m), rf(m))  # noqa: E731
        return _fold(_Node(fn, "bool"), left, right)

    def _comparable(self, a: _Node, b: _Node, op: str, at: Tree[Token] | Token) -> None:
        if "any" in (a.kind, b.kind):
            return
        if a.kind != b.kind:
            raise FilterError(
                f"a {_KIND_NAMES[a.kind]} is compared with a {_KIND_NAMES[b.kind]}",
                position=_column(at),
                expected=[f"a {_KIND_NAMES[a.kind]}"],
            )
        if a.kind == "bool" and op not in ("=", "<>"):
            raise FilterError(
                f"booleans cannot be compared with {op}",
                position=_column(at),
                expected=["= or <>"],
            )

    def n_between(self, t: Tree[Token]) -> _Node:
        kids = list(t.children)
        negated = isinstance(kids[1], Token) and kids[1].type == "NEG"
        if negated:
            kids.pop(1)
        subject = self.operand(kids[0], allowed=("num", "str"), what="BETWEEN")
        low = self.operand(kids[1], allowed=("num", "str"), what="BETWEEN")
        high = self.operand(kids[2], allowed=("num", "str"), what="BETWEEN")
        self._comparable(subject, low, ">=", kids[1])
        self._comparable(subject, high, "<=", kids[2])
        sf, lf, hf = subject.fn, low.fn, high.fn

        if low.const and high.const:  # the usual case: constant bounds, specialised
            below, above = compare_with("<", low.value), compare_with(">", high.value)
            at_least, at_most = compare_with(">=", low.value), compare_with("<=", high.value)
            if negated:

                def fn(m: Message) -> Value:
                    v = sf(m)
                    return _or(below(v), above(v))

            else:

                def fn(m: Message) -> Value:
                    v = sf(m)
                    return _and(at_least(v), at_most(v))

        elif negated:

            def fn(m: Message) -> Value:
                v = sf(m)
                return _or(compare("<", v, lf(m)), compare(">", v, hf(m)))

        else:

            def fn(m: Message) -> Value:
                v = sf(m)
                return _and(compare(">=", v, lf(m)), compare("<=", v, hf(m)))

        return _fold(_Node(fn, "bool"), subject, low, high)

    def n_in_(self, t: Tree[Token]) -> _Node:
        kids = list(t.children)
        negated = isinstance(kids[1], Token) and kids[1].type == "NEG"
        if negated:
            kids.pop(1)
        subject = self.node(kids[0])
        items = [self.node(k) for k in kids[1:]]
        for item, at in zip(items, kids[1:], strict=True):
            self._comparable(subject, item, "=", at)
        tests = tuple(compare_with("=", i.value) for i in items)
        sf = subject.fn

        def fn(m: Message) -> Value:
            v = sf(m)
            if v is None:
                return None
            result: bool | None = False
            for test in tests:
                result = _or(result, test(v))
                if result is True:
                    break
            return (None if result is None else not result) if negated else result

        return _fold(_Node(fn, "bool"), subject, *items)

    def n_like(self, t: Tree[Token]) -> _Node:
        kids = list(t.children)
        negated = isinstance(kids[1], Token) and kids[1].type == "NEG"
        if negated:
            kids.pop(1)
        subject = self.operand(kids[0], allowed=("str",), what="LIKE")
        pattern = str(kids[1])[1:-1].replace("''", "'")
        escape = None
        if len(kids) > 2:
            escape = str(kids[2])[1:-1].replace("''", "'")
            if len(escape) != 1:
                raise FilterError(
                    "the ESCAPE character must be exactly one character",
                    position=_column(kids[2]),
                    expected=["one character"],
                )
        try:
            matches = like_matcher(pattern, escape)
        except ValueError as exc:
            raise FilterError(str(exc), position=_column(kids[1])) from None
        sf = subject.fn

        def fn(m: Message) -> Value:
            v = sf(m)
            if v is None:
                return None
            if not isinstance(v, str):
                return False
            return not matches(v) if negated else matches(v)

        return _fold(_Node(fn, "bool"), subject)

    def n_is_null(self, t: Tree[Token]) -> _Node:
        subject = self.node(t.children[0])
        negated = len(t.children) > 1
        sf = subject.fn
        if negated:
            fn: Eval = lambda m: sf(m) is not None  # noqa: E731
        else:
            fn = lambda m: sf(m) is None  # noqa: E731
        return _fold(_Node(fn, "bool"), subject)

    def n_strlike(self, t: Tree[Token]) -> _Node:
        subject = self.operand(t.children[0], allowed=("str",), what="strlike")
        text = self.operand(t.children[1], allowed=("str",), what="strlike")
        limit = self.operand(t.children[2], allowed=("num",), what="strlike's distance")
        sf, tf, lf = subject.fn, text.fn, limit.fn

        def fn(m: Message) -> Value:
            a, b, n = sf(m), tf(m), as_number(lf(m))
            if a is None or b is None or n is None:
                return None
            if not isinstance(a, str) or not isinstance(b, str) or n < 0:
                return False
            if len(a) > STRLIKE_MAX_CHARS or len(b) > STRLIKE_MAX_CHARS:
                return None
            bound = int(n)
            return edit_distance(a, b, bound) <= bound

        return _fold(_Node(fn, "bool"), subject, text, limit)

    # -- logic

    def n_not_op(self, t: Tree[Token]) -> _Node:
        inner = self.boolean(t.children[0])
        get = inner.fn

        def fn(m: Message) -> Value:
            v = get(m)
            return None if v is None else not v

        return _fold(_Node(fn, "bool"), inner)

    def n_and_op(self, t: Tree[Token]) -> _Node:
        left, right = self.boolean(t.children[0]), self.boolean(t.children[1])
        lf, rf = left.fn, right.fn

        def fn(m: Message) -> Value:
            a = lf(m)
            if a is False:
                return False  # short-circuit: unknown AND false is false too
            b = rf(m)
            if b is False:
                return False
            return None if a is None or b is None else True

        return _fold(_Node(fn, "bool"), left, right)

    def n_or_op(self, t: Tree[Token]) -> _Node:
        left, right = self.boolean(t.children[0]), self.boolean(t.children[1])
        lf, rf = left.fn, right.fn

        def fn(m: Message) -> Value:
            a = lf(m)
            if a is True:
                return True
            b = rf(m)
            if b is True:
                return True
            return None if a is None or b is None else False

        return _fold(_Node(fn, "bool"), left, right)


_FLIP_OP = {"=": "=", "<>": "<>", "<": ">", ">": "<", "<=": ">=", ">=": "<="}

_KIND_NAMES = {"num": "number", "str": "string", "bool": "boolean", "any": "field"}


def _div(a: int | float, b: int | float) -> Value:
    if b == 0:
        return None  # no value, as SQL: the comparison that uses it is unknown
    if isinstance(a, int) and isinstance(b, int) and a % b == 0:
        return a // b
    return a / b


def _finite(x: int | float) -> Value:
    return None if isinstance(x, float) and not math.isfinite(x) else x


_ARITH: dict[str, Callable[[Any, Any], Value]] = {
    "+": lambda a, b: _finite(a + b),
    "-": lambda a, b: _finite(a - b),
    "*": lambda a, b: _finite(a * b),
    "/": _div,
}

_EMPTY = Message()


def _const(value: Value) -> _Node:
    kind = (
        "any"
        if value is None
        else "bool"
        if isinstance(value, bool)
        else "num"
        if isinstance(value, int | float)
        else "str"
    )
    return _Node(lambda _m: value, kind, const=True, value=value)


def _fold(node: _Node, *inputs: _Node) -> _Node:
    """A node whose inputs are all constants is a constant: computed here, once."""
    if all(i.const for i in inputs):
        value = node.fn(_EMPTY)
        return _Node(lambda _m: value, node.kind, const=True, value=value)
    return node


def _conjuncts(t: Tree[Token] | Token) -> list[Tree[Token]]:
    if isinstance(t, Tree) and t.data == "and_op":
        return [*_conjuncts(t.children[0]), *_conjuncts(t.children[1])]
    return [t] if isinstance(t, Tree) else []


def _predicates(tree: Tree[Token], compiler: _Compiler) -> tuple[Predicate, ...]:
    """Conjuncts of the form `field op constant`: each must be true for the filter to match."""
    found = []
    for c in _conjuncts(tree):
        if c.data == "compare":
            op = str(c.children[1])
            left, right = compiler.node(c.children[0]), compiler.node(c.children[2])
            if op == "<>":
                continue
            if left.field and right.const and right.value is not None:
                found.append(Predicate(left.field, op, (right.value,)))
            elif right.field and left.const and left.value is not None:
                found.append(Predicate(right.field, _FLIP_OP[op], (left.value,)))
        elif c.data == "in_" and not (isinstance(c.children[1], Token)):
            subject = compiler.node(c.children[0])
            items = [compiler.node(k) for k in c.children[1:]]
            if subject.field and all(i.value is not None for i in items):
                found.append(Predicate(subject.field, "in", tuple(i.value for i in items)))
        elif c.data == "between" and not isinstance(c.children[1], Token):
            subject = compiler.node(c.children[0])
            low, high = compiler.node(c.children[1]), compiler.node(c.children[2])
            if subject.field and low.const and low.value is not None:
                found.append(Predicate(subject.field, ">=", (low.value,)))
            if subject.field and high.const and high.value is not None:
                found.append(Predicate(subject.field, "<=", (high.value,)))
    return tuple(found)


def compile_filter(
    text: str, parameters: Sequence[Value] = (), *, producer_only: bool = False
) -> CompiledFilter:
    """Parse and type-check a filter and bind its parameters; raises FilterError.

    `producer_only`: a ProducerProperties filter, which may name `$` properties only.
    """
    if len(parameters) > MAX_PARAMETERS:
        raise FilterError(f"more than {MAX_PARAMETERS} parameters", position=0)
    tree = _parse(text)
    compiler = _Compiler(tuple(parameters), allow_payload=not producer_only)
    root = compiler.boolean(tree)
    predicates = _predicates(tree, compiler)
    return CompiledFilter(
        text=text,
        parameters=tuple(parameters),
        evaluate=root.fn,
        predicates=predicates,
        fields=frozenset(compiler.fields),
        sole=tree.data in ("compare", "in_") and len(predicates) == 1,
    )


def both(first: CompiledFilter, second: CompiledFilter) -> CompiledFilter:
    """The conjunction of two filters (MessageContent AND ProducerProperties)."""
    f, s = first.evaluate, second.evaluate
    return CompiledFilter(
        text=f"({first.text}) AND ({second.text})",
        parameters=first.parameters,
        evaluate=lambda m: _and(f(m), s(m)),  # type: ignore[arg-type]
        predicates=first.predicates + second.predicates,
        fields=first.fields | second.fields,
    )


def message_of(
    element: Any = None, *, json_body: Any = None, properties: Mapping[str, Value] | None = None
) -> Message:
    """A Message for filters to read; `properties` by their `$` names (see PROPERTIES)."""
    return Message(element, json_body, properties)
