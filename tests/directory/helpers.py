"""Working on the test slapd as its administrator would: ldapadd / ldapmodify / ldapdelete."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import httpx
import ldap
from lxml import etree

from directory.slapdctl import ssha
from hpwsn import ns
from tests.support import CT, SoapResult, soap_call

BASE = "dc=hpwsn,dc=local"
BR = f'xmlns:wsnbr="{ns.WSNBR}"'
TOPICS = f"ou=topics,{BASE}"
SUBSCRIPTIONS = f"ou=subscriptions,{BASE}"


def ldif(directory: Any, text: str, *, tool: str = "ldapmodify", check: bool = True) -> str:
    """Feed LDIF to the real OpenLDAP client tool as the directory manager."""
    cmd = [
        tool,
        "-x",
        "-H",
        directory.url,
        "-D",
        directory.admin_dn,
        "-w",
        directory.admin_password,
    ]
    proc = subprocess.run(
        cmd, input=text.strip() + "\n", capture_output=True, text=True, timeout=30
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{tool} failed ({proc.returncode}): {proc.stderr}")
    return proc.stdout + proc.stderr


def ldapdelete(directory: Any, *dns: str) -> None:
    cmd = ["ldapdelete", "-x", "-H", directory.url, "-D", directory.admin_dn]
    cmd += ["-w", directory.admin_password, *dns]
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def admin_conn(directory: Any) -> Any:
    conn = ldap.initialize(directory.url)
    conn.set_option(ldap.OPT_NETWORK_TIMEOUT, 5)
    conn.simple_bind_s(directory.admin_dn, directory.admin_password)
    return conn


def entry(directory: Any, dn: str) -> dict[str, list[str]] | None:
    """The entry's attributes as text, or None when it does not exist."""
    conn = admin_conn(directory)
    try:
        res = conn.search_s(dn, ldap.SCOPE_BASE, "(objectClass=*)")
    except ldap.NO_SUCH_OBJECT:
        return None
    finally:
        conn.unbind_s()
    return {k: [v.decode() for v in vals] for k, vals in res[0][1].items()}


def topic_dn(path: str) -> str:
    return ",".join(f"cn={name}" for name in reversed(path.split(":"))) + "," + TOPICS


def subscription_dn(sub_id: str) -> str:
    return f"hpwsnSubscriptionId={sub_id},{SUBSCRIPTIONS}"


@contextmanager
def sync_process_stopped(platform: Any) -> Iterator[None]:
    """Stop the platform's directory_sync process for a while (it starts again afterwards)."""
    from tests.conftest import ROOT

    proc = platform.procs["directory"]
    proc.terminate()
    proc.wait(timeout=10)
    try:
        yield
    finally:
        log = open(platform.log_dir / "directory.log", "ab")  # noqa: SIM115 - lives with it
        platform.procs["directory"] = subprocess.Popen(
            proc.args,
            cwd=str(ROOT),
            env=platform.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def subscription_id(result: Any) -> str:
    """The subscription id in a SubscribeResponse's SubscriptionReference address."""
    address = result.findtext(".//wsnt:SubscriptionReference/wsa:Address")
    assert address, result.body
    return str(address.rstrip("/").rsplit("/", 1)[1])


def subscribe_written(
    platform: Any, directory: Any, consumer_url: str, topic: str
) -> tuple[str, str]:
    """Subscribe over SOAP; wait until the directory holds the entry and no write is pending.
    Returns the subscription's id and DN."""
    from directory.models import SubscriptionWrite
    from tests.support import soap_call, subscribe_xml, wait_until

    res = soap_call(platform.endpoint, subscribe_xml(consumer_url, topic))
    assert res.status == 200, res.body
    sub_id = subscription_id(res)
    dn = subscription_dn(sub_id)
    assert wait_until(lambda: entry(directory, dn) is not None, timeout=10), platform.logs()
    assert wait_until(lambda: not SubscriptionWrite.objects.filter(subscription_id=sub_id).exists())
    return sub_id, dn


def soap_as(url: str, body: str, auth: tuple[str, str] | None = None) -> SoapResult:
    """A SOAP 1.1 call, with HTTP Basic credentials when given."""
    if auth is None:
        return soap_call(url, body)
    envelope = (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}">'
        f"<s:Body>{body}</s:Body></s:Envelope>"
    )
    resp = httpx.post(
        url, content=envelope.encode(), headers={"Content-Type": CT["1.1"]}, auth=auth, timeout=30
    )
    return SoapResult(resp.status_code, resp.content, etree.fromstring(resp.content))


def register(  # type: ignore[no-untyped-def]
    platform, publisher: str, topic: str, *, termination: str = "", auth=None
) -> tuple[str, str]:
    """RegisterPublisher over SOAP; returns the registration's id and reference address."""
    ends = (
        f"<wsnbr:InitialTerminationTime>{termination}</wsnbr:InitialTerminationTime>"
        if termination
        else ""
    )
    res = soap_as(
        platform.endpoint,
        f"<wsnbr:RegisterPublisher {BR}><wsnbr:PublisherReference><wsa:Address>{publisher}"
        f"</wsa:Address></wsnbr:PublisherReference>"
        f'<wsnbr:Topic Dialect="{ns.DIALECT_SIMPLE}">{topic}</wsnbr:Topic>{ends}'
        "</wsnbr:RegisterPublisher>",
        auth,
    )
    assert res.status == 200, res.body
    address = res.findtext(f".//{{{ns.WSNBR}}}PublisherRegistrationReference/wsa:Address")
    assert address, res.body
    return address.rstrip("/").rsplit("/", 1)[1], address


@contextmanager
def sites_running(sites: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Prepare and start each site's slapd (`directory.slapdctl.Instance`); stop them all after."""
    try:
        for inst in sites.values():
            inst.prepare()
            inst.start()
        yield sites
    finally:
        for inst in sites.values():
            inst.stop()


def reconcile_output(*args: str) -> str:
    """What `manage.py directory_reconcile ARGS` prints, run in process."""
    import io

    from django.core.management import call_command

    out = io.StringIO()
    call_command("directory_reconcile", *args, stdout=out)
    return out.getvalue()


@contextmanager
def directory_person(directory: Any, password: str, *groups: str) -> Iterator[str]:
    """A person of its own (uid returned) in these groups, removed afterwards if still there."""
    uid = f"person{uuid.uuid4().hex[:8]}"
    dn = f"uid={uid},ou=people,{BASE}"
    ldif(
        directory,
        f"dn: {dn}\nobjectClass: inetOrgPerson\nobjectClass: hpwsnPerson\nuid: {uid}\n"
        f"cn: {uid}\nsn: {uid}\nuserPassword: {ssha(password)}\n",
        tool="ldapadd",
    )

    def member(group: str, change: str) -> str:
        group_dn = f"cn={group},ou=groups,{BASE}"
        return f"dn: {group_dn}\nchangetype: modify\n{change}: member\nmember: {dn}"

    for group in groups:
        ldif(directory, member(group, "add"))
    try:
        yield uid
    finally:
        for group in groups:
            ldif(directory, member(group, "delete"), check=False)
        with suppress(subprocess.CalledProcessError):  # removed by the test
            ldapdelete(directory, dn)
