"""Request bodies of /api/v1/: JSON, or a bare XML document (a publish), read up to the limit.

DRF's own JSONParser reads the whole body, however large: these read at most
HPWSN_MAX_REQUEST_BYTES and answer 413 beyond it, like the SOAP endpoint.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from rest_framework import exceptions, parsers

from hpwsn_site.api.exceptions import RequestTooLarge


def _read(stream: Any) -> bytes:
    limit: int = settings.HPWSN_MAX_REQUEST_BYTES
    data: bytes = stream.read(limit + 1) if stream is not None else b""
    if len(data) > limit:
        raise RequestTooLarge(f"request exceeds the limit of {limit} bytes")
    return data


class JsonParser(parsers.JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return json.loads(_read(stream))
        except ValueError as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None


class XmlParser(parsers.BaseParser):
    """A bare XML document as the body: one message whose payload it is."""

    media_type = "application/xml"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        return {"xml": _read(stream).decode("utf-8", errors="replace")}


class TextXmlParser(XmlParser):
    media_type = "text/xml"
