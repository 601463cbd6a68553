"""What the SOAP operations read from the database at every call: a poll (GetMessages), a Renew."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from dispatch.items import pull_item
from hpwsn import errors, wsn
from hpwsn.wsn import TopicRef
from hpwsn_site import state
from subscriptions import selectors
from subscriptions import services as subs
from topics import services as topics
from topics.acl import Principal

ADMIN = Principal(name="admin1", groups=frozenset({"hpwsn-admins"}))
OTHER = Principal(name="someone", groups=frozenset())


def _pull_subscription(pull_point_address: str) -> Any:
    sub, _created = subs.subscription_create(
        consumer_address=pull_point_address,
        topic=TopicRef(text="Plant:Hall", dialect=None, nsmap={}),
        content=None,
        initial_termination_time=None,
        soap_version="1.2",
        use_raw=False,
        base_url="http://testserver",
        principal=ADMIN,
    )
    return sub


def _render(items: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return items


@pytest.mark.django_db(transaction=True)
def test_a_poll_reads_the_pull_point_and_its_addresses_in_two_statements(
    django_assert_num_queries: Any,
) -> None:
    topics.topic_create(path="Plant:Hall")
    pp = subs.pull_point_create(base_url="http://testserver", principal=ADMIN)
    first, second = _pull_subscription(pp.address), _pull_subscription(pp.address)
    other = subs.pull_point_create(base_url="http://testserver", principal=ADMIN)
    _pull_subscription(other.address)  # feeds another pull point: not among the addresses

    row, refs = selectors.pull_point_read(pp.id)

    assert row is not None
    assert (row.id, row.owner, row.destroyed_at) == (pp.id, pp.owner, None)
    assert refs == {str(s.id): s.reference_address for s in (first, second)}
    assert selectors.pull_point_read(uuid.uuid4()) == (None, {})

    # Each message handed out carries the address of the subscription that brought it.
    r = state.get_redis()
    key = state.pullpoint_key(str(pp.id))
    n1, n2 = uuid.uuid4().hex, uuid.uuid4().hex
    try:
        r.set(state.payload_key(n1), b"<m>1</m>")
        r.rpush(key, pull_item(n1.encode(), str(second.id), b"f0"))
        subs.pull_point_get_messages(
            pull_point_id=str(pp.id), maximum=None, render=_render, principal=ADMIN
        )  # the first call marks the pull point used
        r.set(state.payload_key(n2), b"<m>2</m>")
        r.rpush(key, pull_item(n2.encode(), str(first.id), b"f0"))
        # A poll within the minute: the two reads, nothing written.
        with django_assert_num_queries(2):
            got = subs.pull_point_get_messages(
                pull_point_id=str(pp.id), maximum=None, render=_render, principal=ADMIN
            )
        assert got == [(first.reference_address, b"<m>2</m>")]
    finally:
        r.delete(key, state.payload_key(n1), state.payload_key(n2))


@pytest.mark.django_db(transaction=True)
def test_a_poll_of_an_unknown_a_foreign_or_a_destroyed_pull_point_is_refused() -> None:
    pp = subs.pull_point_create(base_url="http://testserver", principal=ADMIN)
    render = lambda items: wsn.get_messages_response(items)  # noqa: E731

    for unknown in ("not-a-uuid", str(uuid.uuid4())):
        with pytest.raises(errors.ResourceUnknown, match="does not exist"):
            subs.pull_point_get_messages(
                pull_point_id=unknown, maximum=None, render=render, principal=ADMIN
            )
    with pytest.raises(errors.NotAuthorized):
        subs.pull_point_get_messages(
            pull_point_id=str(pp.id), maximum=None, render=render, principal=OTHER
        )
    subs.pull_point_destroy(pull_point_id=str(pp.id), principal=ADMIN)
    with pytest.raises(errors.ResourceUnknown, match="destroyed"):
        subs.pull_point_get_messages(
            pull_point_id=str(pp.id), maximum=None, render=render, principal=ADMIN
        )


@pytest.mark.django_db(transaction=True)
def test_a_subscription_is_read_by_its_id_in_any_spelling_and_only_by_an_id() -> None:
    topics.topic_create(path="Plant:Hall")
    pp = subs.pull_point_create(base_url="http://testserver", principal=ADMIN)
    sub = _pull_subscription(pp.address)

    for spelling in (str(sub.id), str(sub.id).upper(), sub.id.hex):
        row = selectors.subscription_row(spelling)
        assert row is not None
        assert (row.id, row.reference_address) == (sub.id, sub.reference_address)
    for nothing in (str(uuid.uuid4()), "not-an-id", ""):
        assert selectors.subscription_row(nothing) is None
    renewed = subs.subscription_renew(
        subscription_id=str(sub.id), termination_time="PT5M", principal=ADMIN
    )
    assert renewed.termination_time is not None
    with pytest.raises(errors.NotAuthorized):
        subs.subscription_renew(
            subscription_id=str(sub.id), termination_time="PT5M", principal=OTHER
        )


@pytest.mark.django_db(transaction=True)
def test_a_getmessages_sent_again_after_its_answer_was_lost_gets_the_same_messages() -> None:
    # GetMessages took the messages off the pull point before its answer was on its way: an
    # answer lost then (a cut connection, a killed web process) lost them, on reliable topics
    # too. The answer of a request with an id is kept until the next GetMessages.
    topics.topic_create(path="Plant:Hall")
    pp = subs.pull_point_create(base_url="http://testserver", principal=ADMIN)
    sub = _pull_subscription(pp.address)
    r = state.get_redis()
    nids = [uuid.uuid4().hex for _ in range(4)]
    for i, nid in enumerate(nids):
        r.set(state.payload_key(nid), f"<m>{i}</m>".encode())
        r.set(f"{state.PREFIX}refs:{nid}", 1)  # the pull point's reference, its only one
        r.rpush(state.pullpoint_key(str(pp.id)), pull_item(nid.encode(), str(sub.id), b"f0"))

    def take(request_id: str | None) -> list[bytes]:
        got = subs.pull_point_get_messages(
            pull_point_id=str(pp.id),
            maximum=2,
            render=_render,
            principal=ADMIN,
            request_id=request_id,
        )
        return [payload for _address, payload in got]

    first = take("urn:uuid:first")
    assert first == [b"<m>0</m>", b"<m>1</m>"]
    assert take("urn:uuid:first") == first  # its answer lost: the same request again
    assert take("urn:uuid:second") == [b"<m>2</m>", b"<m>3</m>"]
    # The second request acknowledged the first answer: its bodies went.
    assert not r.exists(state.payload_key(nids[0]), state.payload_key(nids[1]))
    assert take("urn:uuid:second") == [b"<m>2</m>", b"<m>3</m>"]
    assert take("urn:uuid:first") == []  # an older request is a poll like any other
    assert not r.exists(*(state.payload_key(n) for n in nids))

    # Without an id nothing is kept, and destroying the pull point drops what is kept.
    r.set(state.payload_key(nids[0]), b"<m>again</m>")
    r.set(f"{state.PREFIX}refs:{nids[0]}", 1)
    r.rpush(state.pullpoint_key(str(pp.id)), pull_item(nids[0].encode(), str(sub.id), b"f0"))
    assert take(None) == [b"<m>again</m>"]
    assert not r.exists(state.payload_key(nids[0]), *state.pull_answer_keys(str(pp.id)))
    r.set(state.payload_key(nids[1]), b"<m>kept</m>")
    r.set(f"{state.PREFIX}refs:{nids[1]}", 1)
    r.rpush(state.pullpoint_key(str(pp.id)), pull_item(nids[1].encode(), str(sub.id), b"f0"))
    assert take("urn:uuid:third") == [b"<m>kept</m>"]
    subs.pull_point_destroy(pull_point_id=str(pp.id), principal=ADMIN)
    assert not r.exists(state.payload_key(nids[1]), *state.pull_answer_keys(str(pp.id)))
