"""Report every difference between the LDAP directory and the broker's database, and repair
them in the direction asked."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from directory.ldapconn import DirectoryUnavailable
from directory.services import DIRECTIONS, directory_reconcile


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--direction",
            choices=DIRECTIONS,
            help="repair: make Django like the directory, or the directory like Django "
            "(without it: report only)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="say what the repair would do, do nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            diffs, actions = directory_reconcile(
                direction=options["direction"], dry_run=options["dry_run"]
            )
        except DirectoryUnavailable as exc:
            raise CommandError(str(exc)) from exc
        if not diffs:
            self.stdout.write("in step: no differences")
            return
        self.stdout.write(f"{len(diffs)} difference(s):")
        for diff in diffs:
            self.stdout.write(f"  {diff}")
        if options["direction"]:
            verb = "would do" if options["dry_run"] else "done"
            self.stdout.write(f"repair {options['direction']} ({verb}):")
            for line in actions:
                self.stdout.write(f"  {line}")
