"""The reliable log's writes: what group commit may put together in one transaction."""

from __future__ import annotations

import time

import pytest

from dispatch.models import StoredMessage
from dispatch.reliable import messages_store

pytestmark = pytest.mark.django_db


def _message(nid: str, key: str | None) -> StoredMessage:
    return StoredMessage(
        notification_id=nid,
        topic_path="ALL",
        payload=b"<m/>",
        accepted_at=time.time(),
        idempotency_key=key,
    )


def test_a_repeated_key_within_one_batch_is_stored_once_under_the_first_id():
    # A publisher's retry grouped into the same commit as its original, beside another request.
    ids = messages_store(
        messages=[_message("a1", None), _message("b1", "pub|m-1#0"), _message("c1", "pub|m-1#0")]
    )

    assert ids == ["a1", "b1", "b1"]
    stored = StoredMessage.objects.order_by("seq").values_list("notification_id", flat=True)
    assert list(stored) == ["a1", "b1"]


def test_a_key_already_in_the_log_answers_with_the_id_it_was_first_accepted_under():
    messages_store(messages=[_message("first", "pub|m-2#0")])

    assert messages_store(messages=[_message("again", "pub|m-2#0")]) == ["first"]
    assert StoredMessage.objects.filter(idempotency_key="pub|m-2#0").count() == 1


def test_a_commit_of_more_keys_than_one_query_takes_finds_every_one_already_in_the_log():
    """Group commit may put together more keys than one statement's parameters allow: they are
    looked up in slices, and a key of the last slice is found as surely as one of the first."""
    messages_store(messages=[_message(f"old{i}", f"pub|k-{i}#0") for i in (0, 700, 1199)])
    batch = [_message(f"new{i}", f"pub|k-{i}#0") for i in range(1200)]

    ids = messages_store(messages=batch)

    assert [ids[0], ids[700], ids[1199]] == ["old0", "old700", "old1199"]
    assert ids[1:700] == [f"new{i}" for i in range(1, 700)]
    assert StoredMessage.objects.filter(idempotency_key__startswith="pub|k-").count() == 1200


def test_an_ended_loops_writer_goes_with_it():
    # An ended loop's id can pass to a new loop (it is an address). A writer the loop left
    # "running", its drain cut off by the loop's end, would never drain a new loop's requests: it
    # must not be the new loop's writer.
    import asyncio
    import gc

    from dispatch import reliable

    async def writer():
        return reliable.log_writer()

    loop = asyncio.new_event_loop()
    left = loop.run_until_complete(writer())
    assert loop.run_until_complete(writer()) is left  # one writer a loop
    left.running = True  # as when the loop ended during a commit
    loop.close()
    del loop
    gc.collect()
    assert all(w is not left for w in reliable._writers.values())
    fresh = asyncio.run(writer())
    assert fresh is not left
    assert not fresh.running
