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
