"""Sites sharing their topic tree: multi-provider syncrepl of ou=topics between real slapd.

Three sharing sites in a line, a - b - c (a and c each share with b, b with both), and d, which
sets nothing and keeps its own tree. A change reaches a site that does not name its origin
through the site between them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import ldap
import pytest

from directory.slapdctl import Instance, Sharing, SharingError
from tests.directory.helpers import BASE, admin_conn, entry, sites_running, topic_dn
from tests.support import HoldingRelay, free_port, wait_until

pytestmark = pytest.mark.integration

# Quotes, a backslash and a space: the password must survive slapd.conf's quoting.
REPLICATOR_PASSWORD = 'rep "li" ca\\tor pw'
PEOPLE = f"ou=people,{BASE}"
WAIT_S = 15.0


def add_topic(site: Instance, path: str, **attrs: str) -> None:
    """An operator's ldapadd of a topic entry, with python-ldap as the directory manager."""
    name = path.rsplit(":", 1)[-1]
    values = {"objectClass": "hpwsnTopic", "cn": name, "hpwsnTopicName": name, **attrs}
    conn = admin_conn(site)
    try:
        conn.add_s(topic_dn(path), [(k, [v.encode()]) for k, v in values.items()])
    finally:
        conn.unbind_s()


def modify(site: Instance, dn: str, attr: str, value: str) -> None:
    conn = admin_conn(site)
    try:
        conn.modify_s(dn, [(ldap.MOD_REPLACE, attr, [value.encode()])])
    finally:
        conn.unbind_s()


def delete(site: Instance, dn: str) -> None:
    conn = admin_conn(site)
    try:
        conn.delete_s(dn)
    finally:
        conn.unbind_s()


def arrives(site: Instance, dn: str) -> bool:
    return wait_until(lambda: entry(site, dn) is not None, timeout=WAIT_S, interval=0.1)


def passed(site: Instance, origin: Instance, marker: str) -> None:
    """A barrier: a topic added at origin after the changes under test has reached site, so
    whatever of them replicates has reached it too (one stream, in order)."""
    add_topic(origin, marker)
    assert arrives(site, topic_dn(marker)), site.data_dir / "slapd.log"


PORTS = {name: free_port() for name in "abcd"}


@pytest.fixture(scope="module")
def b_to_a() -> Iterator[HoldingRelay]:
    """The network from b to a: a reads b's changes through it."""
    relay = HoldingRelay(PORTS["b"])
    yield relay
    relay.close()


@pytest.fixture(scope="module")
def sites(tmp_path_factory, b_to_a) -> Iterator[dict[str, Instance]]:  # type: ignore[no-untyped-def]
    url = {name: f"ldap://127.0.0.1:{port}/" for name, port in PORTS.items()}
    peers = {"a": ("b",), "b": ("a", "c"), "c": ("b",), "d": ()}
    made: dict[str, Instance] = {}
    for server_id, name in enumerate("abcd", start=1):
        peer_urls = [url[p] for p in peers[name]]
        if name == "a":
            peer_urls = [f"ldap://127.0.0.1:{b_to_a.port}/"]
        sharing = (
            Sharing(
                server_id=server_id,
                peers=tuple(peer_urls),
                replicator_password=REPLICATOR_PASSWORD,
            )
            if peers[name]
            else None
        )
        made[name] = Instance(
            data_dir=tmp_path_factory.mktemp(f"site-{name}"), port=PORTS[name], sharing=sharing
        )
    with sites_running(made):
        yield made


def test_a_topic_added_at_one_site_appears_at_its_peer(sites):
    a, b = sites["a"], sites["b"]
    add_topic(a, "Shared1", description="made at a")
    assert arrives(b, topic_dn("Shared1"))
    assert entry(b, topic_dn("Shared1"))["description"] == ["made at a"]  # type: ignore[index]
    # The same entry, not a copy: the broker links topics by entryUUID.
    uuid = "entryUUID"
    conns = [admin_conn(s) for s in (a, b)]
    try:
        got = [c.search_s(topic_dn("Shared1"), ldap.SCOPE_BASE, attrlist=[uuid]) for c in conns]
    finally:
        for c in conns:
            c.unbind_s()
    assert got[0][0][1][uuid] == got[1][0][1][uuid]


def test_a_modify_and_a_delete_at_one_site_reach_its_peer(sites):
    a, b = sites["a"], sites["b"]
    add_topic(a, "Shared2")
    add_topic(a, "Shared2:Leaf")
    assert arrives(b, topic_dn("Shared2:Leaf"))

    modify(a, topic_dn("Shared2"), "hpwsnPriority", "7")
    assert wait_until(
        lambda: (entry(b, topic_dn("Shared2")) or {}).get("hpwsnPriority") == ["7"], WAIT_S, 0.1
    )
    delete(a, topic_dn("Shared2:Leaf"))
    assert wait_until(lambda: entry(b, topic_dn("Shared2:Leaf")) is None, WAIT_S, 0.1)
    assert entry(b, topic_dn("Shared2")) is not None

    conn = admin_conn(a)
    try:
        conn.rename_s(topic_dn("Shared2"), "cn=Shared2b", delold=1)
        conn.modify_s(topic_dn("Shared2b"), [(ldap.MOD_REPLACE, "hpwsnTopicName", [b"Shared2b"])])
    finally:
        conn.unbind_s()
    assert wait_until(
        lambda: (entry(b, topic_dn("Shared2b")) or {}).get("hpwsnTopicName") == ["Shared2b"],
        WAIT_S,
        0.1,
    )
    assert entry(b, topic_dn("Shared2")) is None


def test_a_topic_added_at_the_peer_comes_back_the_other_way(sites):
    a, b = sites["a"], sites["b"]
    add_topic(b, "Shared3")
    assert arrives(a, topic_dn("Shared3"))
    modify(b, topic_dn("ALL1"), "description", "edited at b")
    assert wait_until(
        lambda: (entry(a, topic_dn("ALL1")) or {}).get("description") == ["edited at b"],
        WAIT_S,
        0.1,
    )


def test_edits_of_one_topic_at_two_sites_end_as_the_last_written_at_both(sites, b_to_a):
    a, b = sites["a"], sites["b"]
    add_topic(a, "Contested")
    assert arrives(b, topic_dn("Contested"))
    # b's edit reaches a only after a's own later edit: a keeps its own, the later entryCSN.
    b_to_a.hold()
    try:
        modify(b, topic_dn("Contested"), "description", "first, at b")
        time.sleep(0.5)  # long enough for b's edit to reach a, were it not held
        assert "description" not in (entry(a, topic_dn("Contested")) or {})
        modify(a, topic_dn("Contested"), "description", "second, at a")
        assert wait_until(
            lambda: (entry(b, topic_dn("Contested")) or {}).get("description") == ["second, at a"],
            WAIT_S,
            0.1,
        )
    finally:
        b_to_a.release()
    changed_at_b = "cn=Contested-b," + topic_dn("ALL1")
    add_topic(b, "ALL1:Contested-b")  # a sign that what b sent before it has reached a
    assert arrives(a, changed_at_b)
    both = {s.data_dir.name: entry(s, topic_dn("Contested")) for s in (a, b)}
    assert all(e and e.get("description") == ["second, at a"] for e in both.values()), both


def test_a_change_reaches_a_site_through_the_site_between(sites):
    a, c = sites["a"], sites["c"]
    add_topic(a, "Relayed")
    assert arrives(c, topic_dn("Relayed"))
    add_topic(c, "Relayed:Back")
    assert arrives(a, topic_dn("Relayed:Back"))
    delete(c, topic_dn("Relayed:Back"))
    assert wait_until(lambda: entry(a, topic_dn("Relayed:Back")) is None, WAIT_S, 0.1)


def test_people_and_groups_stay_at_their_site(sites):
    a, b = sites["a"], sites["b"]
    person = f"uid=local1,{PEOPLE}"
    conn = admin_conn(a)
    try:
        conn.add_s(
            person,
            [
                ("objectClass", [b"inetOrgPerson"]),
                ("uid", [b"local1"]),
                ("cn", [b"Local One"]),
                ("sn", [b"One"]),
            ],
        )
        conn.modify_s(
            f"cn=hpwsn-operators,ou=groups,{BASE}", [(ldap.MOD_ADD, "member", [person.encode()])]
        )
    finally:
        conn.unbind_s()
    passed(b, a, "AfterPerson")
    assert entry(b, person) is None
    members = entry(b, f"cn=hpwsn-operators,ou=groups,{BASE}")["member"]  # type: ignore[index]
    assert person not in members


def test_the_replicator_reads_the_topics_and_nothing_else(sites):
    a = sites["a"]
    conn = ldap.initialize(a.url)
    try:
        conn.simple_bind_s(a.replicator_dn, REPLICATOR_PASSWORD)
        found = [dn for dn, _ in conn.search_s(f"ou=topics,{BASE}", ldap.SCOPE_SUBTREE) if dn]
        assert topic_dn("ALL:ALARM:ALARM1") in found
        assert all(dn.endswith(f"ou=topics,{BASE}") for dn in found), found
        for elsewhere in (BASE, PEOPLE, f"ou=groups,{BASE}", f"ou=subscriptions,{BASE}"):
            with pytest.raises(ldap.NO_SUCH_OBJECT):
                conn.search_s(elsewhere, ldap.SCOPE_SUBTREE)
        with pytest.raises(ldap.INSUFFICIENT_ACCESS):
            conn.modify_s(topic_dn("ALL"), [(ldap.MOD_REPLACE, "description", [b"no"])])
    finally:
        conn.unbind_s()


def test_a_site_that_does_not_share_keeps_its_own_tree(sites):
    a, b, d = sites["a"], sites["b"], sites["d"]
    directives = [line.split()[0] for line in d.conf.read_text().splitlines() if line[:1].isalpha()]
    assert not {"serverID", "syncrepl", "multiprovider"} & set(directives)
    add_topic(d, "OwnAtD")
    add_topic(a, "NotForD")
    passed(b, a, "AfterD")
    assert entry(d, topic_dn("NotForD")) is None
    assert entry(d, topic_dn("AfterD")) is None
    assert entry(a, topic_dn("OwnAtD")) is None
    assert entry(b, topic_dn("OwnAtD")) is None
    # Nor can a peer read it: it has no replicator account.
    conn = ldap.initialize(d.url)
    try:
        with pytest.raises(ldap.INVALID_CREDENTIALS):
            conn.simple_bind_s(d.replicator_dn, REPLICATOR_PASSWORD)
    finally:
        conn.unbind_s()


@pytest.mark.django_db(transaction=True)
def test_a_topic_added_at_a_peer_becomes_a_topic_of_the_site_through_its_directory_sync(
    sites, settings
):
    """Site b's directory sync (directory/sync.py), in process against b's slapd and the test
    database, makes a Topic of what an operator added at site a's directory."""
    from django.db import connection

    from directory.sync import DirectorySync
    from topics.models import Topic

    a, b = sites["a"], sites["b"]
    settings.HPWSN_LDAP_URL = b.url
    settings.HPWSN_LDAP_BIND_DN = b.broker_dn
    settings.HPWSN_LDAP_BIND_PASSWORD = b.broker_password
    sync = DirectorySync()

    def run() -> None:
        try:
            sync.run()
        finally:
            connection.close()

    thread = threading.Thread(target=run, name="site-b-directory-sync")
    thread.start()
    try:
        # The sync has loaded b's tree (the seeded demo tree, which every site shares).
        assert wait_until(lambda: Topic.objects.filter(path="ALL:ALARM:ALARM1").exists(), WAIT_S)
        add_topic(a, "FromSiteA", hpwsnReliability="fast", hpwsnAnonymousPublish="TRUE")
        add_topic(a, "FromSiteA:Child")
        assert wait_until(lambda: Topic.objects.filter(path="FromSiteA:Child").exists(), WAIT_S)
        made = Topic.objects.get(path="FromSiteA")
        assert (made.reliability, made.anonymous_publish) == ("fast", True)

        modify(a, topic_dn("FromSiteA"), "hpwsnPriority", "9")
        assert wait_until(lambda: Topic.objects.get(path="FromSiteA").priority == 9, WAIT_S)
        delete(a, topic_dn("FromSiteA:Child"))
        assert wait_until(lambda: not Topic.objects.filter(path="FromSiteA:Child").exists(), WAIT_S)
    finally:
        sync.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_the_directory_listens_where_peers_reach_it(tmp_path):
    site = Instance(data_dir=tmp_path / "slapd", port=free_port(), listen_host="127.0.0.2")
    site.prepare()
    site.start()
    try:
        conn = ldap.initialize(f"ldap://127.0.0.2:{site.port}/")
        conn.simple_bind_s(site.admin_dn, site.admin_password)
        assert conn.search_s(topic_dn("ALL"), ldap.SCOPE_BASE)
        conn.unbind_s()
        assert entry(site, topic_dn("ALL")) is not None  # and on loopback, for the broker
    finally:
        site.stop()


def _prepare_cli(data_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -m directory.slapdctl prepare`, as make run (scripts/run.sh) runs it."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("HPWSN_DIRECTORY_")}
    return subprocess.run(
        [
            *(sys.executable, "-m", "directory.slapdctl", "prepare"),
            *("--data-dir", str(data_dir), "--port", str(free_port())),
        ],
        cwd=Path(__file__).resolve().parents[2],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_sharing_without_a_replicator_password_is_refused(tmp_path):
    done = _prepare_cli(
        tmp_path / "slapd",
        {
            "HPWSN_DIRECTORY_SERVER_ID": "1",
            "HPWSN_DIRECTORY_SHARE_WITH": "ldap://127.0.0.1:3900/",
        },
    )
    assert done.returncode != 0
    assert "HPWSN_DIRECTORY_REPLICATOR_PASSWORD" in done.stderr
    assert "there is no default" in done.stderr
    assert not (tmp_path / "slapd" / "slapd.conf").exists()


def test_sharing_without_a_server_id_is_refused(tmp_path):
    done = _prepare_cli(
        tmp_path / "slapd",
        {
            "HPWSN_DIRECTORY_SHARE_WITH": "ldap://127.0.0.1:3900/",
            "HPWSN_DIRECTORY_REPLICATOR_PASSWORD": "s3cret",
        },
    )
    assert done.returncode != 0
    assert "HPWSN_DIRECTORY_SERVER_ID" in done.stderr


def test_a_tree_changed_while_the_site_kept_its_own_is_not_shared(tmp_path):
    """Multi-provider replication cannot merge trees that grew apart: the first refresh from a
    peer would delete this site's own topics. prepare refuses and names one."""
    site = Instance(data_dir=tmp_path / "slapd", port=free_port())
    site.prepare()
    site.start()
    try:
        add_topic(site, "OwnTopic")
    finally:
        site.stop()
    site.sharing = Sharing(
        server_id=1, peers=("ldap://127.0.0.1:3900/",), replicator_password="s3cret"
    )
    with pytest.raises(SharingError, match="OwnTopic"):
        site.prepare()


def test_the_replicator_account_is_removed_when_the_site_stops_sharing(tmp_path):
    site = Instance(
        data_dir=tmp_path / "slapd",
        port=free_port(),
        sharing=Sharing(server_id=1, peers=("ldap://127.0.0.1:3900/",), replicator_password="s"),
    )
    site.prepare()

    def can_bind() -> bool:
        site.start()
        try:
            conn = ldap.initialize(site.url)
            try:
                conn.simple_bind_s(site.replicator_dn, "s")
            except ldap.INVALID_CREDENTIALS:
                return False
            conn.unbind_s()
            return True
        finally:
            site.stop()

    assert can_bind()
    site.sharing = None
    site.prepare()
    assert not can_bind()


def test_sharing_settings_come_from_the_environment() -> None:
    assert Sharing.from_env({}) is None
    env = {
        "HPWSN_DIRECTORY_SERVER_ID": "7",
        "HPWSN_DIRECTORY_SHARE_WITH": "ldap://10.0.0.2:3899/, ldap://10.0.0.3:3899/",
        "HPWSN_DIRECTORY_REPLICATOR_PASSWORD": "s3cret",
    }
    sharing = Sharing.from_env(env)
    assert sharing is not None
    assert sharing.peers == ("ldap://10.0.0.2:3899/", "ldap://10.0.0.3:3899/")
    with pytest.raises(SharingError, match=r"1\.\.4095"):
        Sharing.from_env({**env, "HPWSN_DIRECTORY_SERVER_ID": "4096"})
    with pytest.raises(SharingError, match="not an ldap"):
        Sharing.from_env({**env, "HPWSN_DIRECTORY_SHARE_WITH": "http://10.0.0.2/"})
    with pytest.raises(SharingError, match="twice"):
        Sharing.from_env({**env, "HPWSN_DIRECTORY_SHARE_WITH": "ldap://x:1/,ldap://x:1"})
