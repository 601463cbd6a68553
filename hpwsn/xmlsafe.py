"""Hardened XML parsing: no DTDs, no entities, no network, bounded size and depth."""

from __future__ import annotations

from lxml import etree


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


def parse(data: bytes, *, max_bytes: int, max_depth: int) -> etree._Element:
    """Parse untrusted bytes into an element, refusing DTDs, entities, oversize and deep nesting."""
    if len(data) > max_bytes:
        raise XMLRejected(f"document of {len(data)} bytes exceeds the limit of {max_bytes} bytes")
    if not data.strip():
        raise XMLRejected("empty document")
    # A DOCTYPE is refused outright: it is the carrier of every entity attack (billion laughs, XXE).
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        raise XMLRejected("DTDs and entity declarations are not allowed")
    try:
        root = etree.fromstring(data, _PARSER)
    except etree.XMLSyntaxError as exc:
        raise XMLRejected(f"malformed XML: {exc.msg or exc}") from None
    except ValueError as exc:  # e.g. unicode strings with an encoding declaration
        raise XMLRejected(f"malformed XML: {exc}") from None
    if root is None:
        raise XMLRejected("empty document")
    _check_depth(root, max_depth)
    return root


def _check_depth(root: etree._Element, max_depth: int) -> None:
    depth = 0
    for event, _el in etree.iterwalk(root, events=("start", "end")):
        if event == "start":
            depth += 1
            if depth > max_depth:
                raise XMLRejected(f"document nesting exceeds the limit of {max_depth} levels")
        else:
            depth -= 1
