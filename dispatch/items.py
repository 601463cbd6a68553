"""Queue items: what a subscription's queue, or a pull point, holds for each message.

A queue item is b"<notification id>|<mark>"; a pull point's is b"<notification id>|<subscription
id>|<mark>". The mark says where the message stands against the reliable log
(dispatch/reliable.py): b"r<seq>" a reliable message (its log row), b"f<F>" a fast one, fanned
out when the fan-out position was F, b"d<row>" a redriven dead letter (its row in the store).
The message's body is kept once, under its id (dispatch/bodies.py).

The Lua scripts read the same layout: the id is what comes before the first "|", the mark what
follows the last.
"""

from __future__ import annotations

from collections.abc import Iterable


def reliable_mark(seq: int) -> bytes:
    return b"r%d" % seq


def fast_mark(position: int) -> bytes:
    return b"f%d" % position


def letter_mark(row: int) -> bytes:
    return b"d%d" % row


def queue_item(nid: bytes, mark: bytes) -> bytes:
    return nid + b"|" + mark


def pull_item(nid: bytes, subscription_id: str, mark: bytes) -> bytes:
    return nid + b"|" + subscription_id.encode() + b"|" + mark


def item_id(item: bytes) -> str:
    """The notification id of a queue or pull point item."""
    return item.split(b"|", 1)[0].decode()


def pull_item_ids(item: bytes) -> tuple[str, str]:
    """The notification and subscription ids of a pull point item."""
    nid, sid, _mark = item.split(b"|", 2)
    return nid.decode(), sid.decode()


def letter_rows(items: Iterable[bytes]) -> list[int]:
    """The dead-letter rows behind redriven items (their mark is b"d<row id>")."""
    found = []
    for item in items:
        mark = item.rsplit(b"|", 1)[-1]
        if mark[:1] == b"d" and mark[1:].isdigit():
            found.append(int(mark[1:]))
    return found
