"""Shared pieces of the OpenAPI description: the problem+json response."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import serializers

PROBLEM = inline_serializer(
    name="Problem",
    fields={
        "type": serializers.CharField(help_text="stable: urn:hpwsn:problem:<name>"),
        "title": serializers.CharField(),
        "status": serializers.IntegerField(),
        "detail": serializers.CharField(help_text="the same words as the SOAP fault"),
        "errors": serializers.JSONField(required=False, help_text="per field (validation)"),
        "retry_after": serializers.IntegerField(required=False, help_text="seconds (429)"),
    },
)
_WHAT = {
    400: "bad input (a WSN fault name or `validation`)",
    401: "no or bad credentials",
    403: "not allowed (NotAuthorized, forbidden)",
    404: "no such resource (ResourceUnknownFault, TopicNotSupportedFault, not-found)",
    409: "conflict (e.g. UnableToDestroyPullPointFault)",
    415: "unsupported media type",
    429: "too many requests (Retry-After)",
    503: "the broker cannot serve this now",
}
PROBLEMS = _WHAT


def problem_responses(*codes: int) -> dict[Any, OpenApiResponse]:
    """The problem+json responses of an operation."""
    return {
        (c, "application/problem+json"): OpenApiResponse(PROBLEM, description=_WHAT[c])
        for c in codes
    }


class TokenScheme(OpenApiAuthenticationExtension):
    target_class = "hpwsn_site.api.auth.TokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "an API token (hpwsn_…)"}


class BasicScheme(OpenApiAuthenticationExtension):
    target_class = "hpwsn_site.api.auth.DirectoryBasicAuthentication"
    name = "basicAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "basic", "description": "a directory (LDAP) account"}


class SessionScheme(OpenApiAuthenticationExtension):
    target_class = "hpwsn_site.api.auth.ConsoleSessionAuthentication"
    name = "cookieAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "apiKey", "in": "cookie", "name": "sessionid"}
