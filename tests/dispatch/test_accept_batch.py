"""Concurrent accepts share one Redis call: each request gets its own messages' answers, a
repeated key is answered as in separate calls, and the fan-out is started once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.db import connections

from dispatch import accept
from hpwsn_site import state
from topics.tree import Policy, TopicNode

FAST = TopicNode(id=1, names=("Batch",), root_namespace=None, policy=Policy(reliability="fast"))


def _message(i: int) -> accept.Accepted:
    body = f"<m>{i}</m>".encode()
    return accept.Accepted(node=FAST, fragment=body, content=body)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The fan-out tasks the accepts start (none is run: no worker reads this Redis)."""
    calls: list[int] = []
    monkeypatch.setattr(accept.tasks.fanout, "delay", lambda: calls.append(1))
    return calls


def _run(requests: list[tuple[list[accept.Accepted], str | None]]) -> tuple[list[list[str]], int]:
    """The requests at once; their ids and the number of calls of the accept script."""

    async def run() -> tuple[list[list[str]], int]:
        batcher = accept._accept_batcher(state.get_async_redis())
        script, calls = batcher._script, []

        async def counted(**kwargs: Any) -> Any:
            calls.append(1)
            return await script(**kwargs)

        batcher._script = counted
        try:
            ids = await asyncio.gather(
                *(accept._accepted_store(msgs, key, accept.acl.ANONYMOUS) for msgs, key in requests)
            )
        finally:
            batcher._script = script
        return list(ids), len(calls)

    return asyncio.run(run())


def test_requests_ready_at_once_go_to_redis_in_one_call_and_each_gets_its_own_ids(
    own_redis: Any, started: list[int]
) -> None:
    requests = [([_message(10 * k + j) for j in range(k % 3 + 1)], None) for k in range(12)]

    ids, calls = _run(requests)

    assert calls == 1
    assert [len(x) for x in ids] == [len(msgs) for msgs, _key in requests]
    flat = [i for x in ids for i in x]
    assert len(set(flat)) == len(flat)
    # Every message is on the ingest list, under its own id, in the order of the requests.
    ingest = [item.split(b"|")[0].decode() for item in own_redis.lrange(state.INGEST, 0, -1)]
    assert ingest == flat
    bodies = [own_redis.get(state.payload_key(i)) for i in flat]
    assert bodies == [m.fragment for msgs, _key in requests for m in msgs]
    assert started == [1]  # one fan-out task for the whole call
    assert int(own_redis.hget(accept.STATS, "accepted") or 0) == len(flat)


def test_a_key_repeated_by_requests_in_one_call_is_answered_with_the_first_ids(
    own_redis: Any, started: list[int]
) -> None:
    first = [_message(1), _message(2)]
    again = [_message(1), _message(2)]
    other = [_message(3)]

    ids, calls = _run([(first, "k-1"), (other, "k-2"), (again, "k-1")])

    assert calls == 1
    assert ids[2] == ids[0]
    assert ids[1] != ids[0]
    assert own_redis.llen(state.INGEST) == 3  # the repeat stored nothing
    assert int(own_redis.hget(accept.STATS, "accepted") or 0) == 3


def test_a_request_cancelled_in_a_call_leaves_the_others_their_answers_and_the_fan_out_started(
    own_redis: Any, started: list[int]
) -> None:
    async def run() -> list[object]:
        tasks = [
            asyncio.create_task(accept._accepted_store([_message(k)], None, accept.acl.ANONYMOUS))
            for k in range(3)
        ]
        await asyncio.sleep(0)  # each has joined the call, which is sent at the next turn
        tasks[0].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    cancelled, *answered = asyncio.run(run())

    assert isinstance(cancelled, asyncio.CancelledError)
    assert all(isinstance(ids, list) and len(ids) == 1 for ids in answered)
    assert own_redis.llen(state.INGEST) == 3  # the cancelled request's message is stored too
    assert started == [1]


RELIABLE = TopicNode(id=2, names=("Kept",), root_namespace=None)  # the root's default: reliable


@pytest.mark.django_db(transaction=True)
def test_with_redis_down_a_reliable_request_of_the_call_is_accepted_and_a_fast_one_refused(
    own_redis: Any, started: list[int]
) -> None:
    # The call's failure reaches each request, which answers by its own messages: reliable ones
    # are in the log already (the checkpoint starts the fan-out once Redis is back).
    from redis.exceptions import RedisError

    from dispatch.models import StoredMessage

    kept = accept.Accepted(node=RELIABLE, fragment=b"<m>kept</m>", content=b"<m>kept</m>")
    own_redis.shutdown(nosave=True)

    async def run() -> list[object]:
        answers = await asyncio.gather(
            accept._accepted_store([kept], None, accept.acl.ANONYMOUS),
            accept._accepted_store([_message(1)], None, accept.acl.ANONYMOUS),
            return_exceptions=True,
        )
        await accept.reliable_log.log_thread.run(connections.close_all)  # its kept connection
        return answers

    reliable_ids, fast = asyncio.run(run())

    assert isinstance(fast, RedisError)
    assert isinstance(reliable_ids, list)
    assert list(StoredMessage.objects.values_list("notification_id", "payload")) == [
        (reliable_ids[0], b"<m>kept</m>")
    ]
    assert started == []
