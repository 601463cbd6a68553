"""The fan-out's batch is fenced by its lease and renews it in the same transaction: in process,
against a real Redis and the reliable log."""

from __future__ import annotations

import time

import pytest

from dispatch import reliable
from dispatch.fanout import _STORE, _fanout_batch, _fanout_store, _Msg, fanout_run
from dispatch.items import pull_item
from dispatch.models import StoredMessage
from dispatch.services import FANOUT_LEASE, RELEASE
from hpwsn_site import state
from tests.dispatch.test_checkpoint import _at, _subscription


@pytest.fixture
def world(db, own_redis, settings):  # type: ignore[no-untyped-def]
    settings.HPWSN_FANOUT_TICK_S = 0
    settings.HPWSN_DEDUP_WINDOW_S = 0
    _at(own_redis, 0)
    return own_redis


@pytest.fixture
def sid(world) -> str:  # type: ignore[no-untyped-def]
    """A subscription to ALL, made before anything the test publishes is accepted."""
    made = _subscription()
    time.sleep(0.01)
    return made


def _logged(n: int) -> list[reliable.LogRow]:
    now = state.shared_now()
    reliable.messages_store(
        messages=[
            StoredMessage(
                notification_id=f"l{i}-{now}",
                topic_path="ALL",
                payload=b"<wsnt:Message/>",
                accepted_at=now,
            )
            for i in range(n)
        ]
    )
    return reliable.log_read(after=0, limit=100)


def _fast(r, n: int) -> list[bytes]:  # type: ignore[no-untyped-def]
    items = []
    for i in range(n):
        nid = f"f{i}-{time.time()}"
        r.set(state.payload_key(nid), b"<wsnt:Message/>")
        items.append(f"{nid}|{time.time():.6f}|ALL".encode())
    return items


def test_a_batch_of_a_fan_out_that_lost_its_lease_writes_nothing_and_hands_back_its_items(
    world, sid
):
    r = world
    rows = _logged(2)
    items = _fast(r, 2)
    r.set(FANOUT_LEASE, "another", px=30_000)  # ours ran out; another fan-out took it

    n = _fanout_batch(r, items=items, rows=rows, position=0, token="ours", lease_ms=30_000)

    assert n == -1
    assert r.llen(state.queue_key(sid)) == 0
    assert int(r.get(state.FANOUT_SEQ) or 0) == 0, "the log position did not move"
    assert r.lrange(state.INGEST, 0, -1) == items, "handed back, in order"
    assert r.get(FANOUT_LEASE) == b"another"


def test_a_batch_under_the_lease_queues_moves_the_position_and_renews_the_lease(world, sid):
    r = world
    rows = _logged(2)
    items = _fast(r, 1)
    r.set(FANOUT_LEASE, "ours", px=500)

    n = _fanout_batch(r, items=items, rows=rows, position=0, token="ours", lease_ms=30_000)

    assert n == 3
    assert r.llen(state.queue_key(sid)) == 3
    assert int(r.get(state.FANOUT_SEQ)) == rows[-1].seq
    assert r.pttl(FANOUT_LEASE) > 20_000, "renewed with the batch"


def test_a_batch_whose_log_position_moved_meanwhile_writes_nothing(world, sid):
    r = world
    rows = _logged(1)
    r.set(FANOUT_LEASE, "ours", px=30_000)
    r.set(state.FANOUT_SEQ, rows[-1].seq)  # a fan-out that held the lease before moved it

    n = _fanout_batch(r, items=[], rows=rows, position=0, token="ours", lease_ms=30_000)

    assert n == -1
    assert r.llen(state.queue_key(sid)) == 0


def _round_trips(monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """The first command of each request this thread sends to Redis from now on (a pipeline or a
    transaction is one request)."""
    import threading

    from redis.connection import AbstractConnection

    sent: list[str] = []
    this = threading.get_ident()
    send = AbstractConnection.send_packed_command

    def counted(conn, command, *args, **kwargs):  # type: ignore[no-untyped-def]
        if threading.get_ident() == this:
            packed = command if isinstance(command, bytes) else b"".join(command)
            parts = packed.split(b"\r\n")
            name = parts[2].decode().upper()
            if name == "EVALSHA":
                name = {RELEASE.sha: "RELEASE", _STORE.sha: "STORE"}.get(parts[4].decode(), name)
            sent.append(name)
        return send(conn, command, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    return sent


def test_a_fan_out_batch_makes_two_round_trips_to_redis(world, sid, monkeypatch):
    """After the log's rows: one read of the ingest list and of the positions kept after a Redis
    loss, one script that checks the lease and the position, queues, moves the position and
    renews the lease. Before, four: the lease and the position watched, then read, then the
    transaction (and eight before that: the positions kept, the lease and the position each
    watched and read alone, and the lease renewed after the transaction)."""
    r = world
    _logged(3)
    r.rpush(state.INGEST, *_fast(r, 2))
    for script in (RELEASE, _STORE):  # as after the first run (else each is sent whole once)
        r.script_load(script.body)
    r.pipeline().ping().execute()  # and the pipelines' connection open (else its greeting)

    sent = _round_trips(monkeypatch)
    moved = fanout_run(linger=0, max_run=60, max_batches=1)
    monkeypatch.undo()

    assert moved == 5
    assert r.llen(state.queue_key(sid)) == 5
    assert r.pttl(FANOUT_LEASE) == -2, "let go at the end of the run"
    caches = {"EVALSHA", "SCRIPT", "EXISTS"}  # the index's and the tree's change checks
    assert [c for c in sent if c not in caches] == [
        "SET",  # the lease taken
        "GET",  # the log position
        "LPOP",  # the ingest list, with the positions kept after a Redis loss
        "STORE",  # fenced: queued, the position moved, the lease renewed
        "RELEASE",  # the lease let go
        "DEL",  # the flag handed back
        "LLEN",  # anything left for another run?
        "GET",
    ]


def test_a_batch_to_nine_thousand_pull_subscriptions_is_stored_whole(world):
    # Lua unpacks at most 8,000 values at once: the store script hands them to Redis a thousand at
    # a time. One message, 9,000 pull subscriptions on one pull point, each made busy.
    r = world
    nid = f"n-{time.time()}"
    r.set(state.payload_key(nid), b"<wsnt:Message/>", ex=60)  # a fast message's body
    subs = [f"s{i}" for i in range(9000)]
    message = _Msg(nid.encode(), "ALL", b"f0", state.DEFAULT_PRIORITY, time.time())

    found = _fanout_store(
        r,
        msgs=[message],
        items=[],
        rows=[],
        position=0,
        queues={},
        pulls={"pp": [pull_item(nid.encode(), sid, b"f0") for sid in subs]},
        busy=set(subs),
        refs={nid.encode(): len(subs)},
        paused=set(),
    )

    assert found == ([9000], {})
    assert r.lrange(state.pullpoint_key("pp"), 0, -1) == [
        pull_item(nid.encode(), sid, b"f0") for sid in subs
    ], "every item, in order"
    assert r.scard(state.BUSY) == 9000
    assert int(r.get(f"{state.PREFIX}refs:{nid}")) == 9000
