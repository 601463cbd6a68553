"""The pure part of the federation: peer lists, interest and its paths, origin URNs, filters."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from federation.peers import (
    MAX_PATH,
    Credentials,
    Interest,
    Origin,
    Peer,
    credentials_parse,
    expression_interest,
    group_check,
    inbound_token,
    inbound_url,
    interest_for_peer,
    interest_path_check,
    interest_reduce,
    link_filter,
    origin_id_clean,
    origin_of,
    origin_producer,
    peers_parse,
    relay_path,
    relayed_copy_of_peer,
)
from hpwsn import ns, sqlfilter, topicexpr
from topics.tree import TopicNode, TopicTree


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


_NAMES = st.sampled_from(["A", "A1", "B", "ALARM", "A-B", "AB"])
_PATHS = st.lists(_NAMES, min_size=1, max_size=4).map(":".join)
_SITES = st.lists(st.sampled_from("bcdefg"), max_size=3, unique=True).map(tuple)


@given(st.lists(st.tuples(_PATHS, _SITES), max_size=30))
def test_interest_reduced_by_prefixes_is_the_reduction_by_every_pair(held):  # type: ignore[no-untyped-def]
    # The reduction checks each topic's ancestors instead of every kept topic (10^4 sibling
    # topics took 10^8 comparisons a peer, every round); the same answer as the plain one.
    paths = [topic for topic, _path in held]
    plain: list[str] = []
    for path in sorted(set(paths)):
        if not any(path == k or path.startswith(k + ":") for k in plain):
            plain.append(path)
    assert interest_reduce(paths) == plain

    interest = [Interest(topic, path) for topic, path in held]
    asked = interest_for_peer(interest, own="a", peer="z")
    assert list(asked) == plain
    for kept, path in asked.items():
        under = [(*p, "a") for topic, p in held if topic == kept or topic.startswith(kept + ":")]
        assert path == min(under, key=lambda p: (len(p), p))


def test_the_inbound_address_names_the_peer_and_a_secret_only_this_site_can_make():
    url = inbound_url("http://a.example:8000/", "b", "secret-1")
    assert url.startswith("http://a.example:8000/federation/in/b/")
    assert inbound_token("secret-1", "b") in url
    assert inbound_token("secret-2", "b") != inbound_token("secret-1", "b")
    assert inbound_token("secret-1", "c") != inbound_token("secret-1", "b")


def test_an_origin_urn_reads_back_with_its_path():
    urn = origin_producer(("a", "b"), "0123abcd")
    assert urn == "urn:hpwsn:federation:/a/b/:0123abcd"
    assert origin_of(urn) == Origin(path=("a", "b"), id="0123abcd")
    assert origin_of(urn).site == "a"
    # A fragment's id, and a foreign peer's push id made of its wsa:MessageID, read back as such.
    assert origin_of(origin_producer(("a",), "0123:4")) == Origin(path=("a",), id="0123:4")
    assert origin_of("http://sensor-1") is None
    assert origin_of(None) is None


def test_an_origin_urn_of_a_site_before_relaying_reads_as_a_path_of_its_origin():
    assert origin_of("urn:hpwsn:federation:b:0123abcd") == Origin(path=("b",), id="0123abcd")


@pytest.mark.parametrize(
    "producer",
    [
        "urn:hpwsn:federation:/a/b/",  # no id
        "urn:hpwsn:federation://:1",  # no site
        "urn:hpwsn:federation:/a/B/:1",  # not a site name
        "urn:hpwsn:federation:/a/b/a/:1",  # a site twice
        "urn:hpwsn:federation:/a/:x y",  # not an id
        "urn:hpwsn:federation:/a/:1/c/",  # an id with the path's delimiter
        "urn:hpwsn:federation:nosep",
    ],
)
def test_a_malformed_origin_urn_is_no_origin(producer):
    assert origin_of(producer) is None


def test_an_origin_id_that_cannot_go_into_the_urn_is_digested_the_same_each_time():
    assert origin_id_clean("0123abcd:2") == "0123abcd:2"
    cleaned = origin_id_clean("http://x/y#0")
    assert cleaned == origin_id_clean("http://x/y#0") != origin_id_clean("http://x/y#1")
    assert "/" not in cleaned
    assert origin_of(origin_producer(("a",), cleaned)) == Origin(path=("a",), id=cleaned)


def _forwards(site: str, producer: str | None) -> bool:
    link = sqlfilter.compile_filter(link_filter(site))
    message = sqlfilter.message_of(None, properties={"$producer": producer, "$topic": "ALL"})
    return bool(link.evaluate(message))


@pytest.mark.parametrize(
    ("producer", "forwarded"),
    [
        (None, True),
        ("http://sensor-1", True),
        (origin_producer(("b",), "1"), True),  # stored at b from elsewhere, c not passed
        (origin_producer(("a", "b"), "1"), True),
        (origin_producer(("c", "b"), "1"), False),  # it came from c
        (origin_producer(("a", "c", "b"), "1"), False),  # it passed c
    ],
)
def test_a_link_forwards_all_but_what_has_passed_the_site_that_holds_it(producer, forwarded):
    assert _forwards("c", producer) is forwarded


def test_the_link_filter_matches_a_site_name_exactly_never_a_prefix_or_suffix_of_another():
    # Site "site" holds the link; the paths name "site-2", "my-site" and "sit", never "site".
    for path in [("site-2", "b"), ("my-site", "b"), ("sit", "b"), ("b",)]:
        assert _forwards("site", origin_producer(path, "site")), path
    assert not _forwards("site", origin_producer(("site-2", "site", "b"), "1"))
    # The id is the origin's: "/site/" can never be spelled there.
    assert _forwards("site", origin_producer(("b",), origin_id_clean("/site/")))


def test_the_link_filter_refuses_a_site_name_that_is_not_one():
    with pytest.raises(ValueError, match="site name"):
        link_filter("a%")
    with pytest.raises(ValueError, match="site name"):
        link_filter("c", others=["a_"])


def _forwards_to(site: str, others: list[str], producer: str | None) -> bool:
    link = sqlfilter.compile_filter(link_filter(site, others=others))
    message = sqlfilter.message_of(None, properties={"$producer": producer, "$topic": "ALL"})
    return bool(link.evaluate(message))


@pytest.mark.parametrize(
    ("producer", "forwarded"),
    [
        (None, True),  # b's own
        ("http://sensor-1", True),
        (origin_producer(("d", "b"), "1"), True),  # d is no peer of c: only b brings it
        (origin_producer(("a", "b"), "1"), False),  # a is c's peer: a's own link brings it
        (origin_producer(("e", "b"), "1"), False),
        ("urn:hpwsn:federation:a:1", False),  # stored at b by a site before relaying
        ("urn:hpwsn:federation:d:1", True),
        (origin_producer(("d", "c", "b"), "1"), False),  # it passed c
    ],
)
def test_a_link_refuses_what_the_holders_other_peers_published(producer, forwarded):
    # c holds this link at b; a and e are c's other peers.
    assert _forwards_to("c", ["a", "e"], producer) is forwarded


def test_the_link_filter_names_another_peer_exactly_never_a_prefix_or_suffix_of_another():
    for origin in ("site-2", "my-site", "sit"):
        assert _forwards_to("c", ["site"], origin_producer((origin, "b"), "site")), origin
        assert _forwards_to("c", ["site"], f"urn:hpwsn:federation:{origin}:site"), origin
    assert not _forwards_to("c", ["site"], origin_producer(("site", "b"), "1"))
    assert not _forwards_to("c", ["site"], "urn:hpwsn:federation:site:1")


def test_a_site_with_one_peer_states_the_link_filter_it_always_has():
    assert link_filter("c") == link_filter("c", others=[])
    assert link_filter("c") == (
        "$producer IS NULL OR $producer NOT LIKE 'urn:hpwsn:federation:%/c/%'"
    )


def test_a_direct_peers_notification_is_taken_from_that_peer_only():
    peers = {"b", "c"}
    assert not relayed_copy_of_peer(("b", "a"), peer="b", peers=peers)
    assert relayed_copy_of_peer(("b", "c", "a"), peer="c", peers=peers)
    # An origin that is no peer here comes only relayed: taken from whichever peer brings it.
    assert not relayed_copy_of_peer(("d", "c", "a"), peer="c", peers=peers)
    assert not relayed_copy_of_peer(("d", "b", "a"), peer="b", peers=peers)


def test_the_receiver_appends_itself_and_drops_a_path_that_has_been_here():
    assert relay_path(None, peer="b", own="c") == ("b", "c")
    assert relay_path(Origin(("a", "b"), "1"), peer="b", own="c") == ("a", "b", "c")
    # A site before relaying does not write itself: it is appended.
    assert relay_path(Origin(("a",), "1"), peer="b", own="c") == ("a", "b", "c")
    assert relay_path(Origin(("c", "b"), "1"), peer="b", own="c") is None
    assert relay_path(Origin(("b", "a"), "1"), peer="b", own="c") is None  # b twice


def test_own_interest_goes_to_every_peer_with_this_site_as_its_path():
    held = [Interest("ALL1"), Interest("ALL:ALARM")]
    assert interest_for_peer(held, own="b", peer="a") == {"ALL1": ("b",), "ALL:ALARM": ("b",)}


def test_a_peers_interest_is_relayed_to_the_other_peers_never_back_nor_through_a_passed_site():
    held = [Interest("ALL1", ("c",)), Interest("ALL2", ("d", "c"))]
    assert interest_for_peer(held, own="b", peer="a") == {
        "ALL1": ("c", "b"),
        "ALL2": ("d", "c", "b"),
    }
    assert interest_for_peer(held, own="b", peer="c") == {}
    assert interest_for_peer(held, own="b", peer="d") == {"ALL1": ("c", "b")}
    # Interest that started here and came back is not asked for again.
    assert interest_for_peer([Interest("ALL1", ("b", "c"))], own="b", peer="a") == {}


def test_interest_is_not_asked_for_at_a_peer_that_its_holder_asks_itself():
    """In a full mesh of a, b and c, c's link at b names a as c's other peer: c asks a for what
    its subscribers want itself, so b does not ask a for it as well (a would push it to b, and
    b's link filters would send it nowhere). Its other peers still get it relayed."""
    held = [Interest("ALL1", ("c",), peers=("a",)), Interest("ALL2", ("c",), peers=())]
    assert interest_for_peer(held, own="b", peer="a") == {"ALL2": ("c", "b")}
    assert interest_for_peer(held, own="b", peer="d") == {"ALL1": ("c", "b"), "ALL2": ("c", "b")}


def test_relayed_interest_is_reduced_and_states_the_shortest_path_it_covers():
    held = [
        Interest("ALL", ("d", "c")),
        Interest("ALL:ALARM", ()),
        Interest("ALL:ALARM", ("e",)),
        Interest("ALL1", ("e",)),
        Interest("ALL1", ("c",)),
    ]
    assert interest_for_peer(held, own="b", peer="a") == {
        "ALL": ("b",),  # its own subscribers' ALL:ALARM lies inside
        "ALL1": ("c", "b"),  # of two as short, the first in order
    }


def test_an_interest_path_is_bounded():
    longest = tuple(f"s{i}" for i in range(MAX_PATH - 1))
    assert interest_for_peer([Interest("ALL1", longest)], own="b", peer="a") == {
        "ALL1": (*longest, "b")
    }
    too_long = tuple(f"s{i}" for i in range(MAX_PATH))
    assert interest_for_peer([Interest("ALL1", too_long)], own="b", peer="a") == {}
    assert interest_path_check(longest) == longest
    with pytest.raises(ValueError, match=f"at most {MAX_PATH} sites"):
        interest_path_check((*too_long, "b"))


@pytest.mark.parametrize(
    ("sites", "error"),
    [
        ([], "at least one site"),
        (["a", "B"], "site name 'B'"),
        (["a", "a\n"], "site name"),
        (["a", "b", "a"], "names a site twice"),
    ],
)
def test_a_bad_interest_path_is_refused_precisely(sites, error):
    with pytest.raises(ValueError, match=error):
        interest_path_check(sites)


# Roots: ALL (urn:all), ALL1 (no namespace), Object (urn:obj).
_TREE_PATHS = ("ALL:ALARM:ALARM1", "ALL:ALARM:ALARM2", "ALL1", "Object:Food:Fruit")
_ROOT_NS = {"ALL": "urn:all", "ALL1": None, "Object": "urn:obj"}
_NSMAP = {"a": "urn:all", "o": "urn:obj"}


def _tree() -> TopicTree:
    names = {tuple(p.split(":")[:k]) for p in _TREE_PATHS for k in range(1, p.count(":") + 2)}
    return TopicTree(TopicNode(i, n, _ROOT_NS[n[0]]) for i, n in enumerate(sorted(names)))


def _interest(text: str, dialect: str = ns.DIALECT_FULL) -> set[str]:
    return expression_interest(topicexpr.parse(text, dialect, _NSMAP), _tree())


@pytest.mark.parametrize(
    ("text", "topics"),
    [
        # The leading concrete steps name the subtree the pattern lies in.
        ("ALL//ALARM1", {"ALL"}),
        ("ALL/*", {"ALL"}),
        ("ALL/ALARM/*", {"ALL:ALARM"}),
        ("ALL/ALARM//.", {"ALL:ALARM"}),
        ("ALL/ALARM/ALARM1", {"ALL:ALARM:ALARM1"}),
        ("a:ALL/ALARM//*", {"ALL:ALARM"}),
        # Each alternative on its own.
        ("ALL1|ALL/ALARM//*|Object//Fruit", {"ALL1", "ALL:ALARM", "Object"}),
        # A topic not here: its deepest ancestor that is (it may be created here); no root: none.
        ("ALL/ALARM/NEW/*", {"ALL:ALARM"}),
        ("NOPE/*", set()),
        # No concrete first step: every root.
        ("*", {"ALL", "ALL1", "Object"}),
        ("//ALARM", {"ALL", "ALL1", "Object"}),
        ("*/ALARM", {"ALL", "ALL1", "Object"}),
        ("//o:Fruit", {"ALL", "ALL1", "Object"}),
        # ... that its first step's namespace admits (a root without one admits every one).
        ("o:*", {"ALL1", "Object"}),
        ("o:*/Food", {"ALL1", "Object"}),
        # A root in another namespace is not the one the pattern names.
        ("o:ALL/*", set()),
    ],
)
def test_a_wildcard_expression_wants_the_subtrees_its_patterns_lie_in(text, topics):
    assert _interest(text) == topics


def test_a_concrete_expression_wants_its_topic_and_no_expression_every_root():
    assert _interest("ALL/ALARM", ns.DIALECT_CONCRETE) == {"ALL:ALARM"}
    assert _interest("ALL:ALARM:ALARM2", ns.DIALECT_COLON) == {"ALL:ALARM:ALARM2"}
    assert _interest("o:Object", ns.DIALECT_SIMPLE) == {"Object"}
    assert expression_interest(None, _tree()) == {"ALL", "ALL1", "Object"}
    assert expression_interest(None, TopicTree()) == set()


def test_the_interest_of_a_wildcard_is_reduced_with_the_rest_when_asked_of_a_peer():
    held = [Interest(t) for t in sorted(_interest("ALL/*") | _interest("ALL/ALARM/*"))]
    held.append(Interest("ALL:ALARM:ALARM1"))
    assert interest_for_peer(held, own="a", peer="b") == {"ALL": ("a",)}


def test_it_reads_each_peers_account_with_percent_escapes():
    text = " b=site-a:s3cret , c=site-a%40c:p%2Cw%3Ad:x "
    assert credentials_parse(text, peers=["b", "c", "d"]) == {
        "b": Credentials("site-a", "s3cret"),
        "c": Credentials("site-a@c", "p,w:d:x"),
    }
    assert credentials_parse("", peers=["b"]) == {}
    # The password is kept out of the representation (logs, error pages).
    assert "s3cret" not in repr(credentials_parse("b=u:s3cret", peers=["b"]))


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("b", "entry 1 is not peer=user:password"),
        ("u:s3cret", "entry 1 is not peer=user:password"),
        ("b=u:s3cret,c=s3cret", "entry 2 (c) is not peer=user:password"),
        ("b=:s3cret", "entry 1 (b) is not peer=user:password"),
        ("b=u:", "entry 1 (b) is not peer=user:password"),
        ("z=u:s3cret", "entry 1: 'z' is not a peer in HPWSN_FEDERATION_PEERS"),
        ("b=u:s3cret,b=v:s3cret", "entry 2: 'b' is named twice"),
        ("b=u%3Av:s3cret", "entry 1 (b): a line break, or a ':' in the user"),
        ("b=u:s3%0Acret", "entry 1 (b): a line break, or a ':' in the user"),
    ],
)
def test_a_malformed_credentials_list_is_refused_without_its_passwords(text, error):
    with pytest.raises(ValueError, match="HPWSN_FEDERATION_CREDENTIALS") as caught:
        credentials_parse(text, peers=["b", "c"])
    assert error in str(caught.value)
    assert "s3cret" not in str(caught.value)
    assert "s3" not in str(caught.value)


def test_the_federation_group_is_one_name_as_policies_list_them():
    assert group_check(" Federation ") == "federation"
    for bad in ("", " ", "*", "a,b"):
        with pytest.raises(ValueError, match="HPWSN_FEDERATION_GROUP"):
            group_check(bad)
