"""What the defaults give an installation: secrets of its own, files its owner's only, cookies
that stay on TLS, and no published demo password where other machines reach the platform."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ldap
import pytest

from directory.slapdctl import DEMO_PASSWORD, Instance, port_open
from tests.support import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
BASE = "dc=hpwsn,dc=local"


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without any HPwsn or directory setting, plus these."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HPWSN_", "LDAP_")) and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env.update(extra)
    return env


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ----------------------------------------------------------------------------- settings


def _settings(env: dict[str, str], script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()\n" + script],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "hpwsn_site.settings"},
        capture_output=True,
        text=True,
        timeout=120,
        umask=0o022,
        check=False,
    )


def test_a_new_data_dir_and_its_secret_key_are_the_owners_only(tmp_path):
    data = tmp_path / "fresh" / "data"
    proc = _settings(
        _clean_env(HPWSN_DATA_DIR=str(data)),
        "from django.conf import settings; print(len(settings.SECRET_KEY))",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) >= 50
    assert _mode(data) == 0o700
    assert _mode(data / "secret_key") == 0o600
    # Kept: the next process of the installation signs with the same key.
    again = _settings(
        _clean_env(HPWSN_DATA_DIR=str(data)),
        "from django.conf import settings; print(settings.SECRET_KEY)",
    )
    assert again.stdout.split()[-1] == (data / "secret_key").read_text().strip()


COOKIES = """
import json
from django.test import Client
from django.conf import settings
settings.ALLOWED_HOSTS = ["testserver"]
r = Client().get("/console/login/")
c = r.cookies["csrftoken"]
print(json.dumps({"status": r.status_code, "secure": bool(c["secure"]),
                  "session_secure": settings.SESSION_COOKIE_SECURE}))
"""


@pytest.mark.parametrize(("public_url", "secure"), [("https://wsn.example", True), ("", False)])
def test_login_cookies_are_secure_when_the_public_url_is_https(tmp_path, public_url, secure):
    proc = _settings(_clean_env(HPWSN_DATA_DIR=str(tmp_path), HPWSN_PUBLIC_URL=public_url), COOKIES)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"status": 200, "secure": secure, "session_secure": secure}


# ----------------------------------------------------------------------------- local slapd


def _prepare(data_dir: Path, port: int, **extra: str) -> subprocess.CompletedProcess[str]:
    """`python -m directory.slapdctl prepare` as `make run` calls it."""
    argv = ["prepare", "--data-dir", str(data_dir), "--port", str(port)]
    return subprocess.run(
        [sys.executable, "-m", "directory.slapdctl", *argv],
        cwd=ROOT,
        env=_clean_env(**extra),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@contextmanager
def _slapd(command: list[str], port: int) -> Iterator[str]:
    proc = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        assert wait_until(lambda: port_open(port) or proc.poll() is not None, timeout=20)
        assert proc.poll() is None, "slapd exited"
        yield f"ldap://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        proc.wait(10)


def _binds(url: str, dn: str, password: str) -> bool:
    conn = ldap.initialize(url)
    conn.set_option(ldap.OPT_NETWORK_TIMEOUT, 5)
    try:
        conn.simple_bind_s(dn, password)
    except ldap.INVALID_CREDENTIALS:
        return False
    finally:
        conn.unbind_s()
    return True


def test_the_local_directory_has_no_constant_manager_or_broker_password(tmp_path):
    data, port = tmp_path / "slapd", free_port()
    proc = _prepare(data, port)
    assert proc.returncode == 0, proc.stderr
    with _slapd(proc.stdout.splitlines(), port) as url:
        assert not _binds(url, f"cn=admin,{BASE}", "admin")
        assert not _binds(url, f"cn=broker,{BASE}", "broker")
        assert _binds(url, f"cn=admin,{BASE}", (data / "admin.password").read_text())
        assert _binds(url, f"cn=broker,{BASE}", (data / "broker.password").read_text())
    for name in ("admin.password", "broker.password", "slapd.conf"):
        assert _mode(data / name) == 0o600
    # Another installation makes its own.
    other = tmp_path / "other"
    assert _prepare(other, free_port()).returncode == 0
    assert (other / "broker.password").read_text() != (data / "broker.password").read_text()


def test_a_directory_seeded_with_the_old_broker_password_takes_the_kept_one(tmp_path):
    data, port = tmp_path / "slapd", free_port()
    assert Instance(data_dir=data, port=port, broker_password="broker").prepare()

    proc = _prepare(data, port)

    assert proc.returncode == 0, proc.stderr
    with _slapd(proc.stdout.splitlines(), port) as url:
        assert not _binds(url, f"cn=broker,{BASE}", "broker")
        assert _binds(url, f"cn=broker,{BASE}", (data / "broker.password").read_text())
        # The people keep theirs.
        assert _binds(url, f"uid=operator1,ou=people,{BASE}", DEMO_PASSWORD)


@pytest.mark.parametrize(
    "listen",
    [
        {"HPWSN_HTTP_HOST": "0.0.0.0"},
        {"HPWSN_DIRECTORY_LISTEN": "0.0.0.0"},
        # The web server on loopback behind a reverse proxy (docs/deployment.md), or a site of a
        # federation: reached from elsewhere all the same.
        {"HPWSN_PUBLIC_URL": "https://wsn.example.org"},
        {"HPWSN_API_PROXIES": "1"},
        {"HPWSN_FEDERATION_PEERS": "b=http://198.51.100.2:8000"},
    ],
)
def test_a_platform_reached_from_elsewhere_gets_no_published_demo_password(tmp_path, listen):
    data = tmp_path / "slapd"

    refused = _prepare(data, free_port(), **listen)

    assert refused.returncode != 0
    assert "HPWSN_LDAP_DEMO_PASSWORD" in refused.stderr
    assert not (data / "db" / "data.mdb").exists()

    chosen = _prepare(
        data, free_port(), HPWSN_LDAP_DEMO_PASSWORD="a-password-of-this-site", **listen
    )
    assert chosen.returncode == 0, chosen.stderr


def test_a_directory_still_holding_the_demo_password_is_not_served_beyond_loopback(tmp_path):
    data = tmp_path / "slapd"
    assert _prepare(data, free_port()).returncode == 0  # a local demo, seeded as documented

    refused = _prepare(data, free_port(), HPWSN_DIRECTORY_LISTEN="0.0.0.0")

    assert refused.returncode != 0
    assert "admin1" in refused.stderr
    assert "HPWSN_LDAP_DEMO_PASSWORD" in refused.stderr
    # On loopback it is still the documented demo.
    assert _prepare(data, free_port()).returncode == 0


# ----------------------------------------------------------------------------- login forms


@pytest.mark.django_db
@pytest.mark.parametrize("login", ["/console/login/", "/admin/login/"])
def test_password_guessing_at_a_login_form_is_cut_short(settings, login):
    from django.contrib.auth import get_user_model
    from django.test import Client

    settings.HPWSN_LOGIN_THROTTLE = "3/hour"
    name = f"guess-{uuid.uuid4().hex[:8]}"
    get_user_model().objects.create_user(name, password="right-password-9", is_staff=True)

    def log_in(password: str, address: str = "192.0.2.7") -> bool:
        client = Client(REMOTE_ADDR=address)
        response = client.post(login, {"username": name, "password": password})
        return response.status_code == 302 and "sessionid" in response.cookies

    assert not any(log_in(f"guess-{i}") for i in range(3))

    assert not log_in("right-password-9")  # the right one, once guessing has gone on too long
    assert log_in("right-password-9", address="192.0.2.8")  # the person, from elsewhere
