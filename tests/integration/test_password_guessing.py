"""Password guessing over SOAP and REST Basic and WS-Security tokens: bounded per client address
and user name, as at the console's login form, and without locking the person out elsewhere."""

from __future__ import annotations

from xml.sax.saxutils import escape

import httpx
import pytest

from hpwsn import ns
from tests.directory.helpers import directory_person
from tests.integration.test_legacy import notification_message_xml, spyne_envelope
from tests.support import notify_xml

pytestmark = pytest.mark.integration

PASSWORD = "guessing-pass-4d1f"
LIMIT = 20  # HPWSN_LOGIN_THROTTLE's default, 20 an hour


def _soap_basic(platform, user: str, password: str, *, source: str = "127.0.0.1") -> int:  # type: ignore[no-untyped-def]
    """The status of a Notify sent with HTTP Basic from this loopback address."""
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=30) as client:
        resp = client.post(
            platform.endpoint,
            content=(
                f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}"><s:Body>'
                + notify_xml(("ALL:NOTHING", "<m/>"))
                + "</s:Body></s:Envelope>"
            ).encode(),
            headers={"Content-Type": "text/xml; charset=utf-8"},
            auth=(user, password),
        )
    return resp.status_code


def test_guessing_a_password_is_cut_short_for_that_address_only(platform, ldap_directory):  # type: ignore[no-untyped-def]
    with directory_person(ldap_directory, PASSWORD) as uid:
        assert _soap_basic(platform, uid, PASSWORD) != 401  # the right password is taken
        for n in range(LIMIT):
            assert _soap_basic(platform, uid, f"guess-{n}") == 401
        # Past the limit, even the right password is refused from this address, over SOAP and
        # over the REST API's Basic...
        assert _soap_basic(platform, uid, PASSWORD) == 401
        rest = httpx.get(platform.base_url + "/api/v1/tokens", auth=(uid, PASSWORD), timeout=30)
        assert rest.status_code == 401
        # ... but the person is not locked out from another address.
        assert _soap_basic(platform, uid, PASSWORD, source="127.0.0.2") != 401


def _form_login(platform, user: str, password: str, *, source: str) -> bool:  # type: ignore[no-untyped-def]
    """Whether the console's login form let this user in from this loopback address."""
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, base_url=platform.base_url, timeout=30) as client:
        client.get("/console/login/")
        resp = client.post(
            "/console/login/",
            data={
                "username": user,
                "password": password,
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
            },
        )
        return resp.status_code == 302 and "sessionid" in client.cookies


def test_guessing_at_the_login_form_closes_soap_and_rest_basic_too(platform, ldap_directory):  # type: ignore[no-untyped-def]
    # The failures are counted in one window that every edge and every process share. Before,
    # SOAP and REST checked only what their own process had counted, so guesses at the form (or
    # at another web process) left the right password accepted there.
    source = "127.0.0.4"
    with directory_person(ldap_directory, PASSWORD) as uid:
        for n in range(LIMIT):
            assert not _form_login(platform, uid, f"guess-{n}", source=source)
        assert not _form_login(platform, uid, PASSWORD, source=source)
        assert _soap_basic(platform, uid, PASSWORD, source=source) == 401
        transport = httpx.HTTPTransport(local_address=source)
        with httpx.Client(transport=transport, timeout=30) as client:
            rest = client.get(platform.base_url + "/api/v1/tokens", auth=(uid, PASSWORD))
        assert rest.status_code == 401
        # The person, from elsewhere.
        assert _form_login(platform, uid, PASSWORD, source="127.0.0.5")
        assert _soap_basic(platform, uid, PASSWORD, source="127.0.0.5") != 401


def _legacy_basic(platform, user: str, password: str, *, source: str) -> httpx.Response:  # type: ignore[no-untyped-def]
    """A thesis WsnProcess publish on the Spyne endpoint, with HTTP Basic, from this address."""
    data = spyne_envelope(escape(notification_message_xml("ALL", "<m/>")))
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=60) as client:
        return client.post(
            platform.base_url + "/wsn/legacy/",
            content=data,
            headers={"Content-Type": "text/xml; charset=utf-8"},
            auth=(user, password),
        )


def test_guessing_at_the_legacy_endpoint_is_counted_by_the_guessers_address(
    platform, ldap_directory
):  # type: ignore[no-untyped-def]
    # The Spyne endpoint counted every caller's failures under one empty address: anyone could
    # lock a person out of it, from everywhere, with 20 wrong passwords an hour.
    with directory_person(ldap_directory, PASSWORD) as uid:
        for n in range(LIMIT):
            assert _legacy_basic(platform, uid, f"guess-{n}", source="127.0.0.6").status_code == 500
        assert ">accepted<" not in _legacy_basic(platform, uid, PASSWORD, source="127.0.0.6").text
        assert ">accepted<" in _legacy_basic(platform, uid, PASSWORD, source="127.0.0.7").text
