"""The long-running directory synchronisation (`manage.py directory_sync`).

One RFC 4533 refreshAndPersist search (python-ldap's SyncreplConsumer against slapd's syncprov
overlay) over the whole base DN. Each connection starts without a cookie, so its refresh phase
hands over every entry: that is the start-up load, applied breadth-first in one pass, and it also
finds the topics deleted while the broker was away. The persist phase then delivers each change
made with ldapadd / ldapmodify / ldapdelete / ldapmodrdn within milliseconds. Between messages the
loop pushes topics changed in Django (topic tree version bump, and every 30 s) to the directory.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import ldap
import ldap.filter
from django.conf import settings
from django.db import close_old_connections
from ldap.ldapobject import SimpleLDAPObject
from ldap.syncrepl import SyncreplConsumer

from directory import mapping, services
from directory.ldapconn import DirectoryUnavailable, describe_error, directory_connect
from directory.mapping import Entry, EntryError
from hpwsn_site import state

log = logging.getLogger("directory")

POLL_S = 0.25
PUSH_EVERY_S = 30.0
HEARTBEAT_S = 5.0
BACKOFF_MAX_S = 10.0


class _Consumer(SimpleLDAPObject, SyncreplConsumer):  # type: ignore[misc]
    def __init__(self, uri: str, runner: DirectorySync) -> None:
        super().__init__(uri)
        self.runner = runner

    # No cookie kept: every (re)connection refreshes fully (see the module docstring).
    def syncrepl_get_cookie(self) -> None:
        return None

    def syncrepl_set_cookie(self, cookie: Any) -> None:
        pass

    def syncrepl_entry(self, dn: str, attributes: dict[str, list[bytes]], uuid: str) -> None:
        self.runner.on_entry(Entry(dn=dn, attrs=attributes, uuid=str(uuid).lower()))

    def syncrepl_delete(self, uuids: list[str]) -> None:
        self.runner.on_delete([str(u).lower() for u in uuids])

    def syncrepl_present(self, uuids: Any, refreshDeletes: bool = False) -> None:
        pass

    def syncrepl_refreshdone(self) -> None:
        self.runner.on_refresh_done()


class DirectorySync:
    """Follows the directory and keeps the broker's topics and subscriptions in step with it;
    stop() ends run()."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.refreshing = True
        self.refresh_entries: list[Entry] = []
        self.pending: list[tuple[str, Any]] = []
        self.loaded_this_session = False
        # entryUUID -> subscription id, so that a delete event (which carries only the UUID) can
        # name the subscription.
        self.subscription_uuids: dict[str, str] = {}

    def stop(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------ syncrepl callbacks
    def on_entry(self, entry: Entry) -> None:
        sub_id = entry.first("hpwsnSubscriptionId")
        if sub_id:
            with contextlib.suppress(EntryError):  # reported when the entry is applied
                self.subscription_uuids[entry.uuid] = mapping.subscription_id_of(sub_id)
        if self.refreshing:
            self.refresh_entries.append(entry)
        else:
            self.pending.append(("entry", entry))

    def on_delete(self, uuids: list[str]) -> None:
        self.pending.append(("delete", uuids))

    def on_refresh_done(self) -> None:
        self.refreshing = False

    # ------------------------------------------------------------ loop
    def run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                self._session()
                backoff = 1.0
            except Exception as exc:
                if self._stop.is_set():
                    break  # the signal interrupted a poll: a shutdown, not an outage
                error = _describe(exc)
                # An LDAP outage is expected; anything else (the database away) gets its traceback.
                expected = isinstance(exc, ldap.LDAPError | DirectoryUnavailable | OSError)
                log.warning(
                    "directory: %s; retrying in %.0f s", error, backoff, exc_info=not expected
                )
                _health(ok=False, error=error)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            finally:
                close_old_connections()

    def _session(self) -> None:
        self.refreshing, self.refresh_entries, self.pending = True, [], []
        self.loaded_this_session = False
        writer = directory_connect()
        consumer = _Consumer(settings.HPWSN_LDAP_URL, self)
        try:
            consumer.set_option(ldap.OPT_NETWORK_TIMEOUT, settings.HPWSN_LDAP_TIMEOUT_S)
            consumer.simple_bind_s(settings.HPWSN_LDAP_BIND_DN, settings.HPWSN_LDAP_BIND_PASSWORD)
            msgid = consumer.syncrepl_search(
                settings.HPWSN_LDAP_BASE_DN,
                ldap.SCOPE_SUBTREE,
                mode="refreshAndPersist",
                filterstr="(objectClass=*)",
                # modifiersName tells an operator's edit from the echo of the broker's own write.
                attrlist=["*", "modifiersName"],
            )
            seen_version: list[bytes | None] | None = None
            last_push = last_beat = 0.0
            while not self._stop.is_set():
                try:
                    if not consumer.syncrepl_poll(msgid=msgid, timeout=POLL_S):
                        raise DirectoryUnavailable("the directory ended the sync search")
                except ldap.TIMEOUT:
                    pass
                if self.refreshing:
                    continue
                if not self.loaded_this_session:
                    self._load()
                self._apply_pending(writer)
                now = time.monotonic()
                version = state.get_redis().mget(state.VERSION_TOPICS, state.TOPIC_CHANGES)
                if version != seen_version or now - last_push > PUSH_EVERY_S:
                    seen_version, last_push = version, now
                    done = services.topics_push(conn=writer)
                    for line in done:
                        log.info("directory: %s", line)
                if now - last_beat > HEARTBEAT_S:
                    last_beat = now
                    _health(ok=True)
        finally:
            for conn in (consumer, writer):
                with contextlib.suppress(ldap.LDAPError):
                    conn.unbind_s()

    def _load(self) -> None:
        t0 = time.monotonic()
        entries = self.refresh_entries
        report = services.topics_apply_entries(entries=entries, full=True)
        self.refresh_entries = []
        self.loaded_this_session = True
        _health(ok=True)
        log.info(
            "directory: loaded %d entries in %.0f ms: %d topics created, %d updated, %d moved, "
            "%d deleted, %d skipped",
            len(entries),
            (time.monotonic() - t0) * 1000,
            len(report.created),
            len(report.updated),
            len(report.moved),
            len(report.deleted),
            len(report.skipped),
        )

    def _apply_pending(self, writer: Any) -> None:
        events, self.pending = self.pending, []
        for kind, payload in events:
            if kind == "delete":
                deleted = services.topics_delete_entries(entry_uuids=payload).deleted
                done = [f"deleted {', '.join(deleted)}" if deleted else ""]
                for entry_uuid in payload:
                    sub_id = self.subscription_uuids.pop(entry_uuid, None)
                    if sub_id:
                        done.append(services.subscription_entry_deleted(subscription_id=sub_id))
                _log_applied(done)
                continue
            # The event is a snapshot from when the change happened; by now the broker may have
            # written a newer state (the echo of an older push would undo it), so the entry is
            # read again and its current state applied.
            if mapping.dn_is_below(payload.dn, settings.HPWSN_LDAP_TOPICS_DN):
                entry = _current(writer, settings.HPWSN_LDAP_TOPICS_DN, payload.uuid)
                if entry is not None:  # else deleted since: its delete event follows
                    report = services.topics_apply_entries(entries=[entry], full=False)
                    _log_applied(
                        f"{k} {', '.join(v)}"
                        for k, v in (
                            ("created", report.created),
                            ("updated", report.updated),
                            ("moved", report.moved),
                            ("deleted", report.deleted),
                        )
                        if v
                    )
            elif mapping.TOPIC_CLASS.lower() in payload.object_classes:
                # A topic entry moved out of the topics subtree: no longer a topic, as the next
                # full load would find (the entry itself is the operator's, and stays).
                gone = services.topics_delete_entries(entry_uuids=[payload.uuid]).deleted
                _log_applied([f"deleted {', '.join(gone)}" if gone else ""])
            elif mapping.dn_is_below(payload.dn, settings.HPWSN_LDAP_SUBSCRIPTIONS_DN):
                entry = _current(writer, settings.HPWSN_LDAP_SUBSCRIPTIONS_DN, payload.uuid)
                if entry is not None:
                    _log_applied([services.subscription_entry_apply(entry=entry)])


def _log_applied(lines: Any) -> None:
    text = "; ".join(line for line in lines if line)
    if text:
        log.info("directory: applied %s", text)


def _current(conn: Any, base: str, entry_uuid: str) -> Entry | None:
    found = conn.search_s(
        base,
        ldap.SCOPE_SUBTREE,
        f"(entryUUID={ldap.filter.escape_filter_chars(entry_uuid)})",
        # modifiersName is operational: "*" alone would hide that the broker wrote the entry.
        ["*", "modifiersName"],
    )
    for dn, attrs in found:
        if dn is not None:
            return Entry(dn=dn, attrs=attrs, uuid=entry_uuid)
    return None


def _health(*, ok: bool, error: str = "") -> None:
    try:
        services.directory_health_set(ok=ok, error=error)
    except Exception:  # Redis down: /healthz reports that on its own
        log.warning("directory: could not record the directory's health", exc_info=True)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {describe_error(exc)}"
