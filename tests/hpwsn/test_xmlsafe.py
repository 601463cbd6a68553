import pytest

from hpwsn.xmlsafe import XMLRejected, charset_of, parse

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


# ----------------------------------------------------------------------------- encodings

ENVELOPE = '<s:Envelope xmlns:s="urn:s"><s:Body><x>café</x></s:Body></s:Envelope>'


def test_it_reads_utf_16_with_a_byte_order_mark():
    doc = ('<?xml version="1.0" encoding="UTF-16"?>' + ENVELOPE).encode("utf-16")
    assert parse(doc, **LIMITS).findtext(".//x") == "café"


def test_it_reads_utf_8_with_a_byte_order_mark():
    assert parse(b"\xef\xbb\xbf<a>b</a>", **LIMITS).text == "b"


@pytest.mark.parametrize(
    "doc",
    [
        ('<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE r [<!ENTITY x SYSTEM '
         '"file:///etc/passwd">]><r>&x;</r>').encode("utf-16"),
        ('<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE r [<!ENTITY a "aaaa">'
         '<!ENTITY b "&a;&a;&a;&a;">]><r>&b;</r>').encode("utf-16-le"),
        b"<!DOCTYPE r><r/>",
    ],
    ids=["utf16-external-entity", "utf16-le-without-bom-entity-expansion", "bare-doctype"],
)  # fmt: skip
def test_it_refuses_dtds_in_every_encoding(doc):
    with pytest.raises(XMLRejected, match="DTDs and entity declarations are not allowed"):
        parse(doc, **LIMITS)


def test_it_refuses_utf_16_that_declares_itself_utf_8():
    doc = ('<?xml version="1.0" encoding="utf-8"?>' + ENVELOPE).encode("utf-16")
    with pytest.raises(XMLRejected, match="says encoding 'utf-8' but the document is UTF-16"):
        parse(doc, **LIMITS)


def test_it_refuses_utf_8_that_declares_itself_utf_16():
    doc = ('<?xml version="1.0" encoding="UTF-16"?>' + ENVELOPE).encode()
    with pytest.raises(XMLRejected, match="says encoding 'UTF-16' but the document is UTF-8"):
        parse(doc, **LIMITS)


@pytest.mark.parametrize(
    ("doc", "mentions"),
    [
        ('<?xml version="1.0" encoding="ISO-8859-1"?><a>é</a>'.encode("latin-1"), "ISO-8859-1"),
        (b'<?xml version="1.0" encoding="UTF-7"?><a>x</a>', "UTF-7"),
        ('<?xml version="1.0" encoding="UCS-4"?><a/>'.encode("utf-32"), "UCS-4"),
        ('<?xml version="1.0" encoding="EBCDIC-US"?><a/>'.encode("cp500"), "EBCDIC"),
    ],
    ids=["latin-1", "utf-7", "ucs-4", "ebcdic"],
)
def test_it_reads_only_utf_8_and_utf_16(doc, mentions):
    with pytest.raises(XMLRejected, match=mentions):
        parse(doc, **LIMITS)


def test_the_transport_charset_must_match_the_document():
    doc = ('<?xml version="1.0" encoding="UTF-16"?>' + ENVELOPE).encode("utf-16")
    assert parse(doc, **LIMITS, charset="UTF-16").findtext(".//x") == "café"
    with pytest.raises(XMLRejected, match="Content-Type says charset 'utf-8' but the document is"):
        parse(doc, **LIMITS, charset="utf-8")
    with pytest.raises(XMLRejected, match="charset 'iso-8859-1' is not UTF-8 or UTF-16"):
        parse(b"<a/>", **LIMITS, charset="iso-8859-1")


def test_charset_of_reads_the_content_type_parameter():
    assert charset_of('application/soap+xml; charset="UTF-8"; action="x"') == "UTF-8"
    assert charset_of("text/xml;charset=utf-16") == "utf-16"
    assert charset_of("text/xml") is None
    assert charset_of(None) is None


@pytest.mark.parametrize(
    ("doc", "offset"),
    [
        (b"<a>caf\xff</a>", 6),
        (b"<a\xc3\x28>x</a>", 2),
        (b"<a>caf\xc3", 6),
        (b"<a>\xc0\xbc</a>", 3),
        (b"<a>\xed\xa0\x80</a>", 3),
    ],
    ids=[
        "bad-start-byte-in-text",
        "bad-continuation-in-a-tag",
        "cut-inside-a-character",
        "overlong-encoding-of-a-less-than",
        "encoded-surrogate",
    ],
)
def test_invalid_utf_8_is_refused_with_its_offset(doc, offset):
    with pytest.raises(XMLRejected, match=rf"not valid UTF-8: .* at offset {offset}\)"):
        parse(doc, **LIMITS)


def test_invalid_utf_16_is_refused():
    doc = "\ufeff<a>".encode("utf-16-le") + b"\x00\xd8" + "</a>".encode("utf-16-le")
    with pytest.raises(XMLRejected, match="not valid UTF-16"):
        parse(doc, **LIMITS)


@pytest.mark.parametrize("doc", [b"<a>x\x00y</a>", b"<a\x00>x</a>"], ids=["text", "tag"])
def test_a_nul_character_is_refused(doc):
    with pytest.raises(XMLRejected, match="NUL character"):
        parse(doc, **LIMITS)


def test_a_document_that_is_not_xml_says_how_it_starts():
    with pytest.raises(XMLRejected, match=r"not XML: it starts with '\{\"topic\""):
        parse(b'{"topic": "ALL"}', **LIMITS)


# ----------------------------------------------------------------------------- structure


def test_nesting_deeper_than_libxml2_allows_is_reported_as_nesting():
    doc = b"<a>" * 10_000 + b"</a>" * 10_000
    with pytest.raises(XMLRejected, match=r"^document nesting exceeds the limit of 64 levels$"):
        parse(doc, **LIMITS)


@pytest.mark.parametrize("cut", [1, 10, 25, 40])
def test_a_truncated_document_is_called_truncated(cut):
    doc = b'<?xml version="1.0"?><a xmlns="urn:x"><b>text</b></a>'
    with pytest.raises(XMLRejected, match=rf"ends after {cut} bytes, before it is complete"):
        parse(doc[:cut], **LIMITS)


def test_a_mismatched_tag_is_not_called_truncated():
    with pytest.raises(XMLRejected, match="malformed XML") as exc:
        parse(b"<a><b></a></b>", **LIMITS)
    assert "truncated" not in str(exc.value)


def test_xinclude_is_never_processed():
    doc = (
        b'<a xmlns:xi="http://www.w3.org/2001/XInclude">'
        b'<xi:include href="file:///etc/passwd" parse="text"/></a>'
    )
    root = parse(doc, **LIMITS)
    assert "root:" not in "".join(root.itertext())


def test_it_refuses_more_distinct_namespace_declarations_than_allowed():
    decls = "".join(f' xmlns:p{i}="urn:p{i}"' for i in range(300))
    with pytest.raises(XMLRejected, match="more than 256 distinct namespaces"):
        parse(f"<a{decls}/>".encode(), max_bytes=10**6, max_depth=64)


def test_the_same_declaration_repeated_on_many_elements_counts_once():
    doc = "<a>" + "<m xmlns='urn:x'/>" * 1000 + "</a>"
    assert len(parse(doc.encode(), max_bytes=10**6, max_depth=64)) == 1000


def test_it_refuses_an_element_with_more_attributes_than_allowed():
    attrs = " ".join(f'a{i}="1"' for i in range(300))
    with pytest.raises(XMLRejected, match="at most 256"):
        parse(f"<a {attrs}/>".encode(), max_bytes=10**6, max_depth=64)


# Small documents skip the scans their counts of "<", "=" and "xmlns" prove unneeded: a document
# one over each bound, however small, is still refused.
SMALL = {"max_bytes": 10**6, "max_depth": 2, "max_attributes": 2, "max_namespaces": 2}


@pytest.mark.parametrize(
    ("doc", "refused"),
    [
        (b"<a><b/></a>", None),
        (b"<a><b><c/></b></a>", "nesting exceeds the limit of 2"),
        (b"<a><b><c></c></b></a>", "nesting exceeds the limit of 2"),
        (b'<a x="1" y="2"/>', None),
        (b'<a x="1" y="2" z="3"/>', "at most 2"),
        (b"<a xmlns:p='urn:p' xmlns:q='urn:q'/>", None),
        (b"<a xmlns:p='urn:p' xmlns:q='urn:q' xmlns:r='urn:r'/>", "more than 2 distinct"),
    ],
)
def test_small_documents_are_held_to_every_bound(doc, refused):
    if refused is None:
        assert parse(doc, **SMALL) is not None
    else:
        with pytest.raises(XMLRejected, match=refused):
            parse(doc, **SMALL)
