"""Reads of subscriptions, including the in-memory index the fan-out matches against."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection
from lxml import etree

from dispatch.flow import consumer_of
from hpwsn import topicexpr, xpathfilter
from hpwsn.errors import WsnError
from hpwsn.sqlfilter import CompiledFilter, compile_filter
from hpwsn_site import state
from subscriptions.filterindex import FilterIndex
from subscriptions.filters import SQL, subscription_filter_compile
from subscriptions.models import PublisherRegistration, PullPoint, Subscription
from topics import changes
from topics.tree import Matcher


def resource_tag(resource_id: str) -> str:
    """A short, stable name of a subscription or pull point that grants nothing.

    Its id is in its address and works with it, so /metrics, the dashboard and read-only
    console users see this instead: the first 12 hex digits of an HMAC of the id with the secret
    key (not reversible, not guessable without the key; the same in every process).
    """
    key = settings.SECRET_KEY.encode()
    return hmac.new(key, f"hpwsn-resource\0{resource_id}".encode(), hashlib.sha256).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class SubEntry:
    id: str
    mode: str
    consumer_address: str
    reference_address: str
    pull_point_id: str | None
    soap_version: str
    use_raw: bool
    signing_secret: str
    paused: bool  # paused or suspended: messages are queued, nothing is pushed
    termination_ts: float | None  # epoch seconds
    content_filter: Callable[[etree._Element], object] | None
    topic_path: str = ""  # the concrete topic subscribed to; empty for wildcard expressions
    created_ts: float = 0.0  # epoch seconds: reliable messages accepted before it are not its
    format: str = "wsn"  # push as a wsnt:Notify, or as CloudEvents ("cloudevents")

    def expired(self, now: float) -> bool:
        return self.termination_ts is not None and self.termination_ts <= now


Placed = tuple[topicexpr.TopicExpression | None, str, str, str]  # expr, path, group, xpath key


class SubscriptionIndex:
    """Every subscription in memory, by id and by the topics it covers; changed in place.

    Built once from every row, then kept current a subscription at a time (`put`, `discard`)
    as the change log names them (topics/changes.py).
    """

    def __init__(
        self,
        entries: list[tuple[SubEntry, topicexpr.TopicExpression | None, str]] = (),  # type: ignore[assignment]
        sql_filters: dict[str, CompiledFilter] | None = None,
    ) -> None:
        self.by_id: dict[str, SubEntry] = {}
        self._all: dict[str, None] = {}  # subscriptions without a topic filter: every topic
        # Its memo holds the entries themselves (a topic met again costs no lookups by id).
        self._matcher = Matcher(resolve=self.by_id.__getitem__)
        # Subscriptions with an SQL-like filter are not matched one by one: those with the same
        # topic expression share a FilterIndex (subscriptions/filterindex.py), which the topic
        # matcher finds as a whole; only the filters a message may satisfy are evaluated.
        self._groups = Matcher()
        self._members: dict[str, dict[str, tuple[SubEntry, CompiledFilter]]] = {}
        self._group_index: dict[str, FilterIndex[SubEntry]] = {}
        # Push subscriptions per consumer origin: flow control skips its shared window when one
        # consumer's pumps together could never fill it.
        self.per_consumer: dict[str, int] = {}
        self._placed: dict[str, Placed] = {}
        # Compiled XPath filters by text and namespaces, with the number of subscriptions using
        # each: identical filters share one object, so the fan-out evaluates it once a message.
        self.xpaths: dict[str, list[Any]] = {}
        for entry, expr, topic_path in entries:
            self.put(entry, expr, topic_path, (sql_filters or {}).get(entry.id))
        self.prime()

    def prime(self) -> None:
        """Resolve the entries of every place subscriptions are filed at, once a build has put
        them all, so that the first lookup of a topic after a build resolves none of them."""
        self._matcher.prime()
        self._groups.prime()

    def __len__(self) -> int:
        return len(self.by_id)

    @property
    def groups(self) -> list[FilterIndex[SubEntry]]:
        return list(self._group_index.values())

    def put(
        self,
        entry: SubEntry,
        expr: topicexpr.TopicExpression | None,
        topic_path: str,
        sql_filter: CompiledFilter | None = None,
        xpath_key: str = "",
    ) -> None:
        """Add a subscription, or replace the one with its id."""
        if entry.id in self.by_id:
            self.discard(entry.id)
        self.by_id[entry.id] = entry
        if entry.mode == "push":
            origin = consumer_of(entry.consumer_address)
            self.per_consumer[origin] = self.per_consumer.get(origin, 0) + 1
        exact = tuple(map(sys.intern, topic_path.split(":"))) if topic_path else None
        group = ""
        if sql_filter is not None:
            group = f"{expr.dialect}|{expr.canonical()}" if expr else "*"
            members = self._members.setdefault(group, {})
            members[entry.id] = (entry, sql_filter)
            if len(members) == 1 and expr is not None:
                self._groups.add(group, expr, exact)
            self._regroup(group)
        elif expr is None:
            self._all[entry.id] = None
        else:
            self._matcher.add(entry.id, expr, exact)
        self._placed[entry.id] = (expr, topic_path, group, xpath_key)

    def discard(self, sub_id: str) -> None:
        """Remove a subscription (nothing happens for an unknown id)."""
        entry = self.by_id.get(sub_id)
        placed = self._placed.pop(sub_id, None)
        if entry is None or placed is None:
            self.by_id.pop(sub_id, None)
            return
        _expr, _path, group, xpath_key = placed
        if entry.mode == "push":
            origin = consumer_of(entry.consumer_address)
            left = self.per_consumer.get(origin, 1) - 1
            if left > 0:
                self.per_consumer[origin] = left
            else:
                self.per_consumer.pop(origin, None)
        if group:
            members = self._members.get(group, {})
            members.pop(sub_id, None)
            if not members:
                self._members.pop(group, None)
                self._groups.remove(group)
            self._regroup(group)
        elif sub_id in self._all:
            del self._all[sub_id]
        else:
            self._matcher.remove(sub_id)
        del self.by_id[sub_id]  # after the matcher forgot it: a match resolves only known ids
        if xpath_key:
            held = self.xpaths.get(xpath_key)
            if held is not None:
                held[1] -= 1
                if held[1] <= 0:
                    del self.xpaths[xpath_key]

    def _regroup(self, group: str) -> None:
        # One expression's filters are indexed together; a change rebuilds that group alone.
        members = self._members.get(group)
        if members:
            self._group_index[group] = FilterIndex(members.values())
        else:
            self._group_index.pop(group, None)

    def xpath_filter(self, text: str, nsmap: dict[str, str]) -> tuple[str, xpathfilter.Filter]:
        """The compiled filter shared by every subscription with this text and namespaces."""
        key = json.dumps([text, sorted(nsmap.items())])
        held = self.xpaths.get(key)
        if held is None:
            held = self.xpaths[key] = [_content_filter(text, nsmap), 0]
        held[1] += 1
        return key, held[0]

    def filter_groups(
        self, root_ns: str | None, names: tuple[str, ...]
    ) -> list[FilterIndex[SubEntry]]:
        """The SQL-like filter indexes of the subscriptions whose topic expressions cover this."""
        found = self._groups.match(root_ns, names)
        every = self._group_index.get("*")
        out = [every] if every is not None else []
        out.extend(self._group_index[g] for g in found if isinstance(g, str))
        return out

    def matching(self, root_ns: str | None, names: tuple[str, ...]) -> Sequence[SubEntry]:
        found: Sequence[SubEntry] = self._matcher.match(root_ns, names)
        if self._all:
            return [*map(self.by_id.__getitem__, self._all), *found]
        return found


def _refused(reason: str) -> xpathfilter.Filter:
    def evaluate(_message: etree._Element) -> object:
        raise xpathfilter.FilterRejected(reason)

    return evaluate


def _content_filter(text: str, nsmap: dict[str, str]) -> xpathfilter.Filter:
    """The compiled filter; one refused today (stored before the checks) fails every evaluation,
    which counts against its subscription and matches nothing."""
    try:
        return xpathfilter.compile_filter(text, nsmap, max_chars=settings.HPWSN_FILTER_MAX_CHARS)
    except xpathfilter.FilterRejected as exc:
        return _refused(str(exc))


def _index_put(
    index: SubscriptionIndex, sub: Subscription, compiled: dict[str, CompiledFilter]
) -> None:
    expr = None
    if sub.topic_expression:
        try:
            expr = topicexpr.parse(sub.topic_expression, sub.topic_dialect, sub.topic_nsmap)
        except (topicexpr.TopicExpressionError, topicexpr.UnknownDialectError):
            return  # validated at subscribe time; unreachable unless the row was edited
    content_filter = None
    xpath_key = ""
    sql_filter = _sql_filter(sub, compiled)
    if sub.content_filter and sub.content_dialect != SQL:
        xpath_key, content_filter = index.xpath_filter(sub.content_filter, sub.content_nsmap)
    # Values that many subscriptions share are kept once (sys.intern), not once per row read.
    entry = SubEntry(
        id=str(sub.id),
        mode=sys.intern(sub.mode),
        consumer_address=sub.consumer_address,
        reference_address=sub.reference_address,
        pull_point_id=str(sub.pull_point_id) if sub.pull_point_id else None,
        soap_version=sys.intern(sub.soap_version),
        use_raw=sub.use_raw,
        signing_secret=sub.signing_secret,
        paused=sub.state != Subscription.State.ACTIVE,
        termination_ts=sub.termination_time.timestamp() if sub.termination_time else None,
        content_filter=content_filter,
        topic_path=sys.intern(sub.topic_path),
        created_ts=sub.created_at.timestamp(),
        format=sys.intern(sub.format),
    )
    index.put(entry, expr, entry.topic_path, sql_filter, xpath_key)


def _build() -> SubscriptionIndex:
    global _compiled
    index = SubscriptionIndex()
    previous = _index.peek()
    if previous is not None:
        # Filters compiled for the index this one replaces are not compiled again.
        index.xpaths = {k: [f, 0] for k, (f, _n) in previous.xpaths.items()}
    compiled: dict[str, CompiledFilter] = {}
    for sub in Subscription.objects.all().iterator(chunk_size=5000):
        _index_put(index, sub, compiled)
    index.xpaths = {k: held for k, held in index.xpaths.items() if held[1] > 0}
    index.prime()
    _compiled = compiled  # what no subscription uses any more is dropped
    return index


def _apply(index: SubscriptionIndex, ids: list[str], carried: dict[str, str]) -> bool:
    """Load these subscriptions again: put the ones that exist, discard the others. The state
    that their entries carried is taken as it is; the others' rows are read."""
    rows = _rows_by_id([sub_id for sub_id in ids if sub_id not in carried])
    for sub_id in ids:
        sub = _uncarried(carried[sub_id]) if sub_id in carried else rows.get(sub_id)
        if sub is None:
            index.discard(sub_id)
        else:
            _index_put(index, sub, _compiled)
    return True


def _rows_by_id(ids: list[str]) -> dict[str, Subscription]:
    """The rows of these subscriptions that exist, by id (a text that is no id has none)."""
    valid = []
    for sub_id in ids:
        try:
            valid.append(uuid.UUID(sub_id))
        except ValueError:
            continue  # never an id: nothing in the index has it
    return {str(s.id): s for s in _rows(valid)} if valid else {}


# The fields the index reads from a row (`_index_put`), as a change's copy in Redis carries them
# to the processes it wakes (topics/changes.py): a woken process puts the subscription without
# reading its row. A subscription with a signing secret carries nothing, so no secret is kept in
# Redis: its row is read.
_CARRIED = (
    "id", "mode", "consumer_address", "reference_address", "pull_point_id", "soap_version",
    "use_raw", "state", "termination_time", "created_at", "format", "topic_path",
    "topic_expression", "topic_dialect", "topic_nsmap", "content_filter", "content_dialect",
    "content_nsmap", "producer_filter", "producer_dialect", "filter_parameters",
)  # fmt: skip
_CARRIED_TIMES = ("termination_time", "created_at")


def _carry(ids: list[str]) -> dict[str, str]:
    """The state of these subscriptions as the writer's transaction leaves them ('' for gone)."""
    rows = _rows_by_id(ids)
    out = {}
    for sub_id in ids:
        sub = rows.get(sub_id)
        if sub is None:
            out[sub_id] = ""
        else:
            out.update(subscription_carried(sub))
    return out


def subscription_carried(sub: Subscription) -> dict[str, str]:
    """What a change's copy carries of this subscription: {id: state}, or {} with a secret."""
    if sub.signing_secret:
        return {}
    values = {name: getattr(sub, name) for name in _CARRIED}
    values["id"] = str(sub.id)
    values["pull_point_id"] = str(sub.pull_point_id) if sub.pull_point_id else None
    for name in _CARRIED_TIMES:
        if values[name] is not None:
            values[name] = values[name].isoformat()
    return {str(sub.id): json.dumps(values, separators=(",", ":"))}


def _uncarried(text: str) -> Subscription | None:
    if not text:
        return None
    values = json.loads(text)
    for name in _CARRIED_TIMES:
        if values[name] is not None:
            values[name] = datetime.datetime.fromisoformat(values[name])
    return Subscription(**values)


changes.change_carrier(changes.SUBSCRIPTION, _carry)


# Queries the hot paths run again and again (a few subscriptions by id as a process applies a
# change, a pull point's rows at every GetMessages), compiled once per database and shape, with the
# names of the columns they select and the converters the ORM applies to them. The ORM's
# compilation of such a query cost twice the query itself, and `raw()` finds the columns and
# converters again at every call.
@dataclass(frozen=True, slots=True)
class _Compiled:
    sql: str
    attnames: list[str]
    converters: list[tuple[int, tuple[list[Any], Any]]]


_COMPILED: dict[tuple[str, str, int], _Compiled] = {}
_ROWS_COMPILED_UP_TO = 16


def _compiled_query(name: str, size: int, queryset: Callable[[], Any]) -> _Compiled:
    """The query `queryset()` builds, compiled at its first use for this database: `name` and
    `size` (its number of parameters) tell its shape, the same at every call."""
    key = (connection.vendor, name, size)
    found = _COMPILED.get(key)
    if found is None:
        compiler = queryset().order_by().query.get_compiler(connection=connection)
        sql, params = compiler.as_sql()
        assert len(params) == size, (name, params)
        cols = [col for col, _sql, _alias in compiler.select[: compiler.col_count]]
        found = _COMPILED[key] = _Compiled(
            sql=sql,
            attnames=[col.target.attname for col in cols],
            converters=list(compiler.get_converters(cols).items()),
        )
    return found


def _fetch(query: _Compiled, params: list[Any]) -> list[list[Any]]:
    """The rows of a compiled query, converted as the ORM's compiler converts them."""
    with connection.cursor() as cursor:
        cursor.execute(query.sql, params)
        fetched = cursor.fetchall()
    out = []
    for values in fetched:
        row = list(values)
        for pos, (convs, expression) in query.converters:
            for convert in convs:
                row[pos] = convert(row[pos], expression, connection)
        out.append(row)
    return out


def _rows(ids: list[uuid.UUID]) -> list[Subscription]:
    ids = list(dict.fromkeys(ids))  # the ORM's IN drops repeated values, and with them a "%s"
    if not ids or len(ids) > _ROWS_COMPILED_UP_TO:
        return list(Subscription.objects.filter(id__in=ids))
    query = _compiled_query("rows", len(ids), lambda: Subscription.objects.filter(id__in=ids))
    pk = Subscription._meta.pk
    assert pk is not None
    rows = _fetch(query, [pk.get_db_prep_value(i, connection) for i in ids])
    return [Subscription.from_db(connection.alias, query.attnames, row) for row in rows]


def subscription_row(subscription_id: str) -> Subscription | None:
    """The subscription's row, or None (a text that is no id has none). Renew, Pause, Resume
    and Unsubscribe read it at every call: by the query compiled once."""
    try:
        sub_id = uuid.UUID(subscription_id)
    except (ValueError, TypeError):
        return None
    rows = _rows([sub_id])
    return rows[0] if rows else None


def pull_point_read(pull_point_id: uuid.UUID) -> tuple[PullPoint | None, dict[str, str]]:
    """A pull point's row (None when there is none), and the reference address of each
    subscription that feeds it, by subscription id: what every GetMessages reads."""
    pk = PullPoint._meta.pk
    assert pk is not None
    param = [pk.get_db_prep_value(pull_point_id, connection)]
    query = _compiled_query("pullpoint", 1, lambda: PullPoint.objects.filter(id=pull_point_id))
    rows = _fetch(query, param)
    if not rows:
        return None, {}
    refs = _compiled_query(
        "pullrefs",
        1,
        lambda: Subscription.objects.filter(pull_point_id=pull_point_id).values_list(
            "id", "reference_address"
        ),
    )
    return (
        PullPoint.from_db(connection.alias, query.attnames, rows[0]),
        {str(sid): str(ref) for sid, ref in _fetch(refs, param)},
    )


# Compiled filters by their text and parameters, kept from one index build to the next: 100,000
# filters take seconds to compile again. Changes applied in between add to it; the next full
# build keeps only what is in use.
_compiled: dict[str, CompiledFilter] = {}


def _sql_filter(sub: Subscription, compiled: dict[str, CompiledFilter]) -> CompiledFilter | None:
    if sub.content_dialect != SQL and not sub.producer_filter:
        return None
    key = json.dumps(
        [
            sub.content_dialect,
            sub.content_filter,
            sub.producer_dialect,
            sub.producer_filter,
            sub.filter_parameters,
        ]
    )
    found = compiled.get(key) or _compiled.get(key)
    if found is None:
        found = _compile(sub)
    compiled[key] = found
    return found


def _compile(sub: Subscription) -> CompiledFilter:
    try:
        found = subscription_filter_compile(
            content_text=sub.content_filter,
            content_dialect=sub.content_dialect,
            producer_text=sub.producer_filter,
            producer_dialect=sub.producer_dialect,
            parameters=sub.filter_parameters,
        )
        return found or _NOTHING
    except WsnError:
        # Checked at Subscribe; a row edited since then matches nothing rather than everything.
        return _NOTHING


_NOTHING = compile_filter("FALSE")

_index: changes.ChangeFeed[SubscriptionIndex] = changes.ChangeFeed(
    kind=changes.SUBSCRIPTION, version_key=state.VERSION_SUBS, build=_build, apply=_apply
)


def subscription_index(*, max_age: float = 0.0) -> SubscriptionIndex:
    """The process's subscription index, with the changes of the log applied."""
    return _index.get(max_age=max_age)


def subscription_index_cached() -> state.Cached[SubscriptionIndex] | None:
    """The process's subscription index as it is, without I/O, with the markers it reflects."""
    return _index.cached()


def subscription_gone(sid: str) -> bool:
    """True if the subscription no longer exists; a process's index may not have a new one yet."""
    try:
        return not Subscription.objects.filter(id=sid).exists()
    except (ValueError, ValidationError):  # not even an id
        return True


def resource_exists(*, kind: str, resource_id: str) -> bool:
    """Whether a live subscription ("subscriptions"), pull point ("pullpoints") or publisher
    registration ("registrations") has this id."""
    try:
        if kind == "subscriptions":
            return Subscription.objects.filter(pk=resource_id).exists()
        if kind == "registrations":
            return PublisherRegistration.objects.filter(pk=resource_id).exists()
        return PullPoint.objects.filter(pk=resource_id, destroyed_at__isnull=True).exists()
    except (ValueError, ValidationError):  # not even the shape of an id
        return False
