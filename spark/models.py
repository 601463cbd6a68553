"""Analytics runs: what ran over which range, how it went, and each job's result for the page."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class AnalyticsRun(models.Model):
    """One run of one or more jobs over [since, until); its Parquet is under var/analytics/<id>/."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    class Trigger(models.TextChoices):
        CLI = "cli"
        WEB = "web"
        SCHEDULE = "schedule"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    jobs = models.JSONField(default=list)  # job names, in the order they run
    since = models.DateTimeField()
    until = models.DateTimeField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    trigger = models.CharField(max_length=16, choices=Trigger.choices, default=Trigger.CLI)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    master = models.CharField(max_length=200, blank=True)
    input_rows = models.BigIntegerField(null=True, blank=True)
    duration_s = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"run {self.id} ({self.status})"


class JobResult(models.Model):
    """One job of a run: its summary, and its output rows (up to HPWSN_ANALYTICS_MAX_ROWS)."""

    class Status(models.TextChoices):
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    run = models.ForeignKey(AnalyticsRun, related_name="results", on_delete=models.CASCADE)
    job = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices)
    input_rows = models.BigIntegerField(default=0)
    output_rows = models.BigIntegerField(default=0)
    duration_s = models.FloatField(default=0.0)
    error = models.TextField(blank=True)
    columns = models.JSONField(default=list)
    rows = models.JSONField(default=list)  # lists in `columns` order; JSON-safe values
    truncated = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "job"], name="spark_result_once")]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.job} of {self.run_id}"
