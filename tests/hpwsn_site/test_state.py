"""The per-process caches of shared state (topic tree, subscription index) against a real Redis."""

from __future__ import annotations

import uuid

from hpwsn_site import state


def test_a_cache_is_rebuilt_when_redis_lost_its_data_and_the_count_came_back_to_the_same_value(
    monkeypatch,
):
    r = state.get_redis()
    key = f"{state.PREFIX}test:ver:{uuid.uuid4().hex}"
    # Its own marker: the platform's recovery must not see the shared one go.
    monkeypatch.setattr(state, "EPOCH", f"{state.PREFIX}test:epoch:{uuid.uuid4().hex}")
    builds: list[int] = []
    cache = state.VersionedCache(key, lambda: builds.append(len(builds)) or len(builds))
    try:
        r.set(state.EPOCH, "1000.0")
        state.bump(key)
        assert cache.get(max_age=0) == 1
        assert cache.get(max_age=0) == 1  # nothing moved: no rebuild
        state.bump(key)
        assert cache.get(max_age=0) == 2

        # Redis comes back empty: until the recovery writes a new marker nothing is trusted.
        r.delete(key, state.EPOCH)
        assert cache.get(max_age=0) == 3
        assert cache.get(max_age=0) == 4
        # The marker is back; two changes count to 2 again.
        r.set(state.EPOCH, "2000.0")
        state.bump(key)
        state.bump(key)

        assert cache.get(max_age=0) == 5
        assert cache.get(max_age=0) == 5
        assert len(builds) == 5
    finally:
        r.delete(key, state.EPOCH)


def test_a_cache_serves_a_fresh_build_while_redis_is_away_and_trusts_its_version_again_after(
    monkeypatch, settings
):
    r = state.get_redis()
    key = f"{state.PREFIX}test:ver:{uuid.uuid4().hex}"
    monkeypatch.setattr(state, "EPOCH", f"{state.PREFIX}test:epoch:{uuid.uuid4().hex}")
    builds: list[int] = []
    cache = state.VersionedCache(key, lambda: builds.append(len(builds)) or len(builds))
    try:
        r.set(state.EPOCH, "1000.0")
        state.bump(key)
        assert cache.get(max_age=0) == 1

        # Nothing listens there: every version check fails (a Redis restart, a failover). The
        # value comes from its source each time instead of an error.
        settings.REDIS_URL = "redis://127.0.0.1:1/0"  # restored by pytest-django
        monkeypatch.setattr(state._local, "client", None)
        assert cache.get(max_age=0) == 2
        assert cache.get(max_age=0) == 3

        # Redis is back: one rebuild against its version, then none while nothing moves.
        monkeypatch.setattr(state._local, "client", r)
        assert cache.get(max_age=0) == 4
        assert cache.get(max_age=0) == 4
    finally:
        r.delete(key, state.EPOCH)


def test_a_periodic_task_that_grew_costly_is_spaced_out_to_its_share(monkeypatch):
    # The checkpoint over 10^5 busy subscriptions costs about a second: every second, it would
    # take a whole process. Its last run's cost, kept in Redis, spaces it out for every process.
    import time

    r = state.get_redis()
    monkeypatch.setattr(state, "PERIODIC", f"{state.PREFIX}test:periodic:{uuid.uuid4().hex}")
    runs: list[float] = []

    def costly() -> None:
        runs.append(time.monotonic())
        time.sleep(0.05)

    try:
        assert state.periodic_within_share("t", 0.1, costly)  # never run: runs
        # Less than ten times its cost after it started: not again, in this process or another.
        assert not state.periodic_within_share("t", 0.1, costly)
        assert len(runs) == 1
        started, cost = (float(x) for x in r.hget(state.PERIODIC, "t").split(b","))
        assert cost >= 0.05
        # Once the time since its start covers ten times its cost: it runs.
        r.hset(state.PERIODIC, "t", f"{started - 10 * cost - 0.01!r},{cost!r}")
        assert state.periodic_within_share("t", 0.1, costly)
        assert len(runs) == 2
        # A cheap task runs at every call.
        for _ in range(3):
            assert state.periodic_within_share("cheap", 0.1, lambda: None)
            time.sleep(0.005)
    finally:
        r.delete(state.PERIODIC)


def test_a_script_goes_by_its_digest_and_whole_again_to_a_redis_that_forgot_it(monkeypatch):
    from redis.connection import Connection

    r = state.get_redis()
    tag = uuid.uuid4().hex
    script = state.Script(f"return {{ARGV[1], '{tag}'}}")  # a body this Redis never saw
    sent: list[bytes] = []
    send = Connection.send_packed_command

    def record(self, command, *args, **kwargs):  # type: ignore[no-untyped-def]
        sent.append(b"".join(command) if isinstance(command, list) else command)
        return send(self, command, *args, **kwargs)

    monkeypatch.setattr(Connection, "send_packed_command", record)

    def body_sent() -> bool:
        found = any(tag.encode() in c for c in sent)
        sent.clear()
        return found

    assert script(r, 0, "a") == [b"a", tag.encode()]
    assert body_sent()  # unknown: sent whole once
    assert script(r, 0, "b") == [b"b", tag.encode()]
    assert not body_sent()  # by its digest

    r.script_flush()  # as a Redis that restarted
    assert script(r, 0, "c") == [b"c", tag.encode()]
    assert body_sent()

    pipe = r.pipeline(transaction=False)
    script(pipe, 0, "d")
    assert pipe.execute() == [[b"d", tag.encode()]]


def test_a_thread_keeps_one_connection_and_a_forked_process_gets_its_own():
    # A thread's client holds its connection (no pool between the commands); a process forked
    # from this one must not talk over the socket it inherited, or the two would read each
    # other's replies.
    import os
    import threading

    r = state.get_redis()
    key = f"{state.PREFIX}test:fork:{uuid.uuid4().hex}"
    mine = r.client_id()
    assert [r.client_id() for _ in range(5)] == [mine] * 5
    with r.pipeline(transaction=False) as pipe:  # a pipeline beside it: its own connection
        pipe.set(key, "parent")
        pipe.get(key)
        assert pipe.execute() == [True, b"parent"]
    assert r.client_id() == mine

    others: list[int] = []
    thread = threading.Thread(target=lambda: others.append(state.get_redis().client_id()))
    thread.start()
    thread.join()
    assert len(others) == 1
    assert others[0] != mine  # another thread, another client

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own client, then a hundred round trips of its own
        ok = False
        try:
            child = state.get_redis()
            ok = child.client_id() != mine
            ok = ok and all(child.incr(key + ":n") == i for i in range(1, 101))
        finally:
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
    try:
        # Meanwhile, and after, the parent's replies are its own.
        assert all(r.echo(f"p{i}") == f"p{i}".encode() for i in range(100))
        assert os.read(read, 1) == b"1"
        os.waitpid(pid, 0)
        assert r.client_id() == mine
        assert r.get(key + ":n") == b"100"
    finally:
        os.close(read)
        os.close(write)
        r.delete(key, key + ":n")


def test_a_loop_gets_its_own_async_client_and_an_ended_loop_leaves_nothing_behind():
    # An ended loop's id can come back as a new loop's (it is an address): the client made for the
    # ended loop, maybe for a Redis of another time's settings, must not be handed to the new one.
    # Kept by the loop itself, weakly, the ended loop's client goes with it.
    import asyncio
    import gc

    async def client():
        return state.get_async_redis()

    first = asyncio.new_event_loop()
    stale = first.run_until_complete(client())
    assert first.run_until_complete(client()) is stale  # one client a loop
    assert first in state._async_clients
    first_id = id(first)
    first.close()
    del first
    gc.collect()
    assert first_id not in {id(loop) for loop in state._async_clients}
    second = asyncio.new_event_loop()
    try:
        fresh = second.run_until_complete(client())
        assert fresh is not stale
        assert second.run_until_complete(client()) is fresh
    finally:
        second.close()
