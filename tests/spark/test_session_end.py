"""A run that made its own Spark session leaves no JVM behind (a worker's pool process would hold
one, 1.4 GB, until the worker stops). In a process of its own: the tests' shared session lives in
this one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import os
    from pyspark import SparkContext
    from spark.jobs.common import session, session_end

    pids = []
    for _ in range(2):  # and a session made again afterwards works, with a JVM of its own
        spark = session(master="local[1]")
        assert spark.range(3).count() == 3
        pids.append(SparkContext._gateway.proc.pid)
        session_end(spark)
        try:
            os.kill(pids[-1], 0)
        except ProcessLookupError:
            continue
        raise SystemExit(f"JVM {pids[-1]} still runs")
    assert pids[0] != pids[1], pids
    print("ended", pids)
    """
)


def test_a_session_ended_leaves_no_jvm_and_another_can_be_made() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "ended" in done.stdout
