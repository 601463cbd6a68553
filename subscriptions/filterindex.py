"""An index of SQL-like filters: a message's cost grows with the filters it may match, not all.

Every compiled filter (hpwsn/sqlfilter.py) lists the conjuncts that must hold for it to match
(`field = c`, `field IN (...)`, `field > c`, ...). The index files each filter under one of them:
equality and IN under `(field, value)` in a hash table, numeric bounds in sorted arrays per field
(a message's value selects a contiguous run by bisection). A message then meets only the filters
whose filed conjunct it satisfies, and runs their whole expression; filters with no usable conjunct
are run one by one. The candidates are a superset of the matches and every candidate is evaluated
in full, unless the filter is nothing but the conjunct it was found under (`symbol = %0`): then
being found is matching. So the index answers exactly what a linear evaluation answers
(tests/subscriptions/test_filterindex.py proves it over random filters and messages).

Pure: no Django.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

from hpwsn.sqlfilter import CompiledFilter, Message, Predicate, Untyped, Value, as_bool, as_number

K = TypeVar("K")

# Which conjunct to file a filter under: equality narrows best, then a list of values, then bounds.
_PREFERENCE = {"=": 0, "in": 1, ">": 2, ">=": 2, "<": 2, "<=": 2}


def _key(value: Value) -> tuple[str, Value]:
    # Tagged so that TRUE, 1 and '1' stay apart (JMS: unlike types never compare equal), while
    # 1 and 1.0 share a key as they compare equal.
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", value)
    return ("s", str(value))


def _keys_of(value: Value) -> Iterator[tuple[str, Value]]:
    """Every key an equality conjunct true for this value is filed under."""
    if value is None:
        return
    if isinstance(value, Untyped):
        # Text from XML takes the type of the constant it meets (sqlfilter.compare).
        yield ("s", str(value))
        number = as_number(value)
        if number is not None:
            yield ("n", number)
        flag = as_bool(value)
        if flag is not None:
            yield ("b", flag)
        return
    yield _key(value)


def _numeric(value: Value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _usable(p: Predicate) -> bool:
    if p.op in ("=", "in"):
        return all(v is not None for v in p.values)
    return _numeric(p.values[0])  # string bounds are left to the full evaluation


class _Bounds(Generic[K]):
    """Filters with `field op c` for one field and one op, sorted by c."""

    def __init__(self, op: str, items: list[tuple[int | float, K, CompiledFilter]]) -> None:
        items.sort(key=lambda item: item[0])
        self.op = op
        self.limits = [c for c, _k, _f in items]
        self.entries = [(k, f) for _c, k, f in items]

    def satisfied_by(self, x: int | float) -> list[tuple[K, CompiledFilter]]:
        if self.op == ">":  # x > c: every c below x
            return self.entries[: bisect_left(self.limits, x)]
        if self.op == ">=":
            return self.entries[: bisect_right(self.limits, x)]
        if self.op == "<":  # x < c: every c above x
            return self.entries[bisect_right(self.limits, x) :]
        return self.entries[bisect_left(self.limits, x) :]


class FilterIndex(Generic[K]):
    """Compiled filters by key (a subscription); `matching(message)` returns the keys that match."""

    def __init__(self, filters: Iterable[tuple[K, CompiledFilter]]) -> None:
        self._equal: dict[str, dict[tuple[str, Value], list[tuple[K, CompiledFilter]]]] = {}
        bounds: dict[tuple[str, str], list[tuple[int | float, K, CompiledFilter]]] = {}
        self._rest: list[tuple[K, CompiledFilter]] = []
        self.size = 0
        for key, f in filters:
            self.size += 1
            usable = [p for p in f.predicates if _usable(p)]
            if not usable:
                self._rest.append((key, f))
                continue
            p = min(usable, key=lambda p: _PREFERENCE[p.op])
            if p.op in ("=", "in"):
                table = self._equal.setdefault(p.field, {})
                entry = (key, f)  # one object under every key: matching() drops repeats by id
                for k in dict.fromkeys(_key(v) for v in p.values):
                    table.setdefault(k, []).append(entry)
            else:
                bounds.setdefault((p.field, p.op), []).append((p.values[0], key, f))  # type: ignore[arg-type]
        self._bounds = [(field, _Bounds(op, items)) for (field, op), items in bounds.items()]

    @property
    def linear_share(self) -> int:
        """How many filters have no indexable conjunct and are evaluated for every message."""
        return len(self._rest)

    def matching(self, message: Message) -> list[K]:
        out: list[K] = []
        for field, table in self._equal.items():
            value = message.get(field)
            if isinstance(value, Untyped):
                # XML text may meet a filter under several keys ('1' and 1): evaluate it once.
                found = {id(e): e for k in _keys_of(value) for e in table.get(k, ())}
                out.extend(key for key, f in found.values() if f.sole or f(message))
                continue
            if value is not None:
                for key, f in table.get(_key(value), ()):
                    if f.sole or f(message):
                        out.append(key)
        for field, bounds in self._bounds:
            value = message.get(field)
            x = None if isinstance(value, bool) else as_number(value)
            if x is None:
                continue
            for key, f in bounds.satisfied_by(x):
                if f.sole or f(message):
                    out.append(key)
        for key, f in self._rest:
            if f(message):
                out.append(key)
        return out


def linear_matching(filters: Iterable[tuple[K, CompiledFilter]], message: Message) -> list[K]:
    """The same answer as FilterIndex.matching, by evaluating every filter (the baseline)."""
    return [key for key, f in filters if f(message)]
