"""Hardened XML parsing: no DTDs, no entities, no network, bounded size and depth.

Only UTF-8 and UTF-16 documents are read (WS-I Basic Profile R1012 for SOAP messages). Every other
encoding is refused before libxml2 sees the bytes: an encoding the byte-level checks below cannot
read (UTF-7, EBCDIC, UCS-4) would otherwise carry a DOCTYPE past them.
"""

from __future__ import annotations

import re

from lxml import etree

# libxml2 refuses documents nested deeper than this unless XML_PARSE_HUGE is set (never here).
LIBXML2_MAX_DEPTH = 256
MAX_NAMESPACES = 256  # distinct namespace declarations (prefix, URI) per document
MAX_ATTRIBUTES = 256  # attributes per element
# A namespace declaration, read on the text before parsing so that a refusal costs one scan. The
# same declaration repeated (each of 1,000 messages declaring its payload's namespace) counts
# once: the cost to bound is many declarations in scope of many elements. An attribute value
# that happens to contain ` xmlns="..."` may count too: the bound is an upper one.
_XMLNS = re.compile(r"""\sxmlns(?::([^\s=/>]+))?\s*=\s*(?:"([^"]*)"|'([^']*)')""")


class XMLRejected(ValueError):
    """The document was refused before or while parsing; the message says why."""


_PARSER = etree.XMLParser(
    resolve_entities=False,
    no_network=True,
    load_dtd=False,
    dtd_validation=False,
    huge_tree=False,
    remove_comments=True,
    remove_pis=True,
    collect_ids=False,
)

# UCS-4 signatures come first: FF FE 00 00 would otherwise read as a UTF-16 byte order mark.
_UNSUPPORTED_SIGNATURES = (
    (b"\x00\x00\xfe\xff", "UCS-4"),
    (b"\xff\xfe\x00\x00", "UCS-4"),
    (b"\x00\x00\x00<", "UCS-4"),
    (b"<\x00\x00\x00", "UCS-4"),
    (b"\x4c\x6f\xa7\x94", "EBCDIC"),
    (b"+/v", "UTF-7"),
)
_SIGNATURES = (  # (prefix, codec, bytes of byte order mark to skip)
    (b"\xef\xbb\xbf", "utf-8", 3),
    (b"\xff\xfe", "utf-16-le", 2),
    (b"\xfe\xff", "utf-16-be", 2),
    (b"<\x00", "utf-16-le", 0),
    (b"\x00<", "utf-16-be", 0),
)
_DECLARATION = re.compile(r"<\?xml\s[^>]*?\bencoding\s*=\s*([\"'])([A-Za-z][\w.-]*)\1")
_CHARSET = re.compile(r";\s*charset\s*=\s*\"?([^\s;\"]+)", re.IGNORECASE)


def _family(name: str) -> str | None:
    """'utf-8' or 'utf-16' for names of those encodings (and ASCII, a subset of UTF-8)."""
    key = name.lower().replace("-", "").replace("_", "")
    if key in ("utf8", "usascii", "ascii"):
        return "utf-8"
    if key in ("utf16", "utf16le", "utf16be", "ucs2"):
        return "utf-16"
    return None


def charset_of(content_type: str | None) -> str | None:
    """The charset parameter of a Content-Type header, if any."""
    m = _CHARSET.search(content_type or "")
    return m.group(1) if m else None


def decode(data: bytes, *, charset: str | None = None) -> str:
    """The document's text, refusing encodings other than UTF-8/UTF-16 and any mislabelling.

    `charset` is what the transport said (the Content-Type parameter); when given, it must name
    the encoding the document really has.
    """
    if data[:1] == b"<" and data[1:2] != b"\x00":  # the common case: UTF-8 without a BOM
        codec, skip = "utf-8", 0
    else:
        for prefix, name in _UNSUPPORTED_SIGNATURES:
            if data.startswith(prefix):
                raise XMLRejected(
                    f"the document is encoded in {name}; only UTF-8 and UTF-16 are read"
                )
        codec, skip = "utf-8", 0
        for prefix, name, bom in _SIGNATURES:
            if data.startswith(prefix):
                codec, skip = name, bom
                break
    family = codec[:6] if codec.startswith("utf-16") else "utf-8"
    label = family.upper()
    # The declaration is read from the head first, so that a refusal names what the document
    # claims to be rather than the first byte that does not fit.
    if family == "utf-8":
        head = data[skip : skip + 512].decode("latin-1") if data.startswith(b"<?xml", skip) else ""
    else:
        head = data[skip : skip + 1024].decode(codec, errors="replace")
    m = _DECLARATION.match(head) if head else None
    if m is not None:
        declared = m.group(2)
        said = _family(declared)
        if said is None:
            raise XMLRejected(
                f"the XML declaration names the encoding '{declared}'; only UTF-8 and UTF-16 "
                "are read"
            )
        if said != family:
            raise XMLRejected(
                f"the XML declaration says encoding '{declared}' but the document is {label}"
            )
    if charset is not None:
        said = _family(charset)
        if said is None:
            raise XMLRejected(
                f"the Content-Type charset '{charset}' is not UTF-8 or UTF-16, the encodings read"
            )
        if said != family:
            raise XMLRejected(
                f"the Content-Type says charset '{charset}' but the document is {label}"
            )
    try:
        text = data[skip:].decode(codec)
    except UnicodeDecodeError as exc:
        bad = data[skip + exc.start : skip + exc.end][:4]
        raise XMLRejected(
            f"the document is not valid {label}: {exc.reason} (bytes {bad.hex(' ')} at offset "
            f"{skip + exc.start})"
        ) from None
    return text


def parse(
    data: bytes,
    *,
    max_bytes: int,
    max_depth: int,
    charset: str | None = None,
    max_namespaces: int = MAX_NAMESPACES,
    max_attributes: int = MAX_ATTRIBUTES,
) -> etree._Element:
    """Parse untrusted bytes into an element, refusing DTDs, entities, oversize and deep nesting.

    `charset` is the transport's label for the bytes (a Content-Type charset), checked if given.
    The cost of what follows a parse grows with the namespace declarations in scope and the
    attributes of an element, not only with the size: both are bounded.
    """
    if len(data) > max_bytes:
        raise XMLRejected(f"document of {len(data)} bytes exceeds the limit of {max_bytes} bytes")
    text = decode(data, charset=charset)
    body = text.lstrip("\ufeff \t\r\n")
    if not body:
        raise XMLRejected("empty document")
    if not body.startswith("<"):
        raise XMLRejected(f"the document is not XML: it starts with {body[:16]!r}")
    nul = text.find("\x00")
    if nul >= 0:
        raise XMLRejected(f"the document contains a NUL character (at character {nul})")
    # A DOCTYPE is refused outright: it is the carrier of every entity attack (billion laughs, XXE).
    # The check runs on the decoded text so that it holds in UTF-16 as well.
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise XMLRejected("DTDs and entity declarations are not allowed")
    # Each declaration holds "xmlns", each start tag a "<" and each attribute a "=": a document
    # with no more of them than a bound allows cannot break it, and is spared the scan (most
    # payloads are small, and the scans cost more than their parse).
    declared: set[tuple[str, str]] = set()
    for m in _XMLNS.finditer(text) if text.count("xmlns") > max_namespaces else ():
        declared.add((m.group(1) or "", m.group(2) or m.group(3) or ""))
        if len(declared) > max_namespaces:
            raise XMLRejected(
                f"the document declares more than {max_namespaces} distinct namespaces "
                "(HPWSN_MAX_XML_NAMESPACES)"
            )
    try:
        root = etree.fromstring(data, _PARSER)
    except etree.XMLSyntaxError as exc:
        raise XMLRejected(_syntax_message(exc, data, max_depth)) from None
    except ValueError as exc:  # e.g. unicode strings with an encoding declaration
        raise XMLRejected(f"malformed XML: {exc}") from None
    if root is None:
        raise XMLRejected("empty document")
    if root.getroottree().docinfo.doctype:  # defence in depth: the text check refuses these
        raise XMLRejected("DTDs and entity declarations are not allowed")
    if text.count("<") > max_depth or text.count("=") > max_attributes:
        _check_depth(root, max_depth, max_attributes)
    return root


def _syntax_message(exc: etree.XMLSyntaxError, data: bytes, max_depth: int) -> str:
    msg = " ".join(str(exc.msg or exc).split())
    if msg.startswith("Excessive depth in document"):
        return f"document nesting exceeds the limit of {min(max_depth, LIBXML2_MAX_DEPTH)} levels"
    if _is_truncated(data):
        return (
            f"malformed XML: the document ends after {len(data)} bytes, before it is complete "
            f"(truncated?); the parser said: {msg}"
        )
    return f"malformed XML: {msg}"


def _is_truncated(data: bytes) -> bool:
    """True if the bytes are a well-formed beginning of a document that stops too early.

    Only on the error path: a push parser fed the whole document raises only at close() when
    nothing but the end was missing, whereas libxml2's one-shot parser reports a truncation as
    whatever token it was reading ("AttValue: ' expected").
    """
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
    try:
        parser.feed(data)
    except etree.XMLSyntaxError:
        return False
    try:
        parser.close()
    except etree.XMLSyntaxError:
        return True
    return False


def _check_depth(root: etree._Element, max_depth: int, max_attributes: int) -> None:
    depth = 0
    for event, el in etree.iterwalk(root, events=("start", "end")):
        if event == "start":
            depth += 1
            if depth > max_depth:
                raise XMLRejected(f"document nesting exceeds the limit of {max_depth} levels")
            if len(el.attrib) > max_attributes:
                raise XMLRejected(
                    f"an element has {len(el.attrib)} attributes; at most {max_attributes} "
                    "(HPWSN_MAX_XML_ATTRIBUTES)"
                )
        else:
            depth -= 1
