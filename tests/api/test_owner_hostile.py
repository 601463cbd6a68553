"""The REST API against a hostile principal: what is another's stays refused to it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.api.conftest import PASSWORD
from tests.directory.helpers import BASE, directory_person, ldapdelete, ldif
from tests.support import console_login

PROBLEM = "application/problem+json"


def _problem(r: httpx.Response, status: int, type_: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["type"] == f"urn:hpwsn:problem:{type_}"
    return body


def test_a_token_cannot_make_tokens_that_outlive_its_revocation(platform):  # type: ignore[no-untyped-def]
    tokens = platform.base_url + "/api/v1/tokens"
    made = httpx.post(tokens, json={"name": "leaked"}, auth=("subscriber1", PASSWORD), timeout=30)
    assert made.status_code == 201, made.text
    leaked = {"Authorization": f"Bearer {made.json()['token']}"}
    before = {t["id"] for t in httpx.get(tokens, headers=leaked, timeout=30).json()}

    # Whoever holds a token may use it, but not mint another one with it: revoking the token
    # must end that holder's access.
    minted = httpx.post(tokens, json={"name": "spare"}, headers=leaked, timeout=30)
    _problem(minted, 403, "forbidden")
    assert "token" not in minted.json()
    after = {t["id"] for t in httpx.get(tokens, headers=leaked, timeout=30).json()}
    assert after == before

    # HTTP Basic (and the console's session) still create tokens; the leaked one still revokes.
    again = httpx.post(tokens, json={"name": "ci"}, auth=("subscriber1", PASSWORD), timeout=30)
    assert again.status_code == 201, again.text
    spare = httpx.delete(
        f"{tokens}/{again.json()['id']}", auth=("subscriber1", PASSWORD), timeout=30
    )
    assert spare.status_code == 204
    assert (
        httpx.delete(f"{tokens}/{made.json()['id']}", headers=leaked, timeout=30).status_code == 204
    )


@pytest.fixture
def leaver(ldap_directory) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A directory person in hpwsn-operators, for a test that removes it from the directory."""
    with directory_person(ldap_directory, PASSWORD, "hpwsn-operators") as uid:
        yield uid


def test_a_session_of_a_person_removed_from_the_directory_is_refused(
    platform, ldap_directory, leaver
):  # type: ignore[no-untyped-def]
    session = console_login(platform.base_url, leaver, PASSWORD)
    try:
        ldapdelete(ldap_directory, f"uid={leaver},ou=people,{BASE}")
        # As for the person's API tokens: someone the directory no longer knows is nobody's
        # operator any more, whatever groups its last login mirrored.
        for path in ("/api/v1/topics", "/api/v1/deadletters", "/api/v1/tokens"):
            _problem(session.get(path), 401, "not-authenticated")
        csrf = {"X-CSRFToken": session.cookies["csrftoken"], "Referer": platform.base_url + "/"}
        minted = session.post("/api/v1/tokens", json={"name": "parting gift"}, headers=csrf)
        _problem(minted, 401, "not-authenticated")
    finally:
        session.close()


def test_a_console_session_ends_with_its_person_and_follows_its_groups(
    platform, ldap_directory, leaver
):  # type: ignore[no-untyped-def]
    """The console (and the dashboard's and analytics page's sockets, which read the session's
    user the same way) as the REST API: a role withdrawn in the directory applies to a session
    already open, and a person removed from it is logged out."""
    dn = f"uid={leaver},ou=people,{BASE}"
    session = console_login(platform.base_url, leaver, PASSWORD)
    try:
        for change in ("delete", "add"):  # from hpwsn-operators to hpwsn-analysts
            group = "operators" if change == "delete" else "analysts"
            ldif(
                ldap_directory,
                f"dn: cn=hpwsn-{group},ou=groups,{BASE}\nchangetype: modify\n"
                f"{change}: member\nmember: {dn}",
            )
        page = session.get("/console/")
        assert page.status_code == 200
        assert "analyst · read-only" in page.text
        assert session.get("/monitoring/").status_code == 200  # staff still: an analyst is
    finally:
        ldif(
            ldap_directory,
            f"dn: cn=hpwsn-analysts,ou=groups,{BASE}\nchangetype: modify\n"
            f"delete: member\nmember: {dn}",
            check=False,
        )
        session.close()


def test_a_console_session_of_a_person_removed_from_the_directory_is_logged_out(
    platform, ldap_directory, leaver
):  # type: ignore[no-untyped-def]
    session = console_login(platform.base_url, leaver, PASSWORD)
    try:
        ldapdelete(ldap_directory, f"uid={leaver},ou=people,{BASE}")
        page = session.get("/console/")
        assert page.status_code == 302
        assert page.headers["location"].startswith("/console/login/")
    finally:
        session.close()
