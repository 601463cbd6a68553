"""One SparkSession for the whole test session: local[2], few shuffle partitions, no UI."""

from __future__ import annotations

import logging
import shutil

import pytest


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    if not shutil.which("java"):
        pytest.skip("no Java runtime (make test installs default-jre-headless)")
    from spark.jobs.common import session

    s = session(
        master="local[2]", app_name="hpwsn-tests", conf={"spark.sql.shuffle.partitions": "2"}
    )
    yield s
    s.stop()
    # py4j says goodbye from __del__ after pytest closed the streams: nothing worth a traceback.
    logging.getLogger("py4j").setLevel(logging.WARNING)
