"""Spark progress from the status tracker, polled on a thread while a run's jobs execute."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Progress:
    job: str  # the analytics job running ("" before the first)
    jobs_done: int
    jobs_total: int
    stages_done: int  # Spark stages finished in this job so far
    stages_active: int
    tasks_done: int  # of the active stages
    tasks_total: int
    state: str = "running"  # running | succeeded | failed

    @property
    def fraction(self) -> float:
        """0..1: finished jobs plus the running job's share of its active stages' tasks."""
        if self.state == "succeeded":
            return 1.0
        part = self.tasks_done / self.tasks_total if self.tasks_total else 0.0
        return min(1.0, (self.jobs_done + part) / max(self.jobs_total, 1))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fraction": round(self.fraction, 4)}


class Tracker:
    """Calls `report(Progress)` every `every_s` with the Spark status of the current job."""

    def __init__(
        self, sc: Any, *, jobs_total: int, report: Callable[[Progress], None], every_s: float = 0.5
    ) -> None:
        self.sc = sc
        self.jobs_total = jobs_total
        self.report = report
        self.every_s = every_s
        self.job = ""
        self.jobs_done = 0
        self._group = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-progress", daemon=True)

    def __enter__(self) -> Tracker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def start_job(self, name: str) -> None:
        self.job = name
        self._group = f"hpwsn-{name}"
        self.sc.setJobGroup(self._group, f"analytics job {name}", False)
        self.report(self.snapshot())

    def end_job(self) -> None:
        self.jobs_done += 1
        self.report(self.snapshot())

    def snapshot(self) -> Progress:
        tracker = self.sc.statusTracker()
        stages_done = stages_active = tasks_done = tasks_total = 0
        if self._group:
            for job_id in tracker.getJobIdsForGroup(self._group):
                info = tracker.getJobInfo(job_id)
                if info is None:
                    continue
                for stage_id in info.stageIds:
                    stage = tracker.getStageInfo(stage_id)
                    if stage is None:
                        continue
                    if stage.numActiveTasks or (0 < stage.numCompletedTasks < stage.numTasks):
                        stages_active += 1
                        tasks_done += stage.numCompletedTasks
                        tasks_total += stage.numTasks
                    elif stage.numTasks and stage.numCompletedTasks >= stage.numTasks:
                        stages_done += 1
        return Progress(
            job=self.job,
            jobs_done=self.jobs_done,
            jobs_total=self.jobs_total,
            stages_done=stages_done,
            stages_active=stages_active,
            tasks_done=tasks_done,
            tasks_total=tasks_total,
        )

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.report(self.snapshot())
            except Exception:  # noqa: S112 - the JVM may be going away; the run reports its end
                continue
