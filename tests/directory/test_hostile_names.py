"""Hostile names and values on every road to and from the directory: DN and filter special
characters in topic names, user names and group names, and entries an operator edited into
shapes the broker never writes. Each is refused with a reason or carried over faithfully; none
stops the synchronisation of the other entries, and none lets anyone act as someone else."""

from __future__ import annotations

import base64
import uuid

import httpx
import ldap
import ldap.modlist
import pytest
from django.contrib.auth import get_user_model
from ldap.dn import str2dn
from lxml import etree
from zeep.wsse.username import UsernameToken

from directory import mapping
from directory.mapping import Entry, EntryError
from hpwsn import ns
from hpwsn_site import state
from tests.directory.helpers import (
    SUBSCRIPTIONS,
    TOPICS,
    admin_conn,
    entry,
    ldif,
    topic_dn,
)
from tests.support import CT, subscribe_xml, wait_until

PEOPLE = "ou=people,dc=hpwsn,dc=local"
GROUPS = "ou=groups,dc=hpwsn,dc=local"

# Names an operator may give a topic in the directory: every DN special character, a leading
# "#", a backslash that reads like an escape, non-ASCII, and the longest name the broker keeps.
DN_SPECIAL_NAMES = [
    "a,b",
    "x=y",
    "p+q",
    '"q"',
    "<s>",
    "s;t",
    "#h",
    "b\\2c",
    "a\\,b",
    "Café",
    "Ωmega",
    "L" * mapping.NAME_MAX,
]
# User names that would widen an unescaped (uid=...) filter, or read as an escape.
HOSTILE_USERS = [
    "*",
    "admin*",
    "adm*1",
    "admin1)(|(uid=*",
    "*)(uid=*))(|(uid=*",
    "admin1)(objectClass=*",
    "\\2a",
    "admin\\31",
    "admin1\x00",
    "admin1\x00)(uid=*",
    "cn=admin,dc=hpwsn,dc=local",
    "uid=admin1,ou=people,dc=hpwsn,dc=local",
]


def _add(conn, dn: str, **attrs: str | bytes | list[str]) -> None:  # type: ignore[no-untyped-def]
    values: dict[str, list[bytes]] = {}
    for name, value in attrs.items():
        items = value if isinstance(value, list) else [value]
        values[name] = [v if isinstance(v, bytes) else v.encode() for v in items]
    conn.add_s(dn, ldap.modlist.addModlist(values))


def _wipe(conn, dn: str) -> None:  # type: ignore[no-untyped-def]
    try:
        below = conn.search_s(dn, ldap.SCOPE_SUBTREE, "(objectClass=*)", ["1.1"])
    except ldap.NO_SUCH_OBJECT:
        return
    for child, _attrs in sorted(below, key=lambda r: -len(str2dn(r[0]))):
        conn.delete_s(child)


def _entries_below(directory, dn: str) -> dict[str, dict[str, list[bytes]]]:  # type: ignore[no-untyped-def]
    conn = admin_conn(directory)
    try:
        found = conn.search_s(dn, ldap.SCOPE_ONELEVEL, "(objectClass=*)", ["*", "entryUUID"])
    except ldap.NO_SUCH_OBJECT:
        return {}
    finally:
        conn.unbind_s()
    return {mapping.dn_normal(d): a for d, a in found if d}


# ---------------------------------------------------------------- DNs, without a directory


@pytest.mark.parametrize(
    "name", [*DN_SPECIAL_NAMES, " lead", "trail ", "nul\x00", "\\", "#", "=", ",,"]
)
def test_a_topic_dn_names_exactly_its_topic_below_its_parent_whatever_the_name(name):
    parent = f"cn=a\\,b,cn=Root,{TOPICS}"

    dn = mapping.topic_dn(name, parent)

    rdns = str2dn(dn)
    assert [(attr, value) for attr, value, _f in rdns[0]] == [("cn", name)]
    assert mapping.dn_normal(mapping.dn_parent(dn)) == mapping.dn_normal(parent)
    assert mapping.dn_is_below(dn, parent)
    assert not mapping.dn_is_below(dn, f"cn=b,{TOPICS}")
    assert mapping.topic_rdn(name) == dn[: -len(parent) - 1]


def test_names_that_differ_only_in_escaping_are_different_dns():
    assert mapping.dn_normal(mapping.topic_dn("a,b", TOPICS)) != mapping.dn_normal(
        mapping.topic_dn("a\\,b", TOPICS)
    )


@pytest.mark.parametrize(
    "sub_id", ["not-a-uuid", "*", "x)(objectClass=*", "a,b", "0" * 33, "\x01" * 36]
)
def test_a_subscription_entry_whose_id_is_not_a_uuid_is_refused_with_the_reason(sub_id):
    attrs = mapping.subscription_attrs({"id": sub_id, "consumer_address": "http://c.example/"})
    bogus = Entry(dn=f"hpwsnSubscriptionId=x,{SUBSCRIPTIONS}", attrs=attrs)

    with pytest.raises(EntryError, match="is not a UUID"):
        mapping.subscription_view_of_entry(bogus)


# ---------------------------------------------------------------- operator edits, in process


def _subscription_entry(conn, sub_id: str, **attrs: str) -> Entry:  # type: ignore[no-untyped-def]
    dn = f"hpwsnSubscriptionId={ldap.dn.escape_dn_chars(sub_id)},{SUBSCRIPTIONS}"
    _add(conn, dn, objectClass="hpwsnSubscription", hpwsnSubscriptionId=sub_id, **attrs)
    found = conn.search_s(dn, ldap.SCOPE_BASE, "(objectClass=*)", ["*", "entryUUID"])
    return Entry(dn=dn, attrs=found[0][1], uuid=found[0][1]["entryUUID"][0].decode())


@pytest.mark.django_db
def test_an_operator_edit_queued_behind_a_subscription_entry_with_a_bogus_id_still_applies(
    ldap_directory,
):
    from directory.services import SKIPPED
    from directory.sync import DirectorySync
    from subscriptions.models import Subscription

    sub = Subscription.objects.create(
        consumer_address="http://127.0.0.1:9/hostile", dedup_key=uuid.uuid4().hex
    )
    conn = admin_conn(ldap_directory)
    bogus_dn = f"hpwsnSubscriptionId=x\\29\\28objectClass\\3d\\2a,{SUBSCRIPTIONS}"
    good_dn = f"hpwsnSubscriptionId={sub.id},{SUBSCRIPTIONS}"
    try:
        bogus = _subscription_entry(conn, "x)(objectClass=*", hpwsnState="paused")
        good = _subscription_entry(conn, str(sub.id), hpwsnState="paused")
        assert mapping.dn_normal(bogus.dn) == mapping.dn_normal(bogus_dn)
        sync = DirectorySync()
        sync.refreshing = False
        # The persist phase hands over an edit of each, and the bogus one's deletion.
        sync.on_entry(bogus)
        sync.on_delete([bogus.uuid])
        sync.on_entry(good)
        writer = admin_conn(ldap_directory)
        try:
            sync._apply_pending(writer)
        finally:
            writer.unbind_s()

        sub.refresh_from_db()
        assert sub.state == Subscription.State.PAUSED
        reasons = {
            mapping.dn_normal(k.decode()): v.decode()
            for k, v in state.get_redis().hgetall(SKIPPED).items()
        }
        assert "is not a UUID" in reasons[mapping.dn_normal(bogus_dn)]
    finally:
        _wipe(conn, bogus_dn)
        _wipe(conn, good_dn)
        conn.unbind_s()


@pytest.mark.django_db
def test_a_group_whose_name_spells_several_groups_grants_none_of_them(ldap_directory):
    from hpwsn.wssecurity import METHOD_BASIC, Credentials
    from hpwsn_site import auth
    from hpwsn_site.api import auth as api_auth

    group = f"cn=night-shift\\2c hpwsn-admins,{GROUPS}"
    conn = admin_conn(ldap_directory)
    _add(
        conn,
        group,
        objectClass="groupOfNames",
        cn="night-shift, hpwsn-admins",
        member=f"uid=publisher1,{PEOPLE}",
    )
    try:
        password = ldap_directory.demo_password("publisher1")
        verified = auth.directory_verify(Credentials("publisher1", password, METHOD_BASIC))
        assert verified is not None
        principal = verified[0]
        assert principal.name == "publisher1"
        assert "alarm-publishers" in principal.groups  # the groups it is really in still count
        assert not principal.is_admin
        assert "hpwsn-admins" not in principal.groups
        api_auth._groups.clear()
        by_name = api_auth.principal_named("publisher1")
        assert by_name is not None
        assert not by_name.is_admin
        assert "alarm-publishers" in by_name.groups
    finally:
        api_auth._groups.clear()
        conn.delete_s(group)
        conn.unbind_s()


# ---------------------------------------------------------------- logins, in process


@pytest.mark.django_db
@pytest.mark.parametrize("username", [*HOSTILE_USERS, "admin1 \x00", "  ", "a" * 151])
@pytest.mark.parametrize("page", ["/console/login/", "/admin/login/"])
def test_a_hostile_user_name_with_an_admins_password_gets_a_clean_login_refusal(
    client, ldap_directory, username, page
):
    resp = client.post(
        page, {"username": username, "password": ldap_directory.demo_password("admin1")}
    )

    assert resp.status_code == 200  # the form again, with its error; never a redirect in
    assert "_auth_user_id" not in client.session
    assert not get_user_model().objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "spelling",
    # Full-width forms, which Django's login form reads as the plain ones (NFKC).
    [
        "admin1 ",
        " admin1",
        "ADMIN1",
        "\uff41\uff44\uff4d\uff49\uff4e\uff11",
        "\uff21\uff24\uff2d\uff29\uff2e\uff11",
    ],
)
def test_another_spelling_of_a_user_name_logs_in_as_that_same_user_only(
    client, ldap_directory, spelling
):
    from directory.roles import principal_of_user

    password = ldap_directory.demo_password("admin1")
    resp = client.post("/console/login/", {"username": spelling, "password": password})

    assert resp.status_code == 302
    assert list(get_user_model().objects.values_list("username", flat=True)) == ["admin1"]
    user = get_user_model().objects.get()
    assert principal_of_user(user).owner == "user:admin1"
    # Over REST Basic the same spelling is the same principal.
    resp = client.get("/api/v1/tokens", HTTP_AUTHORIZATION=_basic(spelling.strip(), password))
    assert resp.status_code == 200, resp.content


def _basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


@pytest.mark.django_db
@pytest.mark.parametrize("username", [*HOSTILE_USERS, "admin1\t", ":admin1"])
def test_a_hostile_user_name_over_rest_basic_gets_401_with_the_admins_password(
    client, ldap_directory, username
):
    from hpwsn_site import auth

    auth.cache_clear()
    resp = client.get(
        "/api/v1/topics",
        HTTP_AUTHORIZATION=_basic(username, ldap_directory.demo_password("admin1")),
    )

    assert resp.status_code == 401, resp.content
    assert resp["WWW-Authenticate"]


# ---------------------------------------------------------------- with the platform


def _soap(platform, body: str, *, headers: dict[str, str] | None = None, security: str = ""):  # type: ignore[no-untyped-def]
    envelope = (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}">'
        f"<s:Header>{security}</s:Header><s:Body>{body}</s:Body></s:Envelope>"
    )
    return httpx.post(
        platform.endpoint,
        content=envelope.encode(),
        headers={"Content-Type": CT["1.1"], **(headers or {})},
        timeout=30,
    )


def _token_header(username: str, password: str, *, digest: bool) -> str:
    holder = etree.fromstring(
        f'<s:Envelope xmlns:s="{ns.SOAP11}"><s:Header/><s:Body/></s:Envelope>'
    )
    signed, _headers = UsernameToken(username, password, use_digest=digest).apply(holder, {})
    header = signed.find(f"{{{ns.SOAP11}}}Header")
    assert header is not None
    return "".join(etree.tostring(child).decode() for child in header)


def test_hostile_user_names_over_soap_basic_and_username_tokens_are_refused_cleanly(
    platform, ldap_directory, consumer_factory
):
    password = ldap_directory.demo_password("admin1")
    body = subscribe_xml(consumer_factory().url, "ALL")
    for username in HOSTILE_USERS:
        resp = _soap(platform, body, headers={"Authorization": _basic(username, password)})
        assert resp.status_code == 401, (username, resp.text)
        assert resp.headers["WWW-Authenticate"].startswith("Basic")
        if "\x00" in username:
            continue  # XML cannot carry a NUL: no token can name such a user
        for digest in (False, True):
            token = _token_header(username, password, digest=digest)
            resp = _soap(platform, body, security=token)
            assert resp.status_code == 500, (username, digest, resp.text)
            assert "FailedAuthentication" in resp.text, (username, digest, resp.text)
    # The same calls with the name spelt right are accepted: the refusals were for the names.
    resp = _soap(platform, body, headers={"Authorization": _basic("admin1", password)})
    assert resp.status_code == 200, resp.text


def _topic(path: str):  # type: ignore[no-untyped-def]
    from topics.models import Topic

    return Topic.objects.filter(path=path).first()


def test_topics_named_with_dn_special_characters_in_the_directory_keep_their_own_entries(
    platform, ldap_directory, db_access, committed, dir_root
):
    from topics.models import Topic

    parent = f"{dir_root}:Specials"
    parent_dn = topic_dn(parent)
    conn = admin_conn(ldap_directory)
    _add(conn, parent_dn, objectClass="hpwsnTopic", cn="Specials", hpwsnTopicName="Specials")
    try:
        for name in DN_SPECIAL_NAMES:
            _add(
                conn,
                mapping.topic_dn(name, parent_dn),
                objectClass="hpwsnTopic",
                cn=name,
                hpwsnTopicName=name,
            )
        paths = {f"{parent}:{name}" for name in DN_SPECIAL_NAMES}
        assert wait_until(
            lambda: (
                set(Topic.objects.filter(parent__path=parent).values_list("path", flat=True))
                == paths
            ),
            timeout=10,
        ), platform.logs()

        def edit() -> None:
            Topic.objects.filter(parent__path=parent).update(description="edited in the broker")
            state.bump(state.VERSION_TOPICS)

        committed(edit)
        expected = {mapping.dn_normal(mapping.topic_dn(n, parent_dn)) for n in DN_SPECIAL_NAMES}

        def written() -> bool:
            below = _entries_below(ldap_directory, parent_dn)
            return set(below) == expected and all(
                a.get("description") == [b"edited in the broker"] for a in below.values()
            )

        assert wait_until(written, timeout=10), (
            _entries_below(ldap_directory, parent_dn),
            platform.logs(),
        )
        below = _entries_below(ldap_directory, parent_dn)
        names = sorted(a["hpwsnTopicName"][0].decode() for a in below.values())
        assert names == sorted(DN_SPECIAL_NAMES)
    finally:
        _wipe(conn, parent_dn)
        conn.unbind_s()
    assert wait_until(lambda: _topic(parent) is None, timeout=10), platform.logs()


def test_topics_whose_names_differ_only_in_case_do_not_keep_other_topics_from_the_directory(
    platform, ldap_directory, db_access, committed, dir_root
):
    from topics.models import Topic
    from topics.services import topic_create

    parent = f"{dir_root}:Cases"
    try:
        committed(topic_create, path=f"{parent}:Case")
        committed(topic_create, path=f"{parent}:CASE")
        committed(topic_create, path=f"{parent}:Zed:Leaf")

        # One of the two spellings holds the DN; the other topics are written all the same.
        assert wait_until(
            lambda: entry(ldap_directory, topic_dn(f"{parent}:Zed:Leaf")) is not None, timeout=10
        ), platform.logs()
        case = entry(ldap_directory, topic_dn(f"{parent}:Case"))
        assert case is not None
        assert case["hpwsnTopicName"] in (["Case"], ["CASE"])
        assert platform.procs["directory"].poll() is None
        health = httpx.get(platform.base_url + "/healthz", timeout=5).json()
        assert health["checks"]["directory"]["status"] == "ok", health
        # Both stay topics in the broker.
        assert _topic(f"{parent}:Case") is not None
        assert _topic(f"{parent}:CASE") is not None
    finally:
        committed(lambda: Topic.objects.filter(path__startswith=parent).delete())
        committed(state.bump, state.VERSION_TOPICS)
    assert wait_until(lambda: entry(ldap_directory, topic_dn(parent)) is None, timeout=10)


def test_a_topic_whose_entry_is_named_otherwise_moves_to_its_own_name_when_the_broker_edits_it(
    platform, ldap_directory, db_access, committed, dir_root
):
    from topics.models import Topic
    from topics.services import topic_create

    odd_dn = f"cn=Cn1,{topic_dn(dir_root)}"
    path = f"{dir_root}:Other,Name"
    own_dn = mapping.topic_dn("Other,Name", topic_dn(dir_root))
    ldif(
        ldap_directory,
        f"dn: {odd_dn}\nobjectClass: hpwsnTopic\ncn: Cn1\nhpwsnTopicName: Other,Name\n",
        tool="ldapadd",
    )
    try:
        assert wait_until(lambda: _topic(path) is not None, timeout=10), platform.logs()

        def edit() -> None:
            Topic.objects.filter(path=path).update(description="renamed by the broker")
            state.bump(state.VERSION_TOPICS)

        committed(edit)
        assert wait_until(lambda: entry(ldap_directory, own_dn) is not None, timeout=10), (
            platform.logs()
        )
        moved = entry(ldap_directory, own_dn)
        assert moved is not None
        assert moved["description"] == ["renamed by the broker"]
        assert moved["hpwsnTopicName"] == ["Other,Name"]
        assert entry(ldap_directory, odd_dn) is None
        # The synchronisation goes on: a topic made afterwards reaches the directory.
        committed(topic_create, path=f"{dir_root}:AfterOther")
        assert wait_until(
            lambda: entry(ldap_directory, topic_dn(f"{dir_root}:AfterOther")) is not None, 10
        ), platform.logs()
    finally:
        conn = admin_conn(ldap_directory)
        for dn in (odd_dn, own_dn, topic_dn(f"{dir_root}:AfterOther")):
            _wipe(conn, dn)
        conn.unbind_s()
    assert wait_until(lambda: _topic(path) is None, timeout=10), platform.logs()


def test_a_topic_entry_holding_a_nul_is_reported_and_its_siblings_still_load(
    platform, ldap_directory, db_access, dir_root
):
    from directory.services import SKIPPED

    conn = admin_conn(ldap_directory)
    base = topic_dn(dir_root)
    bad_name = mapping.topic_dn("n\x00ul", base)
    bad_text = f"cn=NulText,{base}"
    fine = f"cn=NextToNul,{base}"
    try:
        _add(conn, bad_name, objectClass="hpwsnTopic", cn=b"n\x00ul", hpwsnTopicName=b"n\x00ul")
        _add(
            conn,
            bad_text,
            objectClass="hpwsnTopic",
            cn="NulText",
            hpwsnTopicName="NulText",
            description=b"before\x00after",
        )
        _add(
            conn,
            fine,
            objectClass="hpwsnTopic",
            cn="NextToNul",
            hpwsnTopicName="NextToNul",
            description=b"tab\there, bell\x07, and \xe2\x80\xae reversed",
        )
        assert wait_until(lambda: _topic(f"{dir_root}:NextToNul") is not None, 10), platform.logs()
        assert (
            _topic(f"{dir_root}:NextToNul").description
            == "tab\there, bell\x07, and \u202e reversed"
        )

        def reasons() -> dict[str, str]:
            raw = state.get_redis().hgetall(SKIPPED)
            return {mapping.dn_normal(k.decode()): v.decode() for k, v in raw.items()}

        assert wait_until(
            lambda: {mapping.dn_normal(bad_name), mapping.dn_normal(bad_text)} <= set(reasons()),
            timeout=10,
        ), platform.logs()
        assert "NUL" in reasons()[mapping.dn_normal(bad_text)]
        assert _topic(f"{dir_root}:NulText") is None
        assert platform.procs["directory"].poll() is None
    finally:
        for dn in (bad_name, bad_text, fine):
            _wipe(conn, dn)
        conn.unbind_s()


def test_a_topic_entry_moved_out_of_the_topics_subtree_is_no_longer_a_topic(
    platform, ldap_directory, db_access, dir_root
):
    path = f"{dir_root}:Escapee"
    ldif(
        ldap_directory,
        f"dn: {topic_dn(path)}\nobjectClass: hpwsnTopic\ncn: Escapee\nhpwsnTopicName: Escapee\n"
        f"\ndn: {topic_dn(path + ':Inner')}\nobjectClass: hpwsnTopic\ncn: Inner\n"
        "hpwsnTopicName: Inner\n",
        tool="ldapadd",
    )
    outside = "cn=Escapee,dc=hpwsn,dc=local"
    try:
        assert wait_until(lambda: _topic(f"{path}:Inner") is not None, timeout=10)
        ldif(
            ldap_directory,
            f"dn: {topic_dn(path)}\nchangetype: modrdn\nnewrdn: cn=Escapee\ndeleteoldrdn: 1\n"
            "newsuperior: dc=hpwsn,dc=local\n",
        )
        assert wait_until(lambda: _topic(path) is None, timeout=10), platform.logs()
        assert _topic(f"{path}:Inner") is None
    finally:
        conn = admin_conn(ldap_directory)
        _wipe(conn, outside)
        _wipe(conn, topic_dn(path))
        conn.unbind_s()
