"""hpwsn.fragment: the thesis's F-M-P-OFFSET fragments (5.3.3.4), split and reassembled."""

from __future__ import annotations

import random

import pytest
from lxml import etree

from hpwsn import fragment, ns
from hpwsn.fragment import Fragment, FragmentConflict, FragmentError, FragmentLimit, Reassembler

SIZE = 64
MULTIPLES = [1, 2, 5, 10, 100]
ALPHABETS = {
    "ascii": "abcdefghij klmnopqrstuvwxyz0123456789",
    "multibyte": "aé中文€𝄞😀ß\u00a0ü",  # 1, 2, 3 and 4 byte characters
    "markup": "<>&\"'\r\n\t]]>",
}


def random_text(rng: random.Random, alphabet: str, n_bytes: int) -> bytes:
    out: list[str] = []
    size = 0
    while size < n_bytes:
        ch = rng.choice(alphabet)
        size += len(ch.encode())
        out.append(ch)
    return "".join(out).encode()


def random_xml(rng: random.Random, n_bytes: int) -> bytes:
    """Serialized mixed XML content (elements, attributes, escaped text, CJK), about n_bytes."""
    parts: list[str] = []
    size = 0
    i = 0
    while size < n_bytes:
        text = random_text(rng, ALPHABETS["multibyte"] + "<&>", rng.randint(0, 40)).decode()
        esc = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        part = f'<e:item xmlns:e="urn:t" n="{i}" q="a&amp;b">{esc}<e:sub/></e:item>tail {i} '
        parts.append(part)
        size += len(part.encode())
        i += 1
    return "".join(parts).encode()


def payloads(seed: int) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    out = []
    for multiple in MULTIPLES:
        n = SIZE * multiple
        for name, alphabet in ALPHABETS.items():
            out.append((f"{name}-{multiple}x", random_text(rng, alphabet, n)))
        out.append((f"xml-{multiple}x", random_xml(rng, n)))
    return out


def wire(f: Fragment) -> Fragment:
    """The fragment as a consumer sees it: rendered into XML, parsed, read back."""
    xml = (
        f'<wsnt:NotificationMessage xmlns:wsnt="{ns.WSNT}">{f.package_xml()}{f.message_xml()}'
        "</wsnt:NotificationMessage>"
    )
    el = etree.fromstring(xml.encode())
    package = el.find(f"{{{ns.WSNT}}}Package")
    assert package is not None
    message = el.find(f"{{{ns.WSNT}}}Message")
    assert message is not None
    assert len(message) == 0  # the piece is text, never markup
    return fragment.from_parts(
        identification=package.findtext("Identification") or "",
        flags=package.findtext("Fragment") or "",
        text=message.text or "",
    )


@pytest.mark.parametrize(("name", "payload"), payloads(seed=4))
def test_split_fragments_reassemble_out_of_order_to_the_original(name: str, payload: bytes) -> None:
    parts = fragment.split(
        payload, fragment_size=SIZE, identification="id-1", partial_allowed=False
    )

    assert all(len(p.data) <= SIZE for p in parts)
    assert [p.offset for p in parts] == list(range(len(parts)))
    assert [p.more for p in parts] == [True] * (len(parts) - 1) + [False]
    for p in parts:
        p.data.decode("utf-8")  # never cut inside a character
    assert b"".join(p.data for p in parts) == payload
    shuffled = [wire(p) for p in parts]
    random.Random(name).shuffle(shuffled)
    r = Reassembler()
    for i, p in enumerate(shuffled):
        assert not r.complete, i
        assert r.add(p) is True
    assert r.complete
    assert r.expected == len(parts)
    assert r.payload() == payload


def test_a_payload_of_exactly_one_fragment_size_is_one_last_fragment() -> None:
    parts = fragment.split(
        b"x" * SIZE, fragment_size=SIZE, identification="a", partial_allowed=True
    )

    assert len(parts) == 1
    assert str(parts[0].flags) == "1-0-1-0"


def test_a_multibyte_character_is_never_cut_and_fragments_stay_within_the_size() -> None:
    payload = "中" * 10  # 3 bytes each: 4 bytes per fragment fits one character, not two

    parts = fragment.split(
        payload.encode(), fragment_size=5, identification="a", partial_allowed=False
    )

    assert [p.data.decode() for p in parts] == ["中"] * 10


def test_the_package_is_rendered_as_in_the_thesis() -> None:
    parts = fragment.split(
        b"abcdefgh", fragment_size=4, identification="1235<3>", partial_allowed=False
    )

    assert parts[0].package_xml() == (
        "<wsnt:Package><Identification>1235&lt;3&gt;</Identification>"
        "<Fragment>1-1-0-0</Fragment></wsnt:Package>"
    )
    assert parts[1].package_xml().endswith("<Fragment>1-0-0-1</Fragment></wsnt:Package>")


def test_carriage_returns_and_markup_survive_a_parser() -> None:
    payload = b"a\r\nb <c> & ]]> \r"

    (only,) = fragment.split(payload, fragment_size=64, identification="a", partial_allowed=False)

    assert wire(only).data == payload


def test_the_99999_fragment_limit_is_a_clear_error() -> None:
    fragment.split(b"x" * 4 * 99_999, fragment_size=4, identification="a", partial_allowed=False)

    with pytest.raises(FragmentLimit, match="more than 99999 fragments"):
        fragment.split(
            b"x" * (4 * 99_999 + 1), fragment_size=4, identification="a", partial_allowed=False
        )


def test_a_fragment_size_below_one_character_is_refused() -> None:
    with pytest.raises(FragmentError, match="below 4 bytes"):
        fragment.split(b"abc", fragment_size=3, identification="a", partial_allowed=False)


def test_a_payload_that_is_not_utf8_is_refused() -> None:
    with pytest.raises(FragmentError, match="not UTF-8"):
        fragment.split(b"\xff\xfe", fragment_size=8, identification="a", partial_allowed=False)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1-1-0-3", fragment.Flags(True, True, False, 3)),
        ("0-0-1-0", fragment.Flags(False, False, True, 0)),
        ("1-0-1-99999", fragment.Flags(True, False, True, 99_999)),
        (" 1-0-0-00007 ", fragment.Flags(True, False, False, 7)),
    ],
)
def test_flags_are_parsed(text: str, expected: fragment.Flags) -> None:
    assert fragment.parse_flags(text) == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("1-1-0-100000", "exceeds 99999"),
        ("1-1-0-" + "9" * 5000, "exceeds 99999"),
        ("2-1-0-3", "F-M-P-OFFSET"),
        ("01-1-0-3", "F-M-P-OFFSET"),
        ("1-1-0", "F-M-P-OFFSET"),
        ("1-1-0--3", "F-M-P-OFFSET"),
        ("1-1-0-\u0663", "F-M-P-OFFSET"),  # an Arabic-Indic digit is not an offset
        ("", "F-M-P-OFFSET"),
    ],
)
def test_malformed_flags_name_the_problem(text: str, problem: str) -> None:
    with pytest.raises(FragmentError, match=problem):
        fragment.parse_flags(text)


def frag(offset: int, data: bytes, *, more: bool = True, ident: str = "m") -> Fragment:
    return Fragment(ident, offset, more, False, data)


def test_a_duplicate_is_ignored_and_a_conflicting_copy_is_refused() -> None:
    r = Reassembler()
    assert r.add(frag(0, b"ab"))
    assert r.add(frag(0, b"ab")) is False
    with pytest.raises(FragmentConflict, match="other content"):
        r.add(frag(0, b"xx"))
    assert r.received == 1


def test_fragments_past_the_last_or_a_second_last_are_conflicts() -> None:
    r = Reassembler()
    r.add(frag(3, b"d"))
    with pytest.raises(FragmentConflict, match="says it is the last"):
        r.add(frag(1, b"b", more=False))
    r.add(frag(4, b"e", more=False))
    with pytest.raises(FragmentConflict, match="beyond its last"):
        r.add(frag(5, b"f"))
    with pytest.raises(FragmentConflict, match="reassembly of 'm'"):
        r.add(frag(0, b"a", ident="other"))
    assert not r.complete
    assert r.missing() == [0, 1, 2]
    with pytest.raises(FragmentError, match=r"misses offsets \[0, 1, 2\]"):
        r.payload()


def test_the_reassembly_limits_are_enforced() -> None:
    r = Reassembler(max_fragments=3, max_bytes=5)
    r.add(frag(0, b"abc"))
    with pytest.raises(FragmentLimit, match="limit of 3 fragments"):
        r.add(frag(3, b"d"))
    with pytest.raises(FragmentLimit, match="6 bytes, more than the limit of 5 bytes"):
        r.add(frag(1, b"def"))
    assert r.size == 3


def test_an_unfragmented_package_is_not_a_fragment() -> None:
    with pytest.raises(FragmentError, match="F=0"):
        fragment.from_parts(identification="a", flags="0-0-1-0", text="x")
