"""/api/v1/tokens: a principal creates, lists and revokes its own API tokens (admins: anyone's)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from hpwsn import errors
from hpwsn_site.api.auth import ApiUser, principal_of
from hpwsn_site.api.exceptions import Conflict
from hpwsn_site.api.models import ApiToken
from hpwsn_site.api.permissions import Authenticated
from hpwsn_site.api.schema import problem_responses
from hpwsn_site.api.selectors import api_tokens_of
from hpwsn_site.api.services import TooManyTokens, api_token_create, api_token_revoke


class TokenIn(serializers.Serializer):
    name = serializers.CharField(required=False, default="", allow_blank=True, max_length=100)


class TokenOut(serializers.Serializer):
    id = serializers.IntegerField()
    principal = serializers.CharField()
    name = serializers.CharField()
    prefix = serializers.CharField(help_text="the token starts hpwsn_<prefix>_")
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)


class NewTokenOut(TokenOut):
    token = serializers.CharField(help_text="the secret: shown this once, never again")


def token_out(row: ApiToken) -> dict[str, object]:
    return {
        "id": row.pk,
        "principal": row.principal,
        "name": row.name,
        "prefix": row.prefix,
        "created_at": row.created_at,
        "last_used_at": row.last_used_at,
        "revoked_at": row.revoked_at,
    }


class TokenListView(APIView):
    permission_classes = [Authenticated]

    def get_throttles(self):  # type: ignore[no-untyped-def]
        self.throttle_scope = "tokens" if self.request.method == "POST" else "api"
        return super().get_throttles()

    @extend_schema(
        operation_id="tokens_list",
        summary="Your API tokens (admins: everyone's)",
        responses={200: TokenOut(many=True), **problem_responses(401, 403, 429)},
    )
    def get(self, request: Request) -> Response:
        principal = principal_of(request)
        rows = api_tokens_of(principal=None if principal.is_admin else principal.name)
        return Response([token_out(r) for r in rows[:1000]])

    @extend_schema(
        operation_id="tokens_create",
        summary="Create an API token for yourself; the answer shows it once",
        request=TokenIn,
        responses={201: NewTokenOut, **problem_responses(400, 401, 403, 409, 429)},
        examples=[OpenApiExample("a token for a CI job", {"name": "ci-publisher"})],
    )
    def post(self, request: Request) -> Response:
        if isinstance(request.user, ApiUser) and request.user.via == "token":
            # A token that could make tokens would outlive its own revocation: whoever stole it
            # keeps a spare. New tokens need the principal's password (or its console session).
            raise exceptions.PermissionDenied(
                "a token cannot create tokens: authenticate with HTTP Basic or a console session"
            )
        data = TokenIn(data=request.data)
        data.is_valid(raise_exception=True)
        principal = principal_of(request)
        assert principal.name is not None  # Authenticated
        try:
            new = api_token_create(principal=principal.name, name=data.validated_data["name"])
        except TooManyTokens as exc:
            raise Conflict(str(exc)) from None
        return Response({**token_out(new.row), "token": new.token}, status=201)


class TokenView(APIView):
    permission_classes = [Authenticated]

    @extend_schema(
        operation_id="token_revoke",
        summary="Revoke a token (yours; admins: anyone's) at once",
        responses={204: None, **problem_responses(401, 403, 404, 429)},
    )
    def delete(self, request: Request, pk: int) -> Response:
        principal = principal_of(request)
        row = api_tokens_of(principal=None if principal.is_admin else principal.name)
        if not row.filter(pk=pk).exists():
            raise errors.ResourceUnknown(f"API token {pk} does not exist")
        api_token_revoke(token_id=pk, actor=principal.name or "")
        return Response(status=204)
