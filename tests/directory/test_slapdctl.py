"""Our slapd instance: a database seeded by an older release gets the containers it lacks."""

from __future__ import annotations

import subprocess

from directory.slapdctl import Instance
from tests.directory.helpers import ldapdelete
from tests.support import free_port


def test_prepare_adds_a_container_an_existing_database_lacks(tmp_path):
    inst = Instance(data_dir=tmp_path / "slapd", port=free_port())
    assert inst.prepare()
    inst.start()
    try:
        # As if seeded before ou=registrations existed.
        ldapdelete(inst, f"ou=registrations,{inst.suffix}")
    finally:
        inst.stop()

    def units() -> list[str]:
        out = subprocess.run(
            ["/usr/sbin/slapcat", "-f", str(inst.conf), "-a", "(objectClass=organizationalUnit)"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return sorted(line[4:] for line in out.splitlines() if line.startswith("dn: "))

    assert f"ou=registrations,{inst.suffix}" not in units()

    assert not inst.prepare()  # not seeded again
    assert f"ou=registrations,{inst.suffix}" in units()
    before = units()
    inst.prepare()
    assert units() == before  # nothing added twice


def test_the_broker_reads_a_directory_of_more_than_500_entries(tmp_path):
    # slapd's default size limit, 500 entries a search, held for the broker: past it its sync's
    # refresh failed at every try, and topics stopped flowing either way.
    import ldap
    import ldap.modlist

    from directory.selectors import directory_entries

    inst = Instance(data_dir=tmp_path / "slapd", port=free_port())
    inst.prepare()
    inst.start()
    try:
        conn = ldap.initialize(inst.url)
        conn.simple_bind_s(inst.broker_dn, inst.broker_password)
        for i in range(520):
            attrs = {
                "objectClass": [b"hpwsnTopic"],
                "cn": [f"Many{i}".encode()],
                "hpwsnTopicName": [f"Many{i}".encode()],
            }
            conn.add_s(f"cn=Many{i},ou=topics,{inst.suffix}", ldap.modlist.addModlist(attrs))

        entries = directory_entries(conn, inst.suffix)

        assert sum(e.dn.startswith("cn=Many") for e in entries) == 520
        conn.unbind_s()
    finally:
        inst.stop()
