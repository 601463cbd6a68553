"""Operators log in with their LDAP account; the hpwsn-* groups give their roles."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from directory.roles import ADMIN, ANALYST, OPERATOR, has_role, user_roles
from tests.directory.helpers import ldif

GROUPS = "ou=groups,dc=hpwsn,dc=local"
PEOPLE = "ou=people,dc=hpwsn,dc=local"


def login(client, username: str, password: str):  # type: ignore[no-untyped-def]
    return client.post("/admin/login/?next=/admin/", {"username": username, "password": password})


@pytest.mark.parametrize(
    ("username", "superuser", "groups", "roles"),
    [
        ("admin1", True, {"hpwsn-admins"}, {ADMIN, OPERATOR, ANALYST}),
        ("operator1", False, {"hpwsn-operators"}, {OPERATOR, ANALYST}),
        ("analyst1", False, {"hpwsn-analysts"}, {ANALYST}),
    ],
)
def test_an_ldap_user_logs_in_to_the_admin_with_the_role_of_their_group(
    client, db, ldap_directory, username, superuser, groups, roles
):
    resp = login(client, username, ldap_directory.demo_password(username))
    assert resp.status_code == 302, resp.content.decode()[:2000]
    assert resp["Location"] == "/admin/"
    user = get_user_model().objects.get(username=username)
    assert user.is_staff
    assert user.is_superuser is superuser
    assert set(user.groups.values_list("name", flat=True)) == groups
    assert user_roles(user) == roles
    assert client.get("/admin/").status_code == 200


def test_a_directory_user_without_an_operator_group_gets_no_role_and_no_admin(
    client, db, ldap_directory
):
    resp = login(client, "publisher1", ldap_directory.demo_password("publisher1"))
    assert resp.status_code == 200
    assert "staff account" in resp.content.decode()
    user = get_user_model().objects.get(username="publisher1")
    assert not user.is_staff
    assert user_roles(user) == set()
    assert not has_role(user, ANALYST)


def test_a_wrong_password_gets_a_clear_login_error(client, db, ldap_directory):
    resp = login(client, "operator1", "not-the-password")
    assert resp.status_code == 200
    assert "Please enter the correct username and password" in resp.content.decode()
    assert "_auth_user_id" not in client.session


def test_a_group_change_in_the_directory_takes_effect_at_the_next_login(client, db, ldap_directory):
    password = ldap_directory.demo_password("analyst1")
    login(client, "analyst1", password)
    assert user_roles(get_user_model().objects.get(username="analyst1")) == {ANALYST}
    member = f"member: uid=analyst1,{PEOPLE}"
    ldif(
        ldap_directory,
        f"dn: cn=hpwsn-operators,{GROUPS}\nchangetype: modify\nadd: member\n{member}",
    )
    try:
        client.logout()
        login(client, "analyst1", password)
        user = get_user_model().objects.get(username="analyst1")
        assert user_roles(user) == {OPERATOR, ANALYST}
        assert has_role(user, OPERATOR)
    finally:
        ldif(
            ldap_directory,
            f"dn: cn=hpwsn-operators,{GROUPS}\nchangetype: modify\ndelete: member\n{member}",
        )


def test_a_local_superuser_still_logs_in_without_the_directory(client, db, ldap_directory):
    get_user_model().objects.create_superuser("localadmin", "l@example.org", "local-pass-123")
    assert login(client, "localadmin", "local-pass-123").status_code == 302
    assert has_role(get_user_model().objects.get(username="localadmin"), ADMIN)
