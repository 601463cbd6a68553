from __future__ import annotations

from django.db import models


class ApiToken(models.Model):
    """A bearer token of one principal for /api/v1/. Only its SHA-256 is kept: it is shown once.

    The token names the principal (an LDAP uid, or a local user without a directory), not a
    group list: the principal's groups are looked up when the token is used, so a group change
    in the directory applies to its tokens as to its logins.
    """

    principal = models.CharField(max_length=150, db_index=True)
    name = models.CharField(max_length=100, blank=True, default="")  # what it is for
    prefix = models.CharField(max_length=16, unique=True)  # shown in lists, to tell tokens apart
    digest = models.CharField(max_length=64, unique=True)  # sha256 hex of the whole token
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)  # at most a minute stale
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.principal})"
