"""A job runs under spark-submit on a real standalone cluster: a master and one worker started
from the installed pyspark package, on 127.0.0.1."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from spark.cluster import cluster_env, master_command, submit_command, worker_command
from spark.jobs import traffic
from spark.jobs.common import JobConfig, read_events
from tests.conftest import ROOT
from tests.spark import handbuilt as hb
from tests.support import free_port, wait_or_fail


@pytest.fixture
def cluster(tmp_path):  # type: ignore[no-untyped-def]
    if not shutil.which("java"):
        pytest.skip("no Java runtime (make test installs default-jre-headless)")
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env = cluster_env()
    env["SPARK_WORKER_DIR"] = str(tmp_path / "work")
    env["SPARK_LOG_DIR"] = str(tmp_path)
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("master", "worker")}
    url = f"spark://127.0.0.1:{port}"
    procs = [
        subprocess.Popen(
            master_command(host="127.0.0.1", port=port, webui_port=ui),
            env=env,
            stdout=logs["master"],
            stderr=subprocess.STDOUT,
        )
    ]

    def state() -> dict:  # type: ignore[type-arg]
        try:
            return httpx.get(f"http://127.0.0.1:{ui}/json/", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return {}

    try:
        wait_or_fail(lambda: state().get("status") == "ALIVE", 90, "the Spark master")
        procs.append(
            subprocess.Popen(
                worker_command(
                    master_url=url, host="127.0.0.1", cores=1, memory="1g", webui_port=worker_ui
                ),
                env=env,
                stdout=logs["worker"],
                stderr=subprocess.STDOUT,
            )
        )
        wait_or_fail(lambda: state().get("aliveworkers") == 1, 90, "the Spark worker")
        yield url, state, env, tmp_path
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for f in logs.values():
            f.close()


def test_a_job_runs_on_a_standalone_master_with_one_worker(cluster, spark, tmp_path_factory):  # type: ignore[no-untyped-def]
    url, state, env, tmp = cluster
    events = tmp_path_factory.mktemp("cluster-events")
    hb.write(events)
    out = tmp / "out"
    env = {**env, "PYTHONPATH": str(ROOT)}
    args = ["--events", events.as_uri(), "--since", str(hb.T0), "--until", str(hb.UNTIL)]
    res = subprocess.run(
        submit_command(
            master_url=url,
            job=ROOT / "spark" / "jobs" / "traffic.py",
            args=[*args, "--out", str(out)],
        ),
        env=env,
        capture_output=True,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stderr.decode(errors="replace")[-4000:]

    # The application ran on the cluster's worker and finished there.
    wait_or_fail(lambda: state().get("completedapps"), 30, "the application to end")
    apps = state()["completedapps"]
    assert [a["name"] for a in apps] == ["hpwsn-traffic"]
    assert apps[0]["state"] == "FINISHED"
    assert apps[0]["cores"] >= 1
    # Its output equals the same job's output on the local session.
    cfg = JobConfig(since=hb.T0, until=hb.UNTIL)
    local = traffic.transform(
        read_events(spark, uri=events.as_uri(), since=cfg.since, until=cfg.until), cfg=cfg
    )
    on_cluster = spark.read.parquet(str(Path(out) / "traffic"))
    assert on_cluster.count() == local.count() > 0
    assert sorted(map(tuple, on_cluster.collect())) == sorted(map(tuple, local.collect()))
