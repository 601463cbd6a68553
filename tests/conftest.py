"""Starts the real platform once per test session: uvicorn web, a Celery worker and beat."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from django.conf import settings
from hypothesis import settings as hypothesis_settings

from hpwsn_site import processes
from tests.support import RecordingConsumer, free_port

# `pytest --hypothesis-profile=long`: property-based and simulation tests search much longer.
hypothesis_settings.register_profile(
    "long", max_examples=1000, stateful_step_count=100, deadline=None
)

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
# The running platform's secret key (what it signs and tags with).
PLATFORM_SECRET_KEY = "test-secret-key-not-for-production"


@dataclass
class Platform:
    base_url: str
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]]
    env: dict[str, str]

    @property
    def endpoint(self) -> str:
        return self.base_url + "/wsn/"

    def redis(self):  # type: ignore[no-untyped-def]
        import redis

        return redis.Redis.from_url(settings.REDIS_URL)

    def logs(self) -> str:
        """Each process's last tracebacks and the tail of its log."""
        out = []
        for p in sorted(self.log_dir.glob("*.log")):
            text = p.read_text(errors="replace")
            tracebacks = [t[:3000] for t in text.split("Traceback (most recent call last)")[1:]]
            out.append(f"--- {p.name}")
            out += [f"Traceback (most recent call last){t}" for t in tracebacks[-2:]]
            out.append(text[-4000:])
        return "\n".join(out)


def _database_url() -> str:
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or ""
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    return f"postgres://{auth}{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


def _check_redis_is_for_tests() -> None:
    db_index = urlsplit(settings.REDIS_URL).path.strip("/") or "0"
    if db_index == "0" and os.environ.get("HPWSN_TEST_ALLOW_REDIS_DB0") != "1":
        pytest.exit(
            "tests flush their Redis database: set REDIS_URL to a spare database, e.g. "
            "redis://127.0.0.1:6379/15 (make test does this)",
            returncode=4,
        )


# ---------------------------------------------------------------- LDAP directory (real slapd)
@pytest.fixture(scope="session")
def ldap_directory(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A real slapd seeded with the demo directory, for this process and the platform's.

    Sets the HPWSN_LDAP_* settings here and yields the instance (directory.slapdctl.Instance);
    `ldap_directory.env` holds the same settings for the processes the platform starts.
    """
    from directory.slapdctl import Instance

    inst = Instance(data_dir=tmp_path_factory.mktemp("slapd"), port=free_port())
    inst.prepare()
    inst.start()
    values = {name: value for name, value in inst.env.items() if name.startswith("HPWSN_")}
    saved = {name: getattr(settings, name) for name in values}
    for name, value in values.items():
        setattr(settings, name, value)
    yield inst
    inst.stop()
    for name, value in saved.items():
        setattr(settings, name, value)


# ---------------------------------------------------------------- end of LDAP directory


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup):  # type: ignore[no-untyped-def]
    """pytest-django's, and before the test database is dropped: the connections that /healthz's
    checks, the reliable log's group commits and Django's requests keep on threads of their own,
    when a test served them in this process, closed."""
    yield
    from hpwsn_site.requestthreads import request_connections_close
    from hpwsn_site.soapcall import db_threads_close

    db_threads_close()
    request_connections_close()


@pytest.fixture(scope="session")
def platform(django_db_setup, django_db_blocker, tmp_path_factory, ldap_directory) -> Platform:  # type: ignore[no-untyped-def]
    _check_redis_is_for_tests()
    import redis

    from topics.services import topics_load_demo

    redis.Redis.from_url(settings.REDIS_URL).flushdb()
    with django_db_blocker.unblock():
        topics_load_demo()
    data_dir = tmp_path_factory.mktemp("platform")
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "HPWSN_DATA_DIR": str(data_dir),
        "HPWSN_SECRET_KEY": PLATFORM_SECRET_KEY,
        "HPWSN_RETRY_SCHEDULE_S": "0.5,1,2",
        "HPWSN_RETRY_JITTER": "0",
        "HPWSN_RETRY_THROTTLED_MIN_S": "1",
        # Short enough to prove suspension in a test, long enough for the retry tests to finish
        # their schedules first.
        "HPWSN_SUSPEND_AFTER_S": "6",
        "HPWSN_PUSH_TIMEOUT_S": "3",
        # Fragmentation: pushes whose payload exceeds 64 KiB go as fragments (other tests publish
        # less); a reassembly waits 2 s for its next fragment and holds at most 1 MiB.
        "HPWSN_FRAGMENT_SIZE": "65536",
        "HPWSN_FRAGMENT_TIMEOUT_S": "2",
        "HPWSN_MAX_REASSEMBLY_BYTES": "1048576",
        # Fast heartbeats so the node registry tests see a killed worker die within seconds.
        "HPWSN_HEARTBEAT_S": "0.5",
        "HPWSN_NODE_DEAD_AFTER_S": "3",
        # Every test consumer keeps its own label in /metrics, however many a session makes.
        "HPWSN_METRICS_TOP_N": "1000",
        # Short read deadlines, so that the slow-client tests see half-sent requests cut off.
        "HPWSN_HEADER_TIMEOUT_S": "3",
        "HPWSN_BODY_TIMEOUT_S": "5",
        "PYTHONUNBUFFERED": "1",
        # Analytics runs started from the page: small and on two cores.
        "HPWSN_SPARK_MASTER": "local[2]",
        "HPWSN_SPARK_SHUFFLE_PARTITIONS": "2",
        "HPWSN_SPARK_DRIVER_MEMORY": "512m",
        **ldap_directory.env,  # the real slapd (fixture ldap_directory)
    }
    # The node's command lines as make run spells them (hpwsn_site/processes.py).
    commands = processes.commands(
        processes.ROLES,
        processes.Options(
            bin_dir=VENV_BIN,
            port=port,
            node_name=f"test{port}",
            data_dir=data_dir,
            worker_name=f"test{port}@%h",
        ),
    )
    procs = {}
    for name, cmd in commands.items():
        log = open(data_dir / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
        procs[name] = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    platform = Platform(base_url=f"http://127.0.0.1:{port}", log_dir=data_dir, procs=procs, env=env)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(platform.base_url + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs.values()):
            _stop(procs)
            pytest.fail("the platform did not start:\n" + platform.logs())
        time.sleep(0.2)
    yield platform
    _stop(procs)


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for p in procs.values():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs.values():
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


@pytest.fixture
def consumer_factory():  # type: ignore[no-untyped-def]
    started: list[RecordingConsumer] = []

    def make(**kwargs: object) -> RecordingConsumer:
        c = RecordingConsumer(**kwargs).start()  # type: ignore[arg-type]
        started.append(c)
        return c

    yield make
    for c in started:
        c.stop()


@pytest.fixture(autouse=True)
def _tasks_of_tests_without_the_platform(request, monkeypatch):  # type: ignore[no-untyped-def]
    """Tasks sent and pumps made ready by a test that does not use the platform are kept in the
    test.

    The platform's worker (running once any earlier test started it) would otherwise act on them
    against rows the test never committed: a pump for a subscription it cannot see deletes that
    subscription's queue. Returns the (task name, args) sent; the subscriptions made ready go to
    a list of the test's own (`state.READY` while it runs), which no pump loop serves.
    """
    sent: list[tuple[str, tuple[object, ...]]] = []
    if "platform" not in request.fixturenames:
        from celery.app.task import Task

        from hpwsn_site import state

        def keep(task, args=None, kwargs=None, **options):  # type: ignore[no-untyped-def]
            sent.append((task.name, tuple(args or ())))

        monkeypatch.setattr(Task, "apply_async", keep)
        monkeypatch.setattr(state, "READY", f"{state.PREFIX}ready:{uuid.uuid4().hex}")
    return sent


@pytest.fixture
def db_access(django_db_blocker):  # type: ignore[no-untyped-def]
    """Read the rows the platform wrote (no transaction wrapping, no flush)."""
    with django_db_blocker.unblock():
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """A failed test that ran against the platform reports what its processes logged."""
    report = yield
    platform = getattr(item, "funcargs", {}).get("platform")
    if report.failed and isinstance(platform, Platform):
        report.sections.append(("platform logs", platform.logs()))
    return report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # pytest-django creates only the databases that marked tests use; the platform needs one.
    for item in items:
        if "platform" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.django_db(transaction=False))
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def committed(django_db_blocker):  # type: ignore[no-untyped-def]
    """Run a function on its own connection in autocommit, so the platform's processes see it.

    Platform tests run inside a transaction that is rolled back; writes the web and worker
    processes must read have to be committed from another connection.
    """

    def run(fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        outcome: dict[str, object] = {}

        def target() -> None:
            from django.db import connection

            try:
                outcome["value"] = fn(*args, **kwargs)
            except BaseException as exc:  # re-raised in the test's thread
                outcome["error"] = exc
            finally:
                connection.close()

        with django_db_blocker.unblock():
            thread = threading.Thread(target=target)
            thread.start()
            thread.join()
        if "error" in outcome:
            raise outcome["error"]  # type: ignore[misc]
        return outcome.get("value")

    return run


CHROMEDRIVER = Path("/usr/bin/chromedriver")


@pytest.fixture
def browser():  # type: ignore[no-untyped-def]
    """Headless Debian Chromium driven by Debian's chromedriver, with a throwaway profile."""
    if not CHROMEDRIVER.exists() or not shutil.which("chromium"):
        pytest.skip("Debian's chromium and chromium-driver are not installed (make test does it)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="hpwsn-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run", "--window-size=1400,1700", f"--user-data-dir={profile}",
    ):  # fmt: skip
        options.add_argument(arg)
    # The Service path keeps Selenium Manager from looking for (and downloading) a driver.
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
