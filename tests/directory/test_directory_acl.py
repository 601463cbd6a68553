"""The slapd access rules: digest secrets are the broker's alone; only the broker writes topics."""

from __future__ import annotations

import ldap
import pytest

PEOPLE = "ou=people,dc=hpwsn,dc=local"


def bind(directory, dn: str | None, password: str = ""):  # type: ignore[no-untyped-def]
    conn = ldap.initialize(directory.url)
    conn.set_option(ldap.OPT_NETWORK_TIMEOUT, 5)
    if dn is not None:
        conn.simple_bind_s(dn, password)
    return conn


def secret_of(conn, uid: str) -> list[bytes]:  # type: ignore[no-untyped-def]
    found = conn.search_s(PEOPLE, ldap.SCOPE_ONELEVEL, f"(uid={uid})", ["hpwsnDigestSecret"])
    return [v for _dn, attrs in found for v in attrs.get("hpwsnDigestSecret", [])]


def test_only_the_broker_reads_digest_secrets(ldap_directory):
    broker = bind(ldap_directory, ldap_directory.broker_dn, ldap_directory.broker_password)
    assert secret_of(broker, "publisher1") == [ldap_directory.demo_password("publisher1").encode()]
    operator = bind(
        ldap_directory,
        f"uid=operator1,{PEOPLE}",
        ldap_directory.demo_password("operator1"),
    )
    assert secret_of(operator, "publisher1") == []
    assert secret_of(operator, "operator1") == []  # not even one's own
    # Anonymous callers do not even learn that the people exist.
    with pytest.raises(ldap.NO_SUCH_OBJECT):
        bind(ldap_directory, None).search_s(PEOPLE, ldap.SCOPE_SUBTREE, "(uid=*)")


def test_a_directory_user_may_read_topics_but_not_change_them(ldap_directory):
    operator = bind(
        ldap_directory,
        f"uid=operator1,{PEOPLE}",
        ldap_directory.demo_password("operator1"),
    )
    dn = "cn=ALL,ou=topics,dc=hpwsn,dc=local"
    assert operator.search_s(dn, ldap.SCOPE_BASE)[0][0] == dn
    with pytest.raises(ldap.INSUFFICIENT_ACCESS):
        operator.modify_s(dn, [(ldap.MOD_REPLACE, "description", [b"mine"])])
