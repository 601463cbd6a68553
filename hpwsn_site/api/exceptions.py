"""Errors of the API that DRF does not define (kept apart: the auth classes need them early)."""

from __future__ import annotations

from rest_framework import exceptions, status


class ServiceUnavailable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "the service is unavailable; try again later"
    default_code = "unavailable"


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "the resource is not in a state that allows this"
    default_code = "conflict"


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "the request is too large"
    default_code = "too-large"
