"""The console's page of the signed-in user's REST API tokens: create (shown once), revoke.

The same services as POST/DELETE /api/v1/tokens (hpwsn_site/api/services.py).
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from console.views import _ctx, console_view
from hpwsn_site.api.selectors import api_tokens_of
from hpwsn_site.api.services import TooManyTokens, api_token_create, api_token_revoke
from hpwsn_site.api.throttling import throttle_hit


@console_view()
@require_http_methods(["GET", "POST"])
def token_list(request: HttpRequest) -> HttpResponse:
    name = request.user.get_username()
    new = None
    status = 200
    if request.method == "POST":
        # The rate and bound of POST /api/v1/tokens: each token is a row every web process
        # reloads when one is made.
        wait = throttle_hit(scope="tokens", ident=name)
        try:
            if wait is not None:
                status = 429
                messages.error(request, f"Too many new tokens; try again in {wait:.0f} s.")
            else:
                new = api_token_create(principal=name, name=request.POST.get("name", "").strip())
        except TooManyTokens as exc:
            status = 409
            messages.error(request, str(exc))
    ctx = _ctx(request, section="tokens", tokens=api_tokens_of(principal=name)[:200], new=new)
    response = render(request, "console/tokens.html", ctx, status=status)
    response["Cache-Control"] = "no-store"  # the page may show a token's secret, once
    return response


@console_view()
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    if api_tokens_of(principal=request.user.get_username()).filter(pk=pk).exists():
        row = api_token_revoke(token_id=pk, actor=request.user.get_username())
        messages.success(request, f"Token {row.prefix}… revoked.")
    else:
        messages.error(request, f"token {pk} is not one of yours")
    return redirect("console:tokens")
