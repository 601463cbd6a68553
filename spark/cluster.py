"""A Spark standalone cluster (one master, one worker) from the installed pyspark package.

The jobs run on it exactly as on any cluster (`HPWSN_SPARK_MASTER=spark://host:7077`). The
integration test starts one; so can anyone without a cluster at hand:

    python -m spark.cluster --port 7077      # Ctrl-C stops both
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyspark


def spark_home() -> Path:
    """The pyspark package carries Spark's jars and bin/ scripts: it is a SPARK_HOME."""
    return Path(pyspark.__file__).resolve().parent


def master_command(*, host: str, port: int, webui_port: int) -> list[str]:
    return [
        str(spark_home() / "bin" / "spark-class"),
        "org.apache.spark.deploy.master.Master",
        "--host", host, "--port", str(port), "--webui-port", str(webui_port),
    ]  # fmt: skip


def worker_command(
    *, master_url: str, host: str, cores: int, memory: str, webui_port: int
) -> list[str]:
    return [
        str(spark_home() / "bin" / "spark-class"),
        "org.apache.spark.deploy.worker.Worker",
        master_url,
        "--host", host, "--cores", str(cores), "--memory", memory, "--webui-port", str(webui_port),
    ]  # fmt: skip


def submit_command(*, master_url: str, job: Path, args: list[str]) -> list[str]:
    """spark-submit of one job file (the repository must be on PYTHONPATH for `spark.jobs`)."""
    return [
        str(spark_home() / "bin" / "spark-submit"),
        "--master", master_url,
        "--conf", "spark.executor.memory=512m",
        "--conf", "spark.sql.shuffle.partitions=2",
        "--conf", "spark.ui.enabled=false",
        str(job),
        *args,
    ]  # fmt: skip


def cluster_env() -> dict[str, str]:
    env = dict(os.environ)
    env["SPARK_HOME"] = str(spark_home())
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7077)
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    p.add_argument("--memory", default="2g")
    args = p.parse_args()
    env = cluster_env()
    master = subprocess.Popen(  # noqa: S603 - our own command line
        master_command(host=args.host, port=args.port, webui_port=8080), env=env
    )
    url = f"spark://{args.host}:{args.port}"
    worker = subprocess.Popen(  # noqa: S603 - our own command line
        worker_command(
            master_url=url, host=args.host, cores=args.cores, memory=args.memory, webui_port=8081
        ),
        env=env,
    )
    print(f"master {url} (UI http://{args.host}:8080); Ctrl-C stops the cluster", file=sys.stderr)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        for proc in (worker, master):
            proc.terminate()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
