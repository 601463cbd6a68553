"""Load the directory's topic tree (breadth-first) and the subscriptions the database lacks into
the broker's database once, and exit (`make run` does this before the web starts)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from directory.ldapconn import DirectoryUnavailable
from directory.services import directory_load


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.HPWSN_LDAP_URL:
            raise CommandError("no directory configured (LDAP_URL / HPWSN_LDAP_URL)")
        try:
            report = directory_load()
        except DirectoryUnavailable as exc:
            raise CommandError(str(exc)) from exc
        for dn, why in report.skipped:
            self.stderr.write(f"skipped {dn}: {why}")
        self.stdout.write(
            f"topic tree loaded from {settings.HPWSN_LDAP_URL}: {len(report.created)} created, "
            f"{len(report.updated)} updated, {len(report.moved)} moved, "
            f"{len(report.deleted)} deleted, {len(report.skipped)} skipped; "
            f"{len(report.restored)} subscriptions restored"
        )
