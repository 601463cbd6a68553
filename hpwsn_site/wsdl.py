"""The WSDL at ?wsdl: the OASIS WSN 1.3 WSDLs and schemas with every location pointing back here."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

WSDL_DIR = Path(__file__).resolve().parent / "wsdl"
_LOCATION = re.compile(rb'(schemaLocation|location)="(?!http)(?:\./)?([\w.\-]+\.(?:xsd|wsdl))"')
_CXF_ADDRESS = b"http://cxf.apache.org/wsnotification"


def document_names() -> list[str]:
    return sorted(p.name for p in WSDL_DIR.iterdir() if p.suffix in (".xsd", ".wsdl"))


@lru_cache(maxsize=64)
def document(name: str, endpoint: str) -> bytes | None:
    """A WSDL or schema with relative locations rewritten to `endpoint?wsdl=` / `?xsd=` URLs."""
    if name not in document_names():
        return None
    data = (WSDL_DIR / name).read_bytes()

    def _rewrite(m: re.Match[bytes]) -> bytes:
        target = m.group(2).decode()
        kind = "xsd" if target.endswith(".xsd") else "wsdl"
        return f'{m.group(1).decode()}="{endpoint}?{kind}={target}"'.encode()

    data = _LOCATION.sub(_rewrite, data)
    return data.replace(_CXF_ADDRESS, endpoint.encode())
