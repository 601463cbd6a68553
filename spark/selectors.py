"""Reads for the analytics page: runs, their results, CSV."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

from spark.models import AnalyticsRun, JobResult


def analytics_runs(*, limit: int = 30) -> list[AnalyticsRun]:
    return list(AnalyticsRun.objects.select_related("requested_by").order_by("-created_at")[:limit])


def analytics_run_shown(*, run_id: str | None) -> AnalyticsRun | None:
    """The run the page draws: the one asked for, else the newest that succeeded."""
    runs = AnalyticsRun.objects.all()
    if run_id:
        return runs.filter(id=run_id).first()
    return runs.filter(status=AnalyticsRun.Status.SUCCEEDED).order_by("-created_at").first()


def job_results(*, run: AnalyticsRun) -> dict[str, JobResult]:
    return {r.job: r for r in run.results.all()}


# A text cell starting with one of these is a formula to a spreadsheet (OWASP "CSV injection"):
# topic paths, publisher names and consumer hosts are chosen by publishers and subscribers.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: object) -> object:
    """A cell as text a spreadsheet shows as is: a leading quote before a formula; numbers as is."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def job_result_csv(*, result: JobResult) -> Iterator[str]:
    """The job's stored rows as CSV, header first, a line at a time."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    for row in [result.columns, *result.rows]:
        writer.writerow([_csv_cell(v) for v in row])
        yield buf.getvalue()
        buf.seek(0)
        buf.truncate()
