"""manage.py analytics_generate --events N --days D [--seed S] [--dir PATH]"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Write a realistic synthetic event log (for demos and benchmarks) ending now."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--events", type=int, default=200_000, help="about how many events")
        parser.add_argument("--days", type=float, default=7.0, help="over how many days")
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--dir", help="event log directory (default HPWSN_EVENTS_DIR)")

    def handle(self, *args: Any, **options: Any) -> None:
        from spark.synth import generate

        if options["events"] <= 0 or options["days"] <= 0:
            raise CommandError("--events and --days must be positive")
        root = Path(options["dir"] or settings.HPWSN_EVENTS_DIR)
        root.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        target = options["events"]

        def progress(done: int) -> None:
            if sys.stderr.isatty():
                sys.stderr.write(f"\r{_bar(done / target)} {done:,} events")

        n = generate(
            root,
            events=target,
            days=options["days"],
            end=time.time(),
            seed=options["seed"],
            progress=progress,
        )
        if sys.stderr.isatty():
            sys.stderr.write("\n")
        self.stdout.write(
            f"wrote {n:,} events over {options['days']:g} day(s) to {root} "
            f"in {time.monotonic() - started:.1f} s"
        )


def _bar(fraction: float, width: int = 30) -> str:
    done = int(min(max(fraction, 0.0), 1.0) * width)
    return "[" + "#" * done + "." * (width - done) + f"] {fraction * 100:5.1f}%"
