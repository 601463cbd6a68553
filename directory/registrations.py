"""Publisher registrations in the directory (ou=registrations): entry writes, restore, repair.

The registration services record each change in the outbox (directory.outbox) in their own
transaction; `directory.services.outbox_flush` calls `registration_entry_write` for it. The mirror
goes one way: an operator's edit of a registration entry is not applied to the broker (reconcile
reports it, and `--direction ldap-to-django` takes it over).
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import ldap
import ldap.modlist
from django.conf import settings
from django.db import DatabaseError, transaction

from directory import mapping
from directory.ldapconn import describe_error
from hpwsn import errors
from subscriptions.models import PublisherRegistration
from subscriptions.registrations import demand_changed, registration_destroy
from topics.acl import ANONYMOUS_OWNER


def _dn(registration_id: str) -> str:
    return mapping.registration_dn(registration_id, settings.HPWSN_LDAP_REGISTRATIONS_DN)


def registration_entry_write(conn: Any, view: dict[str, Any]) -> None:
    """Add the registration's entry, or replace its attributes when it exists."""
    attrs = mapping.registration_attrs(view)
    try:
        conn.add_s(_dn(view["id"]), ldap.modlist.addModlist(attrs))
    except ldap.ALREADY_EXISTS:
        mods = [(ldap.MOD_REPLACE, k, v) for k, v in attrs.items() if k != "objectClass"]
        conn.modify_s(_dn(view["id"]), mods)


def registration_entry_delete(conn: Any, registration_id: str) -> None:
    with contextlib.suppress(ldap.NO_SUCH_OBJECT):
        conn.delete_s(_dn(registration_id))


def registration_restore(*, view: dict[str, Any]) -> PublisherRegistration:
    """Make the registration row what its directory entry says, with the same id (so the
    reference handed to the publisher stays valid); creates it when the database lacks it.

    The demand state (the broker's subscriptions at a demand publisher) is not in the directory:
    a restored demand registration subscribes at its publisher again at the next demand sync.
    """
    reference = view["reference_address"]
    # The broker's own endpoint, where the publisher sends: the reference minus its path tail.
    base = reference.split("/wsn/registrations/", 1)[0] if reference else ""
    fields = {
        "publisher_address": view["publisher_address"],
        "reference_address": reference,
        "topic_paths": list(view["topic_paths"]),
        "demand": view["demand"],
        "owner": view["owner"] or ANONYMOUS_OWNER,
        "termination_time": (
            mapping.parse_generalized_time(view["termination_time"])
            if view["termination_time"]
            else None
        ),
    }
    with transaction.atomic():
        reg, made = PublisherRegistration.objects.update_or_create(
            id=uuid.UUID(view["id"]), defaults=fields
        )
        if made and base:
            reg.broker_address = f"{base}/wsn/"
            reg.save(update_fields=["broker_address"])
        if view["created_at"]:
            # auto_now_add sets it on insert; the entry keeps the original time.
            reg.created_at = mapping.parse_generalized_time(view["created_at"])
            PublisherRegistration.objects.filter(id=reg.id).update(created_at=reg.created_at)
        if reg.demand:
            demand_changed(registered=True)
    return reg


def registrations_repair_to_ldap(
    conn: Any,
    *,
    names: list[tuple[str, str]],
    django_regs: dict[str, dict[str, Any]],
    dry_run: bool,
) -> list[str]:
    """Make the registration entries like the database; names: (id, what differs)."""
    done = []
    for reg_id, what in names:
        try:
            if what == "only in the directory":
                done.append(f"delete registration {reg_id} from the directory")
                if not dry_run:
                    registration_entry_delete(conn, reg_id)
            else:
                done.append(f"write registration {reg_id} to the directory")
                if not dry_run:
                    registration_entry_write(conn, django_regs[reg_id])
        except ldap.LDAPError as exc:
            done.append(f"cannot write registration {reg_id}: {describe_error(exc)}")
    return done


def registrations_repair_to_django(
    *, names: list[tuple[str, str]], ldap_regs: dict[str, dict[str, Any]], dry_run: bool
) -> list[str]:
    """Make the registration rows like the directory; names: (id, what differs)."""
    done = []
    for reg_id, what in names:
        if what == "only in Django":
            done.append(f"delete registration {reg_id} in Django")
            if not dry_run:
                # As DestroyRegistration by the broker: a demand publisher is released too.
                with contextlib.suppress(errors.ResourceUnknown):
                    registration_destroy(registration_id=reg_id, principal=None)
            continue
        verb = "restore" if what == "only in the directory" else "update"
        done.append(f"{verb} registration {reg_id} in Django from the directory")
        if dry_run:
            continue
        try:
            registration_restore(view=ldap_regs[reg_id])
        except (ValueError, DatabaseError) as exc:
            done.append(f"cannot restore registration {reg_id}: {exc}")
    return done
