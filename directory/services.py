"""Writes that keep the LDAP directory and the Django mirror in step (docs/directory.md).

Topics go both ways with a three-way comparison against the view both sides last agreed on
(TopicLink.agreed): the side that differs from it changed; when both did, the directory wins (it
is the directory of record). Our own writes come back through syncrepl equal to the agreed view
and are dropped there, so nothing ping-pongs. Subscriptions are written to the directory through an
outbox (SubscriptionWrite) drained by a Celery task, so Subscribe never waits for LDAP; an
operator's edit of a subscription entry (state, termination time, removal) comes back to the broker.
Publisher registrations go the same way through their own outbox (RegistrationWrite), one way only
(directory/registrations.py).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import ldap
import ldap.modlist
from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from directory import mapping
from directory.ldapconn import DirectoryUnavailable, directory_configured, directory_connect
from directory.mapping import Entry, EntryError
from directory.models import OutboxWrite, RegistrationWrite, SubscriptionWrite, TopicLink
from directory.outbox import FLUSH_SCHED
from directory.registrations import (
    registration_entry_delete,
    registration_entry_write,
    registration_restore,
    registrations_repair_to_django,
    registrations_repair_to_ldap,
)
from directory.selectors import (
    Difference,
    DirectoryState,
    TopicsPlan,
    directory_differences,
    directory_entries,
    directory_state,
    registration_view_of,
    subscription_details,
    subscription_view_of,
    topic_fields,
    topic_view_of,
    topics_plan,
)
from federation.peers import interest_path_check, site_peers_check
from hpwsn import topicexpr
from hpwsn_site import state
from subscriptions.models import PublisherRegistration, PullPoint, Subscription
from subscriptions.services import (
    subscription_dedup_key,
    subscription_delete,
    subscription_set_state,
)
from topics.acl import ANONYMOUS_OWNER
from topics.changes import SUBSCRIPTION, TOPIC, change_record
from topics.models import Topic
from topics.selectors import topic_tree

log = logging.getLogger("directory")

TOPICS_LOCK = state.PREFIX + "dir:lock:topics"
FLUSH_LOCK = state.PREFIX + "dir:lock:flush"
HEALTH = state.PREFIX + "dir:health"  # hash: status, error, at (unix time)
SKIPPED = state.PREFIX + "dir:skipped"  # hash: entry DN -> why the loader skipped it


@dataclass
class SyncReport:
    """What one synchronisation pass did, by topic path (skipped: by DN, with the reason)."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)  # subscription and registration ids

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.moved or self.deleted)


# ---------------------------------------------------------------- shared helpers


@contextmanager
def _topics_lock() -> Iterator[None]:
    # One writer of topic links at a time: the sync process, the periodic push and reconcile.
    lock = state.get_redis().lock(TOPICS_LOCK, timeout=120, blocking_timeout=60)
    if not lock.acquire():
        raise DirectoryUnavailable("another directory synchronisation holds the topics lock")
    try:
        yield
    finally:
        with suppress(Exception):  # expired: the next holder is already in
            lock.release()


def directory_health_set(*, ok: bool, error: str = "") -> None:
    """Record the outcome of the latest contact with the directory (read by /healthz)."""
    state.get_redis().hset(
        HEALTH, mapping={"status": "ok" if ok else "degraded", "error": error, "at": time.time()}
    )


# ---------------------------------------------------------------- directory -> Django


def _known_paths() -> dict[str, str]:
    return {
        mapping.dn_normal(link.dn): link.topic.path
        for link in TopicLink.objects.select_related("topic").exclude(topic=None)
        if link.topic is not None
    }


def _relink_subtree(*, old_dn: str, new_dn: str, old_path: str, new_path: str) -> None:
    """After a move, the links below follow: their DNs and the paths they agreed on."""
    suffix = "," + mapping.dn_normal(old_dn)
    for link in TopicLink.objects.exclude(dn=""):
        norm = mapping.dn_normal(link.dn)
        if not norm.endswith(suffix):
            continue
        link.dn = norm[: -len(suffix)] + "," + new_dn
        agreed_path = str(link.agreed.get("path", ""))
        if agreed_path.startswith(old_path + ":"):
            link.agreed = {**link.agreed, "path": new_path + agreed_path[len(old_path) :]}
        link.save(update_fields=["dn", "agreed", "updated_at"])


def _move_topic(topic: Topic, *, new_path: str, parent: Topic | None) -> None:
    old_path = topic.path
    topic.name = new_path.rsplit(":", 1)[-1]
    topic.parent = parent
    topic.path = new_path
    topic.save(update_fields=["name", "parent", "path", "updated_at"])
    for child in Topic.objects.filter(path__startswith=old_path + ":"):
        child.path = new_path + child.path[len(old_path) :]
        child.save(update_fields=["path", "updated_at"])


def _apply_topic(
    entry: Entry, view: dict[str, Any], report: SyncReport, *, force: bool = False
) -> None:
    link = TopicLink.objects.select_related("topic").filter(entry_uuid=entry.uuid).first()
    if link is not None and link.topic is None:
        return  # deleted in Django: the push deletes the entry (Django's delete wins)
    if link is not None and link.agreed == view and not force:
        # Our own write coming back, or nothing new: at most the DN moved with an ancestor.
        if mapping.dn_normal(link.dn) != mapping.dn_normal(entry.dn):
            link.dn = entry.dn
            link.save(update_fields=["dn", "updated_at"])
        return
    path = view["path"]
    parent_path = path.rsplit(":", 1)[0] if ":" in path else None
    fields = [k for k in view if k != "path"]
    touched = [path]
    try:
        with transaction.atomic():
            parent = Topic.objects.get(path=parent_path) if parent_path else None
            topic = link.topic if link is not None else Topic.objects.filter(path=path).first()
            if topic is None:
                topic = Topic(name=path.rsplit(":", 1)[-1], parent=parent, path=path)
                for name in fields:
                    setattr(topic, name, view[name])
                topic.save(force_insert=True)
                report.created.append(path)
            else:
                before = topic_view_of(topic, fields)
                if topic.path != path:
                    old_path = topic.path
                    touched.append(old_path)
                    _move_topic(topic, new_path=path, parent=parent)
                    if link is not None:
                        _relink_subtree(
                            old_dn=link.dn, new_dn=entry.dn, old_path=old_path, new_path=path
                        )
                    report.moved.append(f"{old_path} -> {path}")
                changed = [n for n in fields if before.get(n) != view[n]]
                if changed:
                    for name in changed:
                        setattr(topic, name, view[name])
                    topic.save(update_fields=[*changed, "updated_at"])
                    report.updated.append(path)
            # A topic re-created in the directory (new entryUUID) drops its old link.
            TopicLink.objects.filter(topic=topic).exclude(entry_uuid=entry.uuid).delete()
            TopicLink.objects.update_or_create(
                entry_uuid=entry.uuid, defaults={"topic": topic, "dn": entry.dn, "agreed": view}
            )
            change_record(kind=TOPIC, keys=touched)
    except (DatabaseError, Topic.DoesNotExist, OverflowError) as exc:
        # e.g. a path already taken by an unlinked topic, or a value the column cannot hold
        # (SQLite's driver raises OverflowError, not a DatabaseError, for an integer too large)
        report.skipped.append((entry.dn, f"cannot apply to the broker's topics: {exc}"))


def _report_skipped(skipped: list[tuple[str, str]], *, replace: bool) -> None:
    r = state.get_redis()
    pipe = r.pipeline()
    if replace:
        pipe.delete(SKIPPED)
    for dn, reason in skipped:
        log.warning("directory: skipped %s: %s", dn, reason)
        pipe.hset(SKIPPED, dn, reason)
    pipe.execute()


def topics_apply_entries(*, entries: list[Entry], full: bool, force: bool = False) -> SyncReport:
    """Apply directory topic entries to the Django topics (full: the whole subtree, so topics
    whose entries are missing are deleted)."""
    report = SyncReport()
    if full:
        _require_topics_base(entries)
    with _topics_lock():
        plan = topics_plan(entries, known_paths={} if full else _known_paths())
        report.skipped.extend(plan.skipped)
        for entry_uuid in plan.order:
            _apply_topic(plan.entries[entry_uuid], plan.views[entry_uuid], report, force=force)
        if full:
            present = {e.uuid for e in entries}
            gone = TopicLink.objects.exclude(entry_uuid__in=present)
            report.deleted.extend(_delete_linked(gone))
    _report_skipped(report.skipped, replace=full)
    return report


def _require_topics_base(entries: Iterable[Entry]) -> None:
    # A directory that shows no ou=topics (a wrong base DN, an ACL that hides it, an empty
    # directory) must not read as "every topic was deleted".
    base = mapping.dn_normal(settings.HPWSN_LDAP_TOPICS_DN)
    if not any(mapping.dn_normal(e.dn) == base for e in entries):
        raise DirectoryUnavailable(
            f"{settings.HPWSN_LDAP_TOPICS_DN} is missing or not readable by "
            f"{settings.HPWSN_LDAP_BIND_DN}; the broker's topics are left as they are"
        )


def topics_delete_entries(*, entry_uuids: list[str]) -> SyncReport:
    """Entries deleted in the directory: delete their topics (and the subtrees below them)."""
    report = SyncReport()
    with _topics_lock():
        report.deleted.extend(_delete_linked(TopicLink.objects.filter(entry_uuid__in=entry_uuids)))
    return report


def _delete_linked(links: Any) -> list[str]:
    deleted = []
    with transaction.atomic():
        for link in links.select_related("topic"):
            if link.topic is not None:
                deleted.append(link.topic.path)
                link.topic.delete()
            link.delete()
        change_record(kind=TOPIC, keys=deleted)
    return deleted


def directory_load(*, conn: Any | None = None) -> SyncReport:
    """Start-up load: the directory's topic tree into the Django topics, breadth-first, then the
    subscriptions and publisher registrations the database lacks (a database rebuilt from an
    empty one) restored from their entries."""
    own = conn is None
    conn = conn or directory_connect()
    try:
        entries = directory_entries(conn, settings.HPWSN_LDAP_TOPICS_DN)
        sub_entries = directory_entries(conn, settings.HPWSN_LDAP_SUBSCRIPTIONS_DN)
        reg_entries = directory_entries(conn, settings.HPWSN_LDAP_REGISTRATIONS_DN)
    finally:
        if own:
            conn.unbind_s()
    report = topics_apply_entries(entries=entries, full=True)
    _restore_missing(
        sub_entries,
        report,
        object_class=mapping.SUBSCRIPTION_CLASS,
        view_of=mapping.subscription_view_of_entry,
        known=Subscription.objects.values_list("id", flat=True),
        pending=SubscriptionWrite.objects.values_list("subscription_id", flat=True),
        restore=subscription_restore,
        what="subscription",
    )
    _restore_missing(
        reg_entries,
        report,
        object_class=mapping.REGISTRATION_CLASS,
        view_of=mapping.registration_view_of_entry,
        known=PublisherRegistration.objects.values_list("id", flat=True),
        pending=RegistrationWrite.objects.values_list("registration_id", flat=True),
        restore=registration_restore,
        what="registration",
    )
    return report


def _restore_missing(
    entries: list[Entry],
    report: SyncReport,
    *,
    object_class: str,
    view_of: Callable[[Entry], dict[str, str]],
    known: Iterable[Any],
    pending: Iterable[Any],
    restore: Callable[..., Any],
    what: str,
) -> None:
    """Restore from their entries the objects of one kind the database lacks. Not one the broker
    removed (its entry's deletion is still queued: `pending`), nor one whose time is up."""
    skip = {str(i) for i in known} | {str(i) for i in pending}
    now_text = mapping.generalized_time(timezone.now())
    for entry in entries:
        if object_class.lower() not in entry.object_classes:
            continue
        try:
            view = view_of(entry)
        except EntryError as exc:
            report.skipped.append((entry.dn, str(exc)))
            continue
        if view["id"] in skip:
            continue
        if view["termination_time"] and view["termination_time"] <= now_text:
            continue
        try:
            with transaction.atomic():
                restore(view=view)
        except (ValueError, DatabaseError) as exc:
            report.skipped.append((entry.dn, f"cannot restore the {what}: {exc}"))
            continue
        report.restored.append(view["id"])


# ---------------------------------------------------------------- Django -> directory


def _ldap_views(conn: Any) -> tuple[TopicsPlan, dict[str, Entry]]:
    entries = directory_entries(conn, settings.HPWSN_LDAP_TOPICS_DN)
    return topics_plan(entries, known_paths={}), {e.uuid: e for e in entries}


def _entry_uuid(conn: Any, dn: str) -> str:
    results = conn.search_s(dn, ldap.SCOPE_BASE, "(objectClass=*)", ["entryUUID"])
    return str(results[0][1]["entryUUID"][0].decode())


def _delete_subtree(conn: Any, dn: str) -> None:
    try:
        below = conn.search_s(dn, ldap.SCOPE_SUBTREE, "(objectClass=*)", ["1.1"])
    except ldap.NO_SUCH_OBJECT:
        return
    for child_dn, _attrs in sorted(below, key=lambda r: -mapping.dn_depth(r[0])):
        with suppress(ldap.NO_SUCH_OBJECT):
            conn.delete_s(child_dn)


def _write_attrs(conn: Any, dn: str, view: dict[str, Any]) -> None:
    attrs = mapping.topic_attrs(view)
    mods = [(ldap.MOD_REPLACE, k, v) for k, v in attrs.items() if k not in ("objectClass", "cn")]
    conn.modify_s(dn, mods)


def topics_push(*, conn: Any | None = None, dry_run: bool = False) -> list[str]:
    """Write topics changed in Django since the last agreement to the directory; returns what
    it did (or would do), one line per topic."""
    own = conn is None
    conn = conn or directory_connect()
    try:
        with _topics_lock():
            done: list[str] = []
            # A move changes the DNs below it: plan again from a fresh read (a few rounds at most).
            for _round in range(5):
                moved = _push_round(conn, done, dry_run=dry_run)
                if not moved or dry_run:
                    break
            return done
    finally:
        if own:
            conn.unbind_s()


def _push_round(conn: Any, done: list[str], *, dry_run: bool, force: bool = False) -> bool:
    fields = topic_fields()
    topics_base = settings.HPWSN_LDAP_TOPICS_DN
    plan, by_uuid = _ldap_views(conn)
    by_dn = {mapping.dn_normal(e.dn): e for e in by_uuid.values()}
    links = {link.topic_id: link for link in TopicLink.objects.exclude(topic=None)}
    dn_of_path: dict[str, str] = {}
    topics = sorted(Topic.objects.all(), key=lambda t: (t.path.count(":"), t.path))
    for topic in topics:
        view = topic_view_of(topic, fields)
        link = links.get(topic.pk)
        parent_dn = topics_base
        if topic.parent_id is not None:
            parent_path = topic.path.rsplit(":", 1)[0]
            if parent_path not in dn_of_path:
                continue  # the parent is not in the directory (yet)
            parent_dn = dn_of_path[parent_path]
        target = mapping.topic_dn(topic.name, parent_dn)
        if link is not None and force and link.entry_uuid not in by_uuid:
            if not dry_run:
                link.delete()
            link = None  # its entry is gone: write it again
        if link is None:
            existing = by_dn.get(mapping.dn_normal(target))
            if existing is not None:
                if force and plan.views.get(existing.uuid) != view:
                    done.append(f"modify {topic.path}")
                    if not dry_run:
                        _write_attrs(conn, existing.dn, view)
                        TopicLink.objects.filter(topic=topic).delete()
                        TopicLink.objects.update_or_create(
                            entry_uuid=existing.uuid,
                            defaults={"topic": topic, "dn": existing.dn, "agreed": view},
                        )
                    dn_of_path[topic.path] = existing.dn
                    continue
                if plan.views.get(existing.uuid) == view and not dry_run:
                    TopicLink.objects.update_or_create(
                        entry_uuid=existing.uuid,
                        defaults={"topic": topic, "dn": existing.dn, "agreed": view},
                    )
                    dn_of_path[topic.path] = existing.dn
                # else: differs, the directory side wins and the sync process adopts it
                continue
            done.append(f"add {topic.path}")
            if not dry_run:
                try:
                    conn.add_s(target, ldap.modlist.addModlist(mapping.topic_attrs(view)))
                except ldap.ALREADY_EXISTS:
                    done[-1] = _dn_taken(topic.path, target)
                    continue  # it and its subtree stay out; the other topics are still written
                try:
                    TopicLink.objects.update_or_create(
                        entry_uuid=_entry_uuid(conn, target),
                        defaults={"topic": topic, "dn": target, "agreed": view},
                    )
                except IntegrityError:
                    # Deleted in Django since this round read it: its entry goes again, or the
                    # sync process would make the topic anew from it.
                    _delete_subtree(conn, target)
                    done.append(f"delete {topic.path} (deleted while it was added)")
                    continue
            dn_of_path[topic.path] = target
            continue
        entry = by_uuid.get(link.entry_uuid)
        if entry is None:
            continue  # deleted in the directory: the sync process deletes the topic
        dn_of_path[topic.path] = entry.dn
        if link.agreed == view:
            continue
        ldap_view = plan.views.get(link.entry_uuid)
        if ldap_view is not None and ldap_view != link.agreed and not force:
            continue  # changed on both sides: the directory wins
        if force and ldap_view == view:
            if not dry_run:
                link.agreed = view
                link.save(update_fields=["agreed", "updated_at"])
            continue
        if mapping.dn_normal(entry.dn) != mapping.dn_normal(target):
            done.append(f"move {link.agreed.get('path', entry.dn)} -> {topic.path}")
            if not dry_run:
                try:
                    conn.rename_s(entry.dn, mapping.topic_rdn(topic.name), parent_dn, delold=1)
                except ldap.ALREADY_EXISTS:
                    done[-1] = _dn_taken(topic.path, target)
                    continue
                _write_attrs(conn, target, view)
                _relink_subtree(
                    old_dn=entry.dn,
                    new_dn=target,
                    old_path=str(link.agreed.get("path", "")),
                    new_path=topic.path,
                )
                link.dn, link.agreed = target, view
                link.save(update_fields=["dn", "agreed", "updated_at"])
                return True
            continue
        done.append(f"modify {topic.path}: {', '.join(mapping.topic_view_diff(link.agreed, view))}")
        if not dry_run:
            _write_attrs(conn, entry.dn, view)
            link.agreed = view
            link.save(update_fields=["agreed", "updated_at"])
    # Topics deleted in Django: their entries go, deepest first.
    orphans = sorted(
        TopicLink.objects.filter(topic=None), key=lambda link: -mapping.dn_depth(link.dn)
    )
    for link in orphans:
        done.append(f"delete {link.agreed.get('path', link.dn)}")
        if not dry_run:
            entry = by_uuid.get(link.entry_uuid)
            _delete_subtree(conn, entry.dn if entry is not None else link.dn)
            link.delete()
    return False


def _dn_taken(path: str, dn: str) -> str:
    # The directory compares cn without case: two topics whose names differ only in case are
    # two topics in the broker but one DN in the directory. The first one written keeps it; the
    # other is reported at every push until it is renamed.
    return f"cannot write {path}: {dn} is another topic's entry"


# ---------------------------------------------------------------- outbox -> directory


def _upsert_subscription(conn: Any, view: dict[str, str]) -> None:
    dn = mapping.subscription_dn(view["id"], settings.HPWSN_LDAP_SUBSCRIPTIONS_DN)
    attrs = mapping.subscription_attrs(view)
    try:
        conn.add_s(dn, ldap.modlist.addModlist(attrs))
    except ldap.ALREADY_EXISTS:
        mods = [
            (ldap.MOD_REPLACE, k, v)
            for k, v in attrs.items()
            # Absent, the signing secret is left out: a directory of one's own whose schema
            # predates the attribute still takes the writes of unsigned subscriptions.
            if k != "objectClass" and (v or k != "hpwsnSigningSecret")
        ]
        conn.modify_s(dn, mods)


def _delete_subscription(conn: Any, sub_id: str) -> None:
    with suppress(ldap.NO_SUCH_OBJECT):
        conn.delete_s(mapping.subscription_dn(sub_id, settings.HPWSN_LDAP_SUBSCRIPTIONS_DN))


def outbox_flush(*, limit: int = 500) -> int:
    """Write the due outbox rows (subscriptions, then publisher registrations) to the directory;
    returns how many were written.

    A failure leaves the row with a later due time (exponential back-off) and marks the directory
    degraded; nothing is dropped.
    """
    if not directory_configured():
        return 0
    r = state.get_redis()
    r.delete(FLUSH_SCHED)
    lock = r.lock(FLUSH_LOCK, timeout=120, blocking_timeout=0)
    if not lock.acquire():
        return 0  # another flush is running; it or the next beat tick takes the rest
    written = 0
    try:
        now = timezone.now()
        sub_rows = list(SubscriptionWrite.objects.filter(next_try_at__lte=now)[:limit])
        reg_rows = list(RegistrationWrite.objects.filter(next_try_at__lte=now)[:limit])
        rows: list[OutboxWrite] = [*sub_rows, *reg_rows]
        if not rows:
            return 0
        try:
            conn = directory_connect()
        except DirectoryUnavailable as exc:
            _postpone(rows, str(exc))
            directory_health_set(ok=False, error=str(exc))
            return 0
        objects = _Outboxed(
            subs=Subscription.objects.in_bulk([row.subscription_id for row in sub_rows]),
            regs=PublisherRegistration.objects.in_bulk([row.registration_id for row in reg_rows]),
        )
        try:
            for index, row in enumerate(rows):
                try:
                    objects.write(conn, row)
                except ldap.LDAPError as exc:
                    _postpone([row], f"{type(exc).__name__}: {exc}")
                    if isinstance(exc, ldap.SERVER_DOWN | ldap.TIMEOUT):
                        directory_health_set(ok=False, error=str(exc))
                        _postpone(rows[index + 1 :], "directory went away")
                        return written
                    continue
                type(row)._default_manager.filter(pk=row.pk, version=row.version).delete()
                written += 1
        finally:
            conn.unbind_s()
        directory_health_set(ok=True)
        return written
    finally:
        with suppress(Exception):  # expired
            lock.release()


@dataclass
class _Outboxed:
    """The objects of one flush's outbox rows, read once; a missing one has been removed."""

    subs: dict[Any, Subscription]
    regs: dict[Any, PublisherRegistration]

    def write(self, conn: Any, row: OutboxWrite) -> None:
        """The object's current state to its entry, or the entry's removal."""
        if isinstance(row, SubscriptionWrite):
            sub = self.subs.get(row.subscription_id)
            if sub is None:
                _delete_subscription(conn, str(row.subscription_id))
            else:
                _upsert_subscription(conn, subscription_view_of(sub))
        elif isinstance(row, RegistrationWrite):
            reg = self.regs.get(row.registration_id)
            if reg is None:
                registration_entry_delete(conn, str(row.registration_id))
            else:
                registration_entry_write(conn, registration_view_of(reg))


def _postpone(rows: list[OutboxWrite], error: str) -> None:
    now = timezone.now()
    for row in rows:
        delay = min(
            settings.HPWSN_LDAP_RETRY_S * (2**row.attempts), settings.HPWSN_LDAP_RETRY_MAX_S
        )
        # Conditional on the version: a newer change keeps its own (immediate) due time.
        type(row)._default_manager.filter(pk=row.pk, version=row.version).update(
            attempts=F("attempts") + 1,
            next_try_at=now + timedelta(seconds=delay),
            last_error=error[:1000],
        )


# ---------------------------------------------------------------- reconcile

DIRECTIONS = ("ldap-to-django", "django-to-ldap")


def directory_reconcile(
    *, direction: str | None, dry_run: bool
) -> tuple[list[Difference], list[str]]:
    """Every difference between the directory and Django, and what was (with dry_run: would
    be) done to repair them in the direction asked (None: report only)."""
    if direction is not None and direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}")
    conn = directory_connect()
    try:
        st = directory_state(conn=conn)
        _require_topics_base(st.ldap_topic_entries)
        diffs = directory_differences(st)
        if direction is None or not diffs:
            return diffs, []
        if direction == "django-to-ldap":
            return diffs, _repair_to_ldap(conn, st, diffs, dry_run=dry_run)
        return diffs, _repair_to_django(conn, st, diffs, dry_run=dry_run)
    finally:
        conn.unbind_s()


def _repair_to_ldap(
    conn: Any, st: DirectoryState, diffs: list[Difference], *, dry_run: bool
) -> list[str]:
    done: list[str] = []
    topic_diffs = [d for d in diffs if d.kind == "topic"]
    if topic_diffs:
        with _topics_lock():
            # Forget what was agreed for the differing topics: Django's side is taken as changed.
            differing = [d.name for d in topic_diffs if d.what.startswith("differs")]
            if not dry_run:
                TopicLink.objects.filter(topic__path__in=differing).update(agreed={})
            for _round in range(5):
                if not _push_round(conn, done, dry_run=dry_run, force=True) or dry_run:
                    break
            # Entries that are not topics in Django go, deepest first.
            doomed = [
                st.ldap_topics[d.name] for d in topic_diffs if d.what == "only in the directory"
            ]
            by_path = {
                v["path"]: u
                for u, v in topics_plan(st.ldap_topic_entries, known_paths={}).views.items()
            }
            entries = {e.uuid: e for e in st.ldap_topic_entries}
            for view in sorted(doomed, key=lambda v: -v["path"].count(":")):
                done.append(f"delete {view['path']} from the directory")
                if not dry_run:
                    entry_uuid = by_path[view["path"]]
                    _delete_subtree(conn, entries[entry_uuid].dn)
                    TopicLink.objects.filter(entry_uuid=entry_uuid).delete()
    for d in diffs:
        if d.kind != "subscription":
            continue
        if d.what == "only in the directory":
            done.append(f"delete subscription {d.name} from the directory")
            if not dry_run:
                _delete_subscription(conn, d.name)
        else:
            done.append(f"write subscription {d.name} to the directory")
            if not dry_run:
                _upsert_subscription(conn, st.django_subs[d.name])
    done += registrations_repair_to_ldap(
        conn,
        names=[(d.name, d.what) for d in diffs if d.kind == "registration"],
        django_regs=st.django_regs,
        dry_run=dry_run,
    )
    return done


def _repair_to_django(
    conn: Any, st: DirectoryState, diffs: list[Difference], *, dry_run: bool
) -> list[str]:
    done: list[str] = []
    topic_diffs = [d for d in diffs if d.kind == "topic"]
    if topic_diffs:
        for d in topic_diffs:
            verb = {"only in the directory": "create", "only in Django": "delete"}.get(
                d.what, "update"
            )
            done.append(f"{verb} topic {d.name} in Django")
        if not dry_run:
            report = topics_apply_entries(entries=st.ldap_topic_entries, full=True, force=True)
            gone = [d.name for d in topic_diffs if d.what == "only in Django"]
            with transaction.atomic():
                # Deepest first; a parent's delete may already have taken its children.
                for path in sorted(gone, key=lambda p: -p.count(":")):
                    Topic.objects.filter(path=path).delete()
                change_record(kind=TOPIC, keys=gone)
            done.extend(f"skipped {dn}: {why}" for dn, why in report.skipped)

    for d in diffs:
        if d.kind != "subscription":
            continue
        if d.what == "only in Django":
            done.append(f"delete subscription {d.name} in Django")
            if not dry_run:
                subscription_delete(subscription_id=d.name)
            continue
        view = st.ldap_subs[d.name]
        done.append(f"restore subscription {d.name} in Django from the directory")
        if dry_run:
            continue
        try:
            with transaction.atomic():
                Subscription.objects.filter(id=d.name).delete()
                subscription_restore(view=view)
        except (ValueError, IntegrityError) as exc:
            done.append(f"cannot restore subscription {d.name}: {exc}")
    done += registrations_repair_to_django(
        names=[(d.name, d.what) for d in diffs if d.kind == "registration"],
        ldap_regs=st.ldap_regs,
        dry_run=dry_run,
    )
    return done


def subscription_restore(*, view: dict[str, str]) -> Subscription:
    """Re-create a subscription from its directory entry (same id, so references stay valid),
    with its signing secret and the sites a peer's link spares."""
    details = subscription_details(view)
    topic_nsmap = dict(details.get("topic_nsmap") or {})
    topic_path = ""
    expr = None
    if view["topic_expression"]:
        try:
            expr = topicexpr.parse(
                view["topic_expression"], view["topic_dialect"] or None, topic_nsmap
            )
        except topicexpr.TopicExpressionError as exc:
            raise ValueError(f"topic expression: {exc}") from None
        if expr.is_concrete:
            root_ns, names, any_ns = expr.concrete()
            node = topic_tree(max_age=0).resolve(root_ns, names, any_ns)
            if node is None:
                raise ValueError(f"topic {view['topic_expression']!r} is not in the topic tree")
            topic_path = node.path
    mode = view["mode"] or Subscription.Mode.PUSH
    owner = str(details.get("owner") or ANONYMOUS_OWNER)
    interest_path = (
        interest_path_check(list(details["interest_path"])) if details.get("interest_path") else ()
    )
    pull_point = None
    if details.get("pull_point"):
        pull_point, _ = PullPoint.objects.get_or_create(
            id=details["pull_point"],
            defaults={
                "address": view["consumer_address"] if mode == "pull" else "",
                "owner": owner,
            },
        )
    dedup_key = details.get("dedup_key") or subscription_dedup_key(
        owner=owner,
        mode=mode,
        target=view["consumer_address"],
        canonical=expr.canonical() if expr else "*",
        content_dialect=view["content_dialect"],
        content_filter=view["content_filter"],
        filter_parameters=details.get("filter_parameters") or (),
        producer_filter=str(details.get("producer_filter") or ""),
        format=str(details.get("format") or Subscription.Format.WSN),
        interest_path=interest_path,
        signing_secret=view.get("signing_secret", ""),
    )
    termination = (
        mapping.parse_generalized_time(view["termination_time"])
        if view["termination_time"]
        else None
    )
    with transaction.atomic():
        sub = Subscription.objects.create(
            id=uuid.UUID(view["id"]),
            consumer_address=view["consumer_address"],
            reference_address=str(details.get("reference_address") or ""),
            mode=mode,
            pull_point=pull_point,
            topic_expression=view["topic_expression"],
            topic_dialect=view["topic_dialect"],
            topic_nsmap=topic_nsmap,
            topic_path=topic_path,
            content_filter=view["content_filter"],
            content_dialect=view["content_dialect"],
            content_nsmap=dict(details.get("content_nsmap") or {}),
            filter_parameters=list(details.get("filter_parameters") or []),
            producer_filter=str(details.get("producer_filter") or ""),
            producer_dialect=str(details.get("producer_dialect") or ""),
            dedup_key=dedup_key,
            owner=owner,
            soap_version=str(details.get("soap_version") or "1.1"),
            use_raw=bool(details.get("use_raw")),
            format=str(details.get("format") or Subscription.Format.WSN),
            interest_path=list(interest_path),
            site_peers=list(site_peers_check(list(details.get("site_peers") or ()))),
            signing_secret=view.get("signing_secret", ""),
            state=view["state"] or Subscription.State.ACTIVE,
            termination_time=termination,
        )
        change_record(kind=SUBSCRIPTION, keys=[str(sub.id)])
    return sub


# ---------------------------------------------------------------- subscription entries -> broker


def subscription_entry_apply(*, entry: Entry) -> str:
    """Apply an operator's edit of a subscription entry (state, termination time) to the broker;
    returns what it did ("" when nothing)."""
    try:
        view = mapping.subscription_view_of_entry(entry)
    except EntryError as exc:
        _report_skipped([(entry.dn, str(exc))], replace=False)
        return ""
    if SubscriptionWrite.objects.filter(subscription_id=view["id"]).exists():
        return ""  # the broker's own newer change is on its way to the directory: it wins
    modifier = entry.first("modifiersName")
    if modifier and mapping.dn_normal(modifier) == mapping.dn_normal(settings.HPWSN_LDAP_BIND_DN):
        # The echo of the broker's own write. It may be older than the database (a pause written
        # and already flushed after it), so it must never be applied back.
        return ""
    sub = Subscription.objects.filter(id=view["id"]).first()
    if sub is None:
        return ""  # not the broker's (anymore); reconcile restores lost subscriptions
    current = subscription_view_of(sub)
    done = []
    # The termination time first: the state change below queues the write of the whole
    # subscription back to the directory, which must then carry both values.
    if view["termination_time"] != current["termination_time"]:
        when = (
            mapping.parse_generalized_time(view["termination_time"])
            if view["termination_time"]
            else None
        )
        # A time in the past ends the subscription at the next expiry sweep, as a Renew would.
        with transaction.atomic():
            Subscription.objects.filter(id=sub.id).update(
                termination_time=when, updated_at=timezone.now()
            )
            change_record(kind=SUBSCRIPTION, keys=[str(sub.id)])
        done.append(f"termination time {view['termination_time'] or 'none'}")
    if view["state"] != current["state"] and view["state"] in ("active", "paused"):
        subscription_set_state(subscription_id=view["id"], paused=view["state"] == "paused")
        # The directory already holds this state: drop the write the service just queued, unless
        # another change joined it meanwhile (it would then be at version 2 or more).
        SubscriptionWrite.objects.filter(subscription_id=view["id"], version=1).delete()
        done.append(f"state {view['state']}")
    return f"subscription {view['id']}: {', '.join(done)}" if done else ""


def subscription_entry_deleted(*, subscription_id: str) -> str:
    """An operator deleted a subscription's entry: unsubscribe it (unless the broker has a newer
    change of it on the way)."""
    if SubscriptionWrite.objects.filter(subscription_id=subscription_id).exists():
        return ""
    if not Subscription.objects.filter(id=subscription_id).exists():
        return ""
    subscription_delete(subscription_id=subscription_id)
    return f"subscription {subscription_id}: removed"
