"""Queue items, encoded and read in one place."""

from __future__ import annotations

from dispatch.items import (
    fast_mark,
    item_id,
    letter_mark,
    letter_rows,
    pull_item,
    pull_item_ids,
    queue_item,
    reliable_mark,
)
from dispatch.models import DeadLetter


def test_items_carry_the_id_first_and_the_mark_last():
    items = [
        queue_item(b"n1", reliable_mark(41)),
        queue_item(b"n2", fast_mark(7)),
        queue_item(b"n3", letter_mark(12)),
    ]
    assert items == [b"n1|r41", b"n2|f7", b"n3|d12"]
    assert [item_id(i) for i in items] == ["n1", "n2", "n3"]
    assert letter_rows(items) == [12]  # only the redriven letter names a row

    pulled = pull_item(b"n4", "sub-1", reliable_mark(3))
    assert pulled == b"n4|sub-1|r3"
    assert item_id(pulled) == "n4"
    assert pull_item_ids(pulled) == ("n4", "sub-1")
    assert letter_rows([pull_item(b"n5", "sub-1", letter_mark(9))]) == [9]


def test_a_redriven_letter_is_queued_as_an_item_naming_its_row():
    letter = DeadLetter(id=77, notification_id="n9")
    assert letter.queue_item == b"n9|d77"
    assert letter_rows([letter.queue_item]) == [77]
