"""Errors of /api/v1/ as RFC 9457 `application/problem+json`, each with a stable `type`.

A broker error (hpwsn.errors) keeps its SOAP fault's name and wording: `type` is
`urn:hpwsn:problem:<FaultName>` and `detail` is the very text the SOAP fault carries. The API's
own errors (validation, authentication, throttling, ...) get a `type` of their own.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from hpwsn import errors
from hpwsn_site.api.exceptions import Conflict, RequestTooLarge, ServiceUnavailable

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/problem+json"
PREFIX = "urn:hpwsn:problem:"


# DRF's exception classes -> (stable type suffix, title)
_DRF_TYPES: dict[type[exceptions.APIException], tuple[str, str]] = {
    exceptions.ValidationError: ("validation", "The request is not valid"),
    exceptions.ParseError: ("malformed-request", "The request body cannot be parsed"),
    exceptions.AuthenticationFailed: ("authentication-failed", "Authentication failed"),
    exceptions.NotAuthenticated: ("not-authenticated", "Authentication is required"),
    exceptions.PermissionDenied: ("forbidden", "Not allowed"),
    exceptions.NotFound: ("not-found", "Not found"),
    exceptions.MethodNotAllowed: ("method-not-allowed", "Method not allowed"),
    exceptions.NotAcceptable: ("not-acceptable", "No acceptable representation"),
    exceptions.UnsupportedMediaType: ("unsupported-media-type", "Unsupported media type"),
    exceptions.Throttled: ("throttled", "Too many requests"),
    ServiceUnavailable: ("unavailable", "Service unavailable"),
    Conflict: ("conflict", "Conflict"),
    RequestTooLarge: ("too-large", "Request too large"),
}


def problem(
    *, type_: str, title: str, status_code: int, detail: str, **extra: Any
) -> dict[str, Any]:
    return {
        "type": PREFIX + type_,
        "title": title,
        "status": status_code,
        "detail": detail,
        **extra,
    }


def wsn_problem(exc: errors.WsnError) -> tuple[int, dict[str, Any]]:
    """The problem of a broker error: the SOAP fault's name as the type, its text as detail."""
    name = exc.fault or "SoapClientFault"
    return exc.http_status, problem(
        type_=name, title=name, status_code=exc.http_status, detail=exc.message
    )


def _flat(detail: Any) -> str:
    if isinstance(detail, dict):
        return "; ".join(f"{k}: {_flat(v)}" for k, v in detail.items())
    if isinstance(detail, list):
        return "; ".join(_flat(v) for v in detail)
    return str(detail)


def api_problem(exc: exceptions.APIException) -> tuple[int, dict[str, Any]]:
    """The problem of one of the API's own errors (validation, auth, throttling, ...)."""
    type_, title = next(
        (v for k, v in _DRF_TYPES.items() if isinstance(exc, k)), ("error", "Error")
    )
    extra: dict[str, Any] = {}
    if isinstance(exc, exceptions.ValidationError):
        extra["errors"] = exc.detail
    if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
        extra["retry_after"] = int(exc.wait)
    body = problem(
        type_=type_, title=title, status_code=exc.status_code, detail=_flat(exc.detail), **extra
    )
    return exc.status_code, body


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's EXCEPTION_HANDLER: every error answered as problem+json."""
    if isinstance(exc, errors.WsnError):
        code, body = wsn_problem(exc)
        return Response(body, status=code, content_type=CONTENT_TYPE)
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(
            exc.message_dict if hasattr(exc, "error_dict") else exc.messages
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "not found")
    if isinstance(exc, RequestDataTooBig):  # Django's own check of the body's size
        limit = settings.HPWSN_MAX_REQUEST_BYTES
        exc = RequestTooLarge(f"request exceeds the limit of {limit} bytes")
    response = drf_handler(exc, context)  # its headers: WWW-Authenticate, Retry-After
    if response is None or not isinstance(exc, exceptions.APIException):
        return response
    response.status_code, response.data = api_problem(exc)
    response.content_type = CONTENT_TYPE
    return response
