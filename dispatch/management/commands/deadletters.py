"""manage.py deadletters list|redrive [--subscription ID] [--since ISO] [--id N ...]"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from dispatch.deadletters import dead_letters_redrive
from dispatch.selectors import dead_letters


class Command(BaseCommand):
    help = "List dead letters, or redrive them to the tail of their subscription's queue."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "redrive"])
        parser.add_argument("--subscription", help="only this subscription's letters")
        parser.add_argument("--since", help="only letters created at or after this ISO time")
        parser.add_argument("--id", type=int, nargs="+", dest="ids", help="only these letters")

    def handle(self, *args: Any, **options: Any) -> None:
        since = None
        if options["since"]:
            try:
                since = datetime.fromisoformat(options["since"])
            except ValueError:
                raise CommandError(f"--since '{options['since']}' is not an ISO time") from None
            if timezone.is_naive(since):
                since = timezone.make_aware(since, timezone.get_default_timezone())
        where = {"ids": options["ids"], "subscription_id": options["subscription"], "since": since}
        if options["action"] == "list":
            for letter in dead_letters(**where):
                last = letter.attempts[-1] if letter.attempts else {}
                self.stdout.write(
                    f"{letter.id}\t{letter.created_at.isoformat()}\t{letter.subscription_id}\t"
                    f"{letter.consumer_address}\t{letter.notification_id}\t{letter.topic}\t"
                    f"{letter.reason}\t{len(letter.attempts)} attempt(s)\t"
                    f"last: {last.get('status')} {last.get('detail', '')[:60]!r}"
                    + (f"\tredriven {letter.redriven_at.isoformat()}" if letter.redriven_at else "")
                )
            return
        matching = dead_letters(**where).count()
        redriven = dead_letters_redrive(**where)
        self.stdout.write(f"redriven: {redriven}")
        if matching > redriven:
            self.stdout.write(
                f"kept: {matching - redriven} (subscription gone or already redriven)"
            )
