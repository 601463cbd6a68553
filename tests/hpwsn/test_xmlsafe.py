import pytest

from hpwsn.xmlsafe import XMLRejected, parse

LIMITS = {"max_bytes": 1_000_000, "max_depth": 64}

BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>
<lolz>&lol2;</lolz>"""
XXE = b"""<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]><r>&x;</r>"""


def test_it_parses_ordinary_xml():
    assert parse(b"<a><b>text</b></a>", **LIMITS).findtext("b") == "text"


@pytest.mark.parametrize("doc", [BILLION_LAUGHS, XXE])
def test_it_refuses_dtds_and_entities(doc):
    with pytest.raises(XMLRejected, match="DTD"):
        parse(doc, **LIMITS)


def test_it_refuses_deep_nesting():
    doc = b"<a>" * 65 + b"</a>" * 65
    with pytest.raises(XMLRejected, match="nesting exceeds the limit of 64"):
        parse(doc, **LIMITS)


def test_it_refuses_oversized_documents_before_parsing():
    with pytest.raises(XMLRejected, match="exceeds the limit"):
        parse(b"<a>" + b"x" * 2_000_000 + b"</a>", **LIMITS)


@pytest.mark.parametrize("doc", [b"", b"   ", b"<a>", b"<a></b>", b"\xff\xfe<a/>", b"not xml"])
def test_it_refuses_malformed_input(doc):
    with pytest.raises(XMLRejected):
        parse(doc, **LIMITS)
