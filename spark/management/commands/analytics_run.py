"""manage.py analytics_run [--job NAME ...] [--since ISO] [--until ISO]"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from spark.management.commands.analytics_generate import _bar


def _when(text: str | None, default: datetime) -> datetime:
    if not text:
        return default
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(f"'{text}' is not an ISO 8601 time") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = (
        "Run the analytics jobs over a time range (default: the last 7 days) and print a summary."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        from spark.jobs import JOBS

        parser.add_argument("--job", action="append", choices=JOBS, help="repeatable; default all")
        parser.add_argument("--since", help="ISO 8601, UTC when naive (default: until - 7 days)")
        parser.add_argument("--until", help="ISO 8601, UTC when naive (default: now)")

    def handle(self, *args: Any, **options: Any) -> None:
        from spark.jobs import JOBS
        from spark.models import AnalyticsRun
        from spark.services import RunRefused, analytics_run_create, analytics_run_execute

        until = _when(options["until"], timezone.now())
        since = _when(options["since"], until - timedelta(days=7))
        try:
            run = analytics_run_create(since=since, until=until, jobs=options["job"] or JOBS)
        except RunRefused as exc:
            raise CommandError(str(exc)) from None
        tty = sys.stderr.isatty()

        def show(p: dict[str, Any]) -> None:
            line = f"{_bar(float(p.get('fraction') or 0))} {p.get('job', p.get('state', ''))}"
            if p.get("tasks_total"):
                line += f" tasks {p['tasks_done']}/{p['tasks_total']}"
            sys.stderr.write(("\r" + line.ljust(78)) if tty else "")

        self.stdout.write(f"run {run.id}: {', '.join(run.jobs)} over [{since}, {until})")
        run = analytics_run_execute(run_id=str(run.id), on_progress=show)
        if tty:
            sys.stderr.write("\n")
        for r in run.results.all():
            status = "ok" if r.status == "succeeded" else f"FAILED {r.error}"
            self.stdout.write(
                f"  {r.job:16} {r.output_rows:>8} rows  {r.duration_s:7.1f} s  {status}"
            )
        self.stdout.write(
            f"{run.status}: {run.input_rows or 0:,} events in range, {run.duration_s or 0:.1f} s"
        )
        if run.status != AnalyticsRun.Status.SUCCEEDED:
            raise CommandError(run.error or "the run failed")
