"""Password guessing at the console's and the admin's login forms (directory and local accounts).

Failed logins are counted per client address and user name in a fixed window kept in Redis,
shared by every web process; past HPWSN_LOGIN_THROTTLE the form refuses without asking for the
password to be checked, until the window ends. Per address and name, so that a stranger's
failures cannot lock a person out from everywhere.
"""

from __future__ import annotations

import contextlib
from typing import Any

import redis
from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm

from hpwsn_site import state
from hpwsn_site.clients import request_client


class _Guarded:
    request: Any
    cleaned_data: dict[str, Any]

    def clean(self) -> dict[str, Any]:
        if self.request is None:
            return super().clean()  # type: ignore[misc,no-any-return]
        window = state.login_window(
            request_client(self.request.META), str(self.cleaned_data.get("username") or "")
        )
        if window is None:
            return super().clean()  # type: ignore[misc,no-any-return]
        try:
            spent = window.spent()
        except redis.RedisError:  # the login stays open (an operator may be diagnosing that)
            spent = False
        if spent:
            raise forms.ValidationError(
                "Too many failed logins; try again later.", code="throttled"
            )
        try:
            return super().clean()  # type: ignore[misc,no-any-return]
        except forms.ValidationError as exc:
            if any(e.code == "invalid_login" for e in exc.error_list):
                with contextlib.suppress(redis.RedisError):
                    window.failed()
            raise


class LoginForm(_Guarded, AuthenticationForm):
    """The console's login form."""


class AdminLoginForm(_Guarded, AdminAuthenticationForm):
    """The admin's login form."""
