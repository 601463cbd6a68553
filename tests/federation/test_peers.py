"""The pure part of the federation: peer lists, interest, origin URNs, the link filter."""

from __future__ import annotations

import pytest

from federation.peers import (
    LINK_FILTER,
    Peer,
    inbound_token,
    inbound_url,
    interest_reduce,
    origin_of,
    origin_producer,
    peers_parse,
)
from hpwsn import sqlfilter


def test_it_reads_the_peer_list():
    peers = peers_parse(" b=http://10.0.0.2:8000/ , c=https://c.example ", own="a")
    assert peers == (Peer("b", "http://10.0.0.2:8000"), Peer("c", "https://c.example"))
    assert peers[0].endpoint == "http://10.0.0.2:8000/wsn/"
    assert peers_parse("", own="a") == ()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("b", "is not name=http"),
        ("b=ftp://x", "is not name=http"),
        ("B=http://x", "site name 'B'"),
        ("a=http://x", "this site's own name"),
        ("b=http://x,b=http://y", "named twice"),
    ],
)
def test_it_refuses_a_bad_peer_list_precisely(text, error):
    with pytest.raises(ValueError, match=error):
        peers_parse(text, own="a")


def test_interest_keeps_only_subtrees_not_inside_another():
    paths = ["ALL:ALARM:ALARM1", "ALL:ALARM", "ALL1", "ALL10", "", "ALL1:X", "ALL:ALARM"]
    assert interest_reduce(paths) == ["ALL1", "ALL10", "ALL:ALARM"]


def test_the_inbound_address_names_the_peer_and_a_secret_only_this_site_can_make():
    url = inbound_url("http://a.example:8000/", "b", "secret-1")
    assert url.startswith("http://a.example:8000/federation/in/b/")
    assert inbound_token("secret-1", "b") in url
    assert inbound_token("secret-2", "b") != inbound_token("secret-1", "b")
    assert inbound_token("secret-1", "c") != inbound_token("secret-1", "b")


def test_an_origin_urn_reads_back():
    urn = origin_producer("b", "0123abcd")
    assert origin_of(urn) == ("b", "0123abcd")
    assert origin_of("http://sensor-1") is None
    assert origin_of(None) is None


@pytest.mark.parametrize(
    ("producer", "forwarded"),
    [(None, True), ("http://sensor-1", True), (origin_producer("b", "1"), False)],
)
def test_a_link_forwards_local_notifications_and_never_forwarded_ones(producer, forwarded):
    link = sqlfilter.compile_filter(LINK_FILTER)
    message = sqlfilter.message_of(None, properties={"$producer": producer, "$topic": "ALL"})
    assert bool(link.evaluate(message)) is forwarded
