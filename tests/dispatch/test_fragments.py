"""dispatch.fragments: outbound splitting of queued messages into Notify batches."""

from __future__ import annotations

from lxml import etree

from dispatch.fragments import push_batches
from hpwsn import fragment, ns

TOPIC = b'<wsnt:Topic xmlns:wsnt="' + ns.WSNT.encode() + b'" Dialect="d">ALL</wsnt:Topic>'


def stored(content: str) -> bytes:
    return TOPIC + f'<wsnt:Message xmlns:wsnt="{ns.WSNT}">{content}</wsnt:Message>'.encode()


def parse(item: bytes) -> etree._Element:
    return etree.fromstring(b'<m xmlns:wsnt="' + ns.WSNT.encode() + b'">' + item + b"</m>")


def test_nothing_is_split_when_the_fragment_size_is_zero_or_not_exceeded() -> None:
    items = [stored("<a>" + "x" * 500 + "</a>"), stored("small")]

    assert push_batches(stored=items, ids=["1", "2"], fragment_size=0, partial=False, batch=1) == [
        (["1", "2"], items)
    ]
    assert push_batches(
        stored=items, ids=["1", "2"], fragment_size=4096, partial=False, batch=1
    ) == [(["1", "2"], items)]


def test_a_large_message_becomes_ordered_fragments_in_batches_between_whole_messages() -> None:
    big = "<e:doc xmlns:e='urn:t'>" + "<e:l>中文 &amp; &lt;x&gt;</e:l>" * 40 + "</e:doc>"
    items = [stored("first"), stored(big), stored("last")]

    batches = push_batches(
        stored=items, ids=["a", "b", "c"], fragment_size=64, partial=True, batch=7
    )

    ids = [i for batch_ids, _ in batches for i in batch_ids]
    out = [x for _, batch in batches for x in batch]
    assert all(len(batch) <= 7 for _, batch in batches)
    assert ids[0] == "a"
    assert ids[-1] == "c"
    assert out[0] == items[0]
    assert out[-1] == items[-1]
    pieces = [parse(x) for x in out[1:-1]]
    assert ids[1:-1] == [f"b:{i}" for i in range(len(pieces))]
    r = fragment.Reassembler()
    for p in pieces:
        assert p.findtext(f"{{{ns.WSNT}}}Topic") == "ALL"  # every fragment keeps the Topic
        package = p.find(f"{{{ns.WSNT}}}Package")
        assert package is not None
        f = fragment.from_parts(
            identification=package.findtext("Identification") or "",
            flags=package.findtext("Fragment") or "",
            text=p.findtext(f"{{{ns.WSNT}}}Message") or "",
        )
        assert f.identification == "b"
        assert f.partial_allowed
        assert len(f.data) <= 64
        r.add(f)
    (doc,) = etree.fromstring(b"<w>" + r.payload() + b"</w>")
    assert etree.tostring(doc, method="c14n", exclusive=True) == etree.tostring(
        etree.fromstring(big.encode()), method="c14n", exclusive=True
    )


def test_a_fragment_passed_through_is_never_split_again() -> None:
    # The stored form of a fragment accepted with P=1: Topic, Package and Message side by side.
    item = (
        TOPIC
        + (
            f'<wsnt:Package xmlns:wsnt="{ns.WSNT}"><Identification>p</Identification>'
            f"<Fragment>1-0-1-0</Fragment></wsnt:Package>"
        ).encode()
        + stored("y" * 100)[len(TOPIC) :]
    )

    assert push_batches(stored=[item], ids=["n"], fragment_size=10, partial=False, batch=100) == [
        (["n"], [item])
    ]
