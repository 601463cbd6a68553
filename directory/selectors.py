"""Reads of the directory and of its Django mirror: views, differences, health."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import ldap
from django.conf import settings

from directory import mapping
from directory.mapping import Entry, EntryError
from directory.models import RegistrationWrite, SubscriptionWrite
from hpwsn_site import state
from subscriptions.models import PublisherRegistration, Subscription
from topics.acl import ANONYMOUS_OWNER
from topics.models import Topic


def topic_fields() -> list[str]:
    """The policy fields the Topic model has that the directory carries."""
    names = {f.name for f in Topic._meta.get_fields()}
    return [name for name in mapping.TOPIC_ATTRS if name in names]


def topic_view_of(topic: Topic, fields: Iterable[str]) -> dict[str, Any]:
    """The view of a Django topic, in the canonical form mapping.topic_view produces."""
    view: dict[str, Any] = {"path": topic.path}
    for name in fields:
        value = getattr(topic, name)
        kind = mapping.TOPIC_ATTRS[name][1]
        if kind == "groups":
            value = ",".join(sorted({g.strip() for g in (value or "").split(",") if g.strip()}))
        elif kind == "reliability":
            value = (value or "").lower()
        elif kind == "schedule":
            value = ",".join(p.strip() for p in (value or "").split(",")) if value else ""
        elif kind in ("bool", "int", "priority"):
            value = value if value is None else (bool(value) if kind == "bool" else int(value))
        else:
            value = value or ""
        view[name] = value
    if topic.parent_id is not None and "namespace" in view:
        view["namespace"] = ""
    return view


def directory_entries(conn: Any, base: str) -> list[Entry]:
    try:
        results = conn.search_s(base, ldap.SCOPE_SUBTREE, "(objectClass=*)", ["*", "entryUUID"])
    except ldap.NO_SUCH_OBJECT:
        return []
    out = []
    for dn, attrs in results:
        if dn is None:  # search continuation references
            continue
        raw_uuid = attrs.get("entryUUID", [b""])[0].decode()
        out.append(Entry(dn=dn, attrs=attrs, uuid=raw_uuid))
    return out


@dataclass
class TopicsPlan:
    """Directory topic entries resolved into views, breadth-first (thesis figure 5-6)."""

    views: dict[str, dict[str, Any]]  # entry uuid -> view
    entries: dict[str, Entry]  # entry uuid -> entry
    order: list[str]  # entry uuids, parents first
    skipped: list[tuple[str, str]]


def topics_plan(entries: Iterable[Entry], *, known_paths: dict[str, str]) -> TopicsPlan:
    """Resolve topic entries level by level; known_paths: normalised DN -> path of linked topics.

    An entry that cannot be used is reported by DN and skipped together with its subtree.
    """
    base = mapping.dn_normal(settings.HPWSN_LDAP_TOPICS_DN)
    fields = topic_fields()
    paths = dict(known_paths)
    skipped_dns: set[str] = set()
    plan = TopicsPlan(views={}, entries={}, order=[], skipped=[])
    seen_paths: dict[str, str] = {}
    for entry in sorted(entries, key=lambda e: mapping.dn_depth(e.dn)):
        norm = mapping.dn_normal(entry.dn)
        if norm == base or not mapping.dn_is_below(entry.dn, settings.HPWSN_LDAP_TOPICS_DN):
            continue
        parent = mapping.dn_normal(mapping.dn_parent(entry.dn))
        reason = ""
        classes = entry.object_classes
        if parent in skipped_dns:
            reason = "its parent entry was skipped"
        elif "alias" in classes:
            target = entry.first("aliasedObjectName") or ""
            if target and mapping.dn_is_below(entry.dn, target):
                reason = f"cycle: an alias to its own ancestor {target}"
            else:
                reason = "an alias is not a topic (aliases are not followed)"
        elif mapping.TOPIC_CLASS.lower() not in classes:
            reason = "not a topic entry (objectClass hpwsnTopic)"
        elif parent != base and parent not in paths:
            reason = "its parent is not a topic"
        if not reason:
            try:
                view = mapping.topic_view(
                    entry, parent_path=None if parent == base else paths[parent], fields=fields
                )
            except EntryError as exc:
                reason = str(exc)
            else:
                other = seen_paths.get(view["path"])
                if other is not None:
                    reason = f"topic {view['path']} is already defined by {other}"
        if reason:
            plan.skipped.append((entry.dn, reason))
            skipped_dns.add(norm)
            continue
        seen_paths[view["path"]] = entry.dn
        paths[norm] = view["path"]
        plan.views[entry.uuid] = view
        plan.entries[entry.uuid] = entry
        plan.order.append(entry.uuid)
    return plan


def subscription_view_of(sub: Subscription) -> dict[str, str]:
    """The directory view of a subscription: what restores it as it was."""
    details = {
        "reference_address": sub.reference_address,
        "topic_nsmap": sub.topic_nsmap,
        "content_nsmap": sub.content_nsmap,
        "soap_version": sub.soap_version,
        "use_raw": sub.use_raw,
        "dedup_key": sub.dedup_key,
        "pull_point": str(sub.pull_point_id) if sub.pull_point_id else "",
    }
    if sub.owner != ANONYMOUS_OWNER:
        # Who may act on it (topics.acl.may_act_on). Left out when anonymous, so entries written
        # before owners existed still agree with their subscriptions.
        details["owner"] = sub.owner
    # Only when set, so the entries of subscriptions without them read as before (no drift).
    if sub.filter_parameters:
        details["filter_parameters"] = sub.filter_parameters
    if sub.producer_filter:
        details["producer_filter"] = sub.producer_filter
        details["producer_dialect"] = sub.producer_dialect
    if sub.format != Subscription.Format.WSN:  # entries of wsn subscriptions stay as they were
        details["format"] = sub.format
    if sub.interest_path:
        details["interest_path"] = sub.interest_path
    if sub.site_peers:
        details["site_peers"] = sub.site_peers
    return {
        "id": str(sub.id),
        "consumer_address": sub.consumer_address,
        "topic_expression": sub.topic_expression,
        "topic_dialect": sub.topic_dialect,
        "content_filter": sub.content_filter,
        "content_dialect": sub.content_dialect,
        "termination_time": mapping.generalized_time(sub.termination_time),
        "state": sub.state,
        "mode": sub.mode,
        "details": json.dumps(details, sort_keys=True, separators=(",", ":")),
        "signing_secret": sub.signing_secret,
    }


def registration_view_of(reg: PublisherRegistration) -> dict[str, Any]:
    """The directory view of a publisher registration (its demand state stays in the database:
    it changes with every subscriber here, and a restored registration rebuilds it)."""
    return {
        "id": str(reg.id),
        "publisher_address": reg.publisher_address,
        "reference_address": reg.reference_address,
        "topic_paths": sorted(set(reg.topic_paths)),
        "demand": reg.demand,
        "owner": reg.owner,
        "termination_time": mapping.generalized_time(reg.termination_time),
        "created_at": mapping.generalized_time(reg.created_at),
    }


# ---------------------------------------------------------------- differences


@dataclass(frozen=True)
class Difference:
    """One difference between the directory and the Django mirror, named for an operator."""

    kind: str  # topic | subscription | registration | entry
    name: str  # topic path, subscription or registration id, or entry DN
    what: str  # only in the directory | only in Django | differs: ... | skipped: ...

    def __str__(self) -> str:
        return f"{self.kind} {self.name}: {self.what}"


def _differs(a: dict[str, Any], b: dict[str, Any]) -> str:
    fields = mapping.topic_view_diff(a, b)
    return "differs: " + "; ".join(
        f"{f} (Django {a.get(f)!r}, directory {b.get(f)!r})" for f in fields
    )


@dataclass
class DirectoryState:
    """Both sides read at one moment, keyed the way reconcile repairs them."""

    ldap_topics: dict[str, dict[str, Any]]  # path -> view
    ldap_topic_entries: list[Entry]
    django_topics: dict[str, dict[str, Any]]
    skipped: list[tuple[str, str]]
    ldap_subs: dict[str, dict[str, str]]  # id -> view
    django_subs: dict[str, dict[str, str]]
    ldap_regs: dict[str, dict[str, Any]]  # id -> view
    django_regs: dict[str, dict[str, Any]]


def directory_state(*, conn: Any) -> DirectoryState:
    entries = directory_entries(conn, settings.HPWSN_LDAP_TOPICS_DN)
    plan = topics_plan(entries, known_paths={})
    fields = topic_fields()
    ldap_subs: dict[str, dict[str, str]] = {}
    skipped = list(plan.skipped)
    for entry in directory_entries(conn, settings.HPWSN_LDAP_SUBSCRIPTIONS_DN):
        if mapping.SUBSCRIPTION_CLASS.lower() not in entry.object_classes:
            continue
        try:
            view = mapping.subscription_view_of_entry(entry)
        except EntryError as exc:
            skipped.append((entry.dn, str(exc)))
            continue
        ldap_subs[view["id"]] = view
    ldap_regs: dict[str, dict[str, Any]] = {}
    for entry in directory_entries(conn, settings.HPWSN_LDAP_REGISTRATIONS_DN):
        if mapping.REGISTRATION_CLASS.lower() not in entry.object_classes:
            continue
        try:
            reg_view = mapping.registration_view_of_entry(entry)
        except EntryError as exc:
            skipped.append((entry.dn, str(exc)))
            continue
        ldap_regs[reg_view["id"]] = reg_view
    return DirectoryState(
        ldap_topics={v["path"]: v for v in plan.views.values()},
        ldap_topic_entries=entries,
        django_topics={t.path: topic_view_of(t, fields) for t in Topic.objects.all()},
        skipped=skipped,
        ldap_subs=ldap_subs,
        django_subs={str(s.id): subscription_view_of(s) for s in Subscription.objects.all()},
        ldap_regs=ldap_regs,
        django_regs={
            str(r.id): registration_view_of(r) for r in PublisherRegistration.objects.all()
        },
    )


def directory_differences(st: DirectoryState) -> list[Difference]:
    """Every difference between the two sides, topics first (by path), then subscriptions, then
    publisher registrations."""
    return [
        *_compare("topic", st.django_topics, st.ldap_topics),
        *(Difference("entry", dn, f"skipped: {reason}") for dn, reason in st.skipped),
        *_compare("subscription", st.django_subs, st.ldap_subs),
        *_compare("registration", st.django_regs, st.ldap_regs),
    ]


def _compare(
    kind: str, django: Mapping[str, dict[str, Any]], ldap: Mapping[str, dict[str, Any]]
) -> list[Difference]:
    out = []
    for name in sorted(set(ldap) | set(django)):
        a, b = django.get(name), ldap.get(name)
        if a is None:
            out.append(Difference(kind, name, "only in the directory"))
        elif b is None:
            out.append(Difference(kind, name, "only in Django"))
        elif a != b:
            out.append(Difference(kind, name, _differs(a, b)))
    return out


# ---------------------------------------------------------------- health


def directory_health(*, stale_after_s: float = 30.0) -> dict[str, Any]:
    """not_configured, ok, or degraded (with the error and the writes waiting for it)."""
    if not settings.HPWSN_LDAP_URL:
        return {"status": "not_configured"}
    raw = state.get_redis().hgetall(state.PREFIX + "dir:health")
    info = {k.decode(): v.decode() for k, v in raw.items()}
    pending = SubscriptionWrite.objects.count() + RegistrationWrite.objects.count()
    failing = (
        SubscriptionWrite.objects.filter(attempts__gt=0).count()
        + RegistrationWrite.objects.filter(attempts__gt=0).count()
    )
    out: dict[str, Any] = {
        "status": "ok",
        "url": settings.HPWSN_LDAP_URL,
        "pending_writes": pending,
    }
    age = time.time() - float(info.get("at", 0) or 0)
    if not info:
        out["status"], out["error"] = "degraded", "no contact with the directory yet"
    elif info.get("status") != "ok":
        out["status"], out["error"] = "degraded", info.get("error", "")
    elif age > stale_after_s:
        out["status"] = "degraded"
        out["error"] = f"no contact with the directory for {age:.0f} s (is directory_sync running?)"
    elif failing:
        out["status"], out["error"] = "degraded", f"{failing} directory writes are being retried"
    return out


def subscription_details(view: dict[str, str]) -> dict[str, Any]:
    try:
        value = json.loads(view.get("details") or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
