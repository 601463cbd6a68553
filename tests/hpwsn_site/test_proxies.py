"""Reverse proxies in front of the web server: what is read from their headers, and only with
HPWSN_API_PROXIES set (docs/deployment.md, "Web")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpwsn_site.clients import client_address
from hpwsn_site.fastpath import _scheme

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("proxies", "forwarded_for", "seen"),
    [
        (0, "198.51.100.7", "127.0.0.1"),  # no proxy: the header is the client's own word
        (1, None, "127.0.0.1"),
        (1, "198.51.100.7", "198.51.100.7"),
        (1, "203.0.113.9, 198.51.100.7", "198.51.100.7"),  # what the client wrote first is its own
        (2, "203.0.113.9, 198.51.100.7, 10.0.0.2", "198.51.100.7"),
        (3, "198.51.100.7", "198.51.100.7"),  # fewer hops than proxies: the first there is
    ],
)
def test_the_client_address_is_the_one_the_nearest_proxy_saw(
    settings, proxies, forwarded_for, seen
):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": proxies}
    assert client_address("127.0.0.1", forwarded_for) == seen


def test_the_scheme_comes_from_x_forwarded_proto_only_behind_a_proxy(settings):
    scope = {"scheme": "http"}
    tls = {b"x-forwarded-proto": b"https"}
    settings.HPWSN_API_PROXIES = 0
    assert _scheme(scope, tls) == "http"
    settings.HPWSN_API_PROXIES = 1
    assert _scheme(scope, tls) == "https"
    assert _scheme(scope, {b"x-forwarded-proto": b"HTTPS, http"}) == "https"
    assert _scheme(scope, {b"x-forwarded-proto": b"gopher"}) == "http"
    assert _scheme(scope, {}) == "http"


def _settings(**env: str) -> dict[str, object]:
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.CSRF_TRUSTED_ORIGINS, getattr(s, 'SECURE_PROXY_SSL_HEADER', None)]))"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HPWSN_")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "hpwsn_site.settings", **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    origins, header = json.loads(out.strip().splitlines()[-1])
    return {"origins": origins, "header": header}


def test_behind_a_tls_proxy_the_console_trusts_the_public_origin_and_the_proxys_scheme(tmp_path):
    plain = _settings(HPWSN_DATA_DIR=str(tmp_path))
    assert plain == {"origins": [], "header": None}
    behind = _settings(
        HPWSN_DATA_DIR=str(tmp_path),
        HPWSN_PUBLIC_URL="https://wsn.example.com/",
        HPWSN_API_PROXIES="1",
        HPWSN_CSRF_TRUSTED_ORIGINS="https://console.example.com",
    )
    assert behind == {
        "origins": ["https://console.example.com", "https://wsn.example.com"],
        "header": ["HTTP_X_FORWARDED_PROTO", "https"],
    }
