"""Directory entries <-> plain views of topics, subscriptions and publisher registrations (no
Django, no connection).

A *view* is a dict of the values both sides hold for one object. Comparing views is how the
synchronisation decides whether anything changed, and how `directory_reconcile` names a difference.
Topic views are keyed by colon path; every policy value has one canonical form ("" / None for
"inherit") so that equal topics have equal views whichever side they were read from.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ldap.dn import escape_dn_chars, str2dn

TOPIC_CLASS = "hpwsnTopic"
SUBSCRIPTION_CLASS = "hpwsnSubscription"
REGISTRATION_CLASS = "hpwsnPublisherRegistration"

# Topic model field -> (directory attribute, kind). Kinds: str, bool, int, groups.
TOPIC_ATTRS: dict[str, tuple[str, str]] = {
    "namespace": ("hpwsnNamespace", "str"),
    "description": ("description", "str"),
    "reliability": ("hpwsnReliability", "reliability"),
    "ordered": ("hpwsnOrdered", "bool"),
    "retry_schedule": ("hpwsnRetrySchedule", "schedule"),
    "priority": ("hpwsnPriority", "priority"),
    "ttl_seconds": ("hpwsnTtlSeconds", "int"),
    "fragment_size": ("hpwsnFragmentSize", "int"),
    "partial_delivery": ("hpwsnPartialDelivery", "bool"),
    "auto_create_children": ("hpwsnAutoCreateChildren", "bool"),
    "publish_groups": ("hpwsnPublishGroups", "groups"),
    "subscribe_groups": ("hpwsnSubscribeGroups", "groups"),
    "anonymous_publish": ("hpwsnAnonymousPublish", "bool"),
    "anonymous_subscribe": ("hpwsnAnonymousSubscribe", "bool"),
    "require_registration": ("hpwsnRequireRegistration", "bool"),
}
RELIABILITIES = ("reliable", "fast")
# Column sizes of topics.Topic: a longer value is reported, not truncated.
NAME_MAX = 128
TEXT_MAX = {
    "namespace": 512,
    "retry_schedule": 256,
    "publish_groups": 1024,
    "subscribe_groups": 1024,
}
_NULLABLE_KINDS = {"bool", "int", "priority"}


class EntryError(ValueError):
    """A directory entry the broker cannot use; the message says why (the caller adds the DN)."""


@dataclass(frozen=True)
class Entry:
    dn: str
    attrs: Mapping[str, list[bytes]]
    uuid: str = ""

    def first(self, name: str) -> str | None:
        for key, values in self.attrs.items():
            if key.lower() == name.lower() and values:
                return values[0].decode("utf-8")
        return None

    def all(self, name: str) -> list[str]:
        for key, values in self.attrs.items():
            if key.lower() == name.lower():
                return [v.decode("utf-8") for v in values]
        return []

    @property
    def object_classes(self) -> set[str]:
        return {v.lower() for v in self.all("objectClass")}


def dn_parent(dn: str) -> str:
    parts = str2dn(dn)
    return ",".join(_rdn_str(rdn) for rdn in parts[1:])


def dn_depth(dn: str) -> int:
    return len(str2dn(dn))


def _rdn_str(rdn: list[tuple[str, str, int]]) -> str:
    return "+".join(f"{attr}={escape_dn_chars(value)}" for attr, value, _flags in rdn)


def dn_normal(dn: str) -> str:
    """A DN in one spelling (attribute names lower-case, values re-escaped) for comparisons."""
    return ",".join(
        "+".join(f"{attr.lower()}={escape_dn_chars(value)}" for attr, value, _f in rdn)
        for rdn in str2dn(dn)
    )


def dn_is_below(dn: str, base: str) -> bool:
    """True when dn is base itself or lies under it."""
    d, b = dn_normal(dn), dn_normal(base)
    return d == b or d.endswith("," + b)


def topic_rdn(name: str) -> str:
    return f"cn={escape_dn_chars(name)}"


def topic_dn(name: str, parent_dn: str) -> str:
    return f"{topic_rdn(name)},{parent_dn}"


def _bool(text: str, attr: str) -> bool:
    upper = text.strip().upper()
    if upper in ("TRUE", "FALSE"):
        return upper == "TRUE"
    raise EntryError(f"{attr} must be TRUE or FALSE, not {text!r}")


INT_MAX = 2**31 - 1  # the integer columns' bound (PositiveIntegerField)


def _int(text: str, attr: str, *, low: int = 0, high: int = INT_MAX) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise EntryError(f"{attr} must be an integer, not {text!r}") from None
    if value < low or value > high:
        raise EntryError(f"{attr} must be {low}..{high}, not {value}")
    return value


def _schedule(text: str, attr: str) -> str:
    parts = [p.strip() for p in text.split(",")]
    try:
        seconds = [float(p) for p in parts]
    except ValueError:
        raise EntryError(f"{attr} must be seconds, comma separated, not {text!r}") from None
    if any(s < 0 for s in seconds):
        raise EntryError(f"{attr} has a negative delay: {text!r}")
    return ",".join(parts)


def _groups_text(values: Iterable[str]) -> str:
    return ",".join(sorted({v.strip() for v in values if v.strip()}))


def topic_view(entry: Entry, *, parent_path: str | None, fields: Iterable[str]) -> dict[str, Any]:
    """The topic view of a directory entry below its parent (None: a root). Raises EntryError."""
    name = entry.first("hpwsnTopicName")
    if name is None or not name.strip():
        raise EntryError("the topic has no name (hpwsnTopicName)")
    name = name.strip()
    if ":" in name or any(c.isspace() for c in name) or "/" in name or "*" in name:
        raise EntryError(f"invalid topic name {name!r}")
    if len(name) > NAME_MAX:
        raise EntryError(f"topic name longer than {NAME_MAX} characters")
    view: dict[str, Any] = {"path": f"{parent_path}:{name}" if parent_path else name}
    for field in fields:
        attr, kind = TOPIC_ATTRS[field]
        if kind == "groups":
            view[field] = _groups_text(entry.all(attr))
            continue
        raw = entry.first(attr)
        if raw is None or raw == "":
            view[field] = None if kind in _NULLABLE_KINDS else ""
        elif kind == "bool":
            view[field] = _bool(raw, attr)
        elif kind == "int":
            view[field] = _int(raw, attr)
        elif kind == "priority":
            view[field] = _int(raw, attr, high=9)
        elif kind == "reliability":
            value = raw.strip().lower()
            if value not in RELIABILITIES:
                raise EntryError(f"unknown {attr} {raw!r} (reliable or fast)")
            view[field] = value
        elif kind == "schedule":
            view[field] = _schedule(raw, attr)
        else:
            view[field] = raw
        limit = TEXT_MAX.get(field)
        if limit is not None and isinstance(view[field], str) and len(view[field]) > limit:
            raise EntryError(f"{attr} longer than {limit} characters")
    if parent_path and "namespace" in view:
        view["namespace"] = ""  # only roots carry a namespace (topics/models.py)
    return view


def topic_attrs(view: Mapping[str, Any]) -> dict[str, list[bytes]]:
    """Directory attributes for a topic view (absent = inherit); the inverse of topic_view."""
    name = view["path"].rsplit(":", 1)[-1]
    attrs: dict[str, list[bytes]] = {
        "objectClass": [TOPIC_CLASS.encode()],
        "cn": [name.encode()],
        "hpwsnTopicName": [name.encode()],
    }
    for field, (attr, kind) in TOPIC_ATTRS.items():
        if field not in view:
            continue
        value = view[field]
        if value is None or value == "":
            attrs[attr] = []
        elif kind == "bool":
            attrs[attr] = [b"TRUE" if value else b"FALSE"]
        elif kind == "groups":
            attrs[attr] = [g.encode() for g in str(value).split(",") if g.strip()]
        else:
            attrs[attr] = [str(value).encode()]
    return attrs


def topic_view_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Names of the fields whose values differ."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


# ---------------------------------------------------------------- subscriptions

SUBSCRIPTION_ATTRS: dict[str, str] = {
    "consumer_address": "hpwsnConsumerAddress",
    "topic_expression": "hpwsnTopicExpression",
    "topic_dialect": "hpwsnTopicDialect",
    "content_filter": "hpwsnFilter",
    "content_dialect": "hpwsnFilterDialect",
    "termination_time": "hpwsnTerminationTime",
    "state": "hpwsnState",
    "mode": "hpwsnMode",
    "details": "hpwsnDetails",
    # The secret the broker signs the subscription's pushes with (hpwsn:SigningSecret): a peer
    # site refuses a link's unsigned pushes, so a restored subscription needs it. Only the broker
    # reads or writes it (slapd.conf).
    "signing_secret": "hpwsnSigningSecret",
}


def generalized_time(when: datetime | None) -> str:
    if when is None:
        return ""
    return when.astimezone(UTC).strftime("%Y%m%d%H%M%SZ")


def parse_generalized_time(text: str) -> datetime:
    core = text.strip().rstrip("Z").split(".")[0]
    return datetime.strptime(core, "%Y%m%d%H%M%S").replace(tzinfo=UTC)


def subscription_dn(subscription_id: str, base_dn: str) -> str:
    return f"hpwsnSubscriptionId={escape_dn_chars(subscription_id)},{base_dn}"


def subscription_attrs(view: Mapping[str, str]) -> dict[str, list[bytes]]:
    """Directory attributes of a subscription view (all values text; "" = absent)."""
    attrs: dict[str, list[bytes]] = {
        "objectClass": [SUBSCRIPTION_CLASS.encode()],
        "hpwsnSubscriptionId": [view["id"].encode()],
    }
    for field, attr in SUBSCRIPTION_ATTRS.items():
        value = view.get(field, "")
        attrs[attr] = [value.encode()] if value else []
    return attrs


def subscription_id_of(text: str) -> str:
    """The subscription id an entry's hpwsnSubscriptionId names. Raises EntryError."""
    try:
        # The broker looks ids up in UUID columns, where any other text fails the query.
        return str(uuid.UUID(text.strip()))
    except ValueError:
        raise EntryError(f"hpwsnSubscriptionId {text!r} is not a UUID") from None


def subscription_view_of_entry(entry: Entry) -> dict[str, str]:
    sub_id = entry.first("hpwsnSubscriptionId")
    if not sub_id:
        raise EntryError("the subscription has no hpwsnSubscriptionId")
    view = {"id": subscription_id_of(sub_id)}
    for field, attr in SUBSCRIPTION_ATTRS.items():
        view[field] = entry.first(attr) or ""
    if view["termination_time"]:
        try:
            view["termination_time"] = generalized_time(
                parse_generalized_time(view["termination_time"])
            )
        except ValueError:
            raise EntryError(f"bad hpwsnTerminationTime {view['termination_time']!r}") from None
    return view


# ---------------------------------------------------------------- publisher registrations

# Single-valued text fields of a registration view -> directory attribute.
REGISTRATION_ATTRS: dict[str, str] = {
    "publisher_address": "hpwsnPublisherAddress",
    "reference_address": "hpwsnReferenceAddress",
    "owner": "hpwsnOwner",
    "termination_time": "hpwsnTerminationTime",
    "created_at": "hpwsnCreatedTime",
}
_TIMES = ("termination_time", "created_at")


def registration_dn(registration_id: str, base_dn: str) -> str:
    return f"hpwsnRegistrationId={escape_dn_chars(registration_id)},{base_dn}"


def registration_attrs(view: Mapping[str, Any]) -> dict[str, list[bytes]]:
    """Directory attributes of a registration view ("" or no topic paths = absent)."""
    attrs: dict[str, list[bytes]] = {
        "objectClass": [REGISTRATION_CLASS.encode()],
        "hpwsnRegistrationId": [str(view["id"]).encode()],
        "hpwsnTopicPath": [p.encode() for p in view["topic_paths"]],
        "hpwsnDemand": [b"TRUE" if view["demand"] else b"FALSE"],
    }
    for field, attr in REGISTRATION_ATTRS.items():
        value = str(view.get(field) or "")
        attrs[attr] = [value.encode()] if value else []
    return attrs


def registration_view_of_entry(entry: Entry) -> dict[str, Any]:
    """The view of a registration entry: the form selectors.registration_view_of gives a row.
    Raises EntryError."""
    reg_id = entry.first("hpwsnRegistrationId")
    if not reg_id:
        raise EntryError("the registration has no hpwsnRegistrationId")
    try:
        reg_id = str(uuid.UUID(reg_id.strip()))
    except ValueError:
        raise EntryError(f"hpwsnRegistrationId {reg_id!r} is not a UUID") from None
    demand = entry.first("hpwsnDemand")
    view: dict[str, Any] = {
        "id": reg_id,
        "topic_paths": sorted({p.strip() for p in entry.all("hpwsnTopicPath") if p.strip()}),
        "demand": _bool(demand, "hpwsnDemand") if demand else False,
    }
    for field, attr in REGISTRATION_ATTRS.items():
        view[field] = entry.first(attr) or ""
    if not view["publisher_address"]:
        raise EntryError("the registration has no hpwsnPublisherAddress")
    for field in _TIMES:
        if view[field]:
            try:
                view[field] = generalized_time(parse_generalized_time(view[field]))
            except ValueError:
                attr = REGISTRATION_ATTRS[field]
                raise EntryError(f"bad {attr} {view[field]!r}") from None
    return view
