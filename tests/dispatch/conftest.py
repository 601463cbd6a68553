"""Fixtures of the in-process dispatch tests."""

from __future__ import annotations

import subprocess

import pytest
import redis

from hpwsn_site import state
from tests.support import free_port, wait_until


@pytest.fixture
def own_redis(settings, tmp_path):  # type: ignore[no-untyped-def]
    """A Redis of the test's own: a loss is a flush, which the shared one must never see."""
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port)

    def pings() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    assert wait_until(pings, timeout=10)
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    state._local.client = None  # this thread's client follows the setting
    yield state.get_redis()
    state._local.client = None
    proc.terminate()
    proc.wait(timeout=10)
