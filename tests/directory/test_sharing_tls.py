"""Sites sharing their topic tree over TLS: real slapd, certificates made here.

a and b share with TLS (StartTLS on ldap://), each with a certificate signed by the federation's
CA. c shares with a without TLS: a's replicator account reads nothing over a connection without
TLS. d shares with b over TLS but trusts another CA: it refuses b's certificate, and sends no
password. e names a by an ldaps:// URL, on which a listens too.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from directory.slapdctl import Instance, Sharing, SharingError, SharingTLS
from tests.directory.helpers import entry, sites_running, topic_dn
from tests.directory.test_sharing import REPLICATOR_PASSWORD, add_topic, arrives
from tests.support import free_port, wait_until

pytestmark = pytest.mark.integration


def _key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return key


def _cert(
    path: Path,
    name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None = None,
) -> None:
    """A CA certificate (no issuer) or a server certificate for 127.0.0.1 signed by the issuer."""
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, signing_key = issuer or (name, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    cert = builder.sign(signing_key, hashes.SHA256())
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, SharingTLS]:  # type: ignore[no-untyped-def]
    """Each site's certificate and key; a, b and c trust the federation's CA, d another."""
    d = tmp_path_factory.mktemp("pki")
    cas = {}
    for ca in ("federation", "other"):
        key = _key(d / f"{ca}-ca.key")
        _cert(d / f"{ca}-ca.pem", f"{ca} CA", key)
        cas[ca] = key
    out = {}
    for site in "abcde":
        _cert(
            d / f"{site}.pem",
            f"site {site}",
            _key(d / f"{site}.key"),
            ("federation CA", cas["federation"]),
        )
        ca = "other" if site == "d" else "federation"
        out[site] = SharingTLS(cert=d / f"{site}.pem", key=d / f"{site}.key", ca=d / f"{ca}-ca.pem")
    return out


@pytest.fixture(scope="module")
def sites(tmp_path_factory, pki) -> Iterator[dict[str, Instance]]:  # type: ignore[no-untyped-def]
    ports = {name: free_port() for name in "abcde"}
    a_ldaps = free_port()
    url = {name: f"ldap://127.0.0.1:{port}/" for name, port in ports.items()}
    url["a-ldaps"] = f"ldaps://127.0.0.1:{a_ldaps}/"
    peers = {"a": ("b", "c"), "b": ("a", "d"), "c": ("a",), "d": ("b",), "e": ("a-ldaps",)}
    made: dict[str, Instance] = {}
    for server_id, name in enumerate("abcde", start=1):
        made[name] = Instance(
            data_dir=tmp_path_factory.mktemp(f"tls-site-{name}"),
            port=ports[name],
            sharing=Sharing(
                server_id=server_id,
                peers=tuple(url[p] for p in peers[name]),
                replicator_password=REPLICATOR_PASSWORD,
                tls=None if name == "c" else pki[name],
            ),
            ldaps_port=a_ldaps if name == "a" else None,
        )
    with sites_running(made):
        yield made


def test_sites_with_certificates_from_one_ca_share_over_tls(sites):
    a, b = sites["a"], sites["b"]
    add_topic(a, "OverTLS")
    assert arrives(b, topic_dn("OverTLS"))
    add_topic(b, "OverTLS:Back")
    assert arrives(a, topic_dn("OverTLS:Back"))
    assert "starttls=critical" in a.conf.read_text()


def test_a_peer_without_tls_reads_nothing_and_one_that_distrusts_the_certificate_takes_nothing(
    sites,
):
    a, b, c, d = sites["a"], sites["b"], sites["c"], sites["d"]
    add_topic(a, "NotInClear")
    assert arrives(b, topic_dn("NotInClear"))
    # c asks a without TLS: a's rules give its replicator nothing there. d refuses b's certificate
    # (another CA) before it binds. Neither gets the topic, given the time b took and more.
    assert not wait_until(
        lambda: entry(c, topic_dn("NotInClear")) or entry(d, topic_dn("NotInClear")),
        timeout=8,
        interval=0.2,
    )


def test_tls_settings_come_from_the_environment_whole(tmp_path, pki) -> None:
    tls = pki["a"]
    assert SharingTLS.from_env({}) is None
    env = {
        "HPWSN_DIRECTORY_TLS_CERT": str(tls.cert),
        "HPWSN_DIRECTORY_TLS_KEY": str(tls.key),
        "HPWSN_DIRECTORY_TLS_CA": str(tls.ca),
    }
    assert SharingTLS.from_env(env) == tls
    with pytest.raises(SharingError, match="needs all of"):
        SharingTLS.from_env({**env, "HPWSN_DIRECTORY_TLS_KEY": ""})
    with pytest.raises(SharingError, match="is not a file"):
        SharingTLS.from_env({**env, "HPWSN_DIRECTORY_TLS_CA": str(tmp_path / "missing.pem")})


def test_a_peer_may_name_a_site_by_its_ldaps_address(sites):
    a, e = sites["a"], sites["e"]
    add_topic(a, "OverLdaps")
    assert arrives(e, topic_dn("OverLdaps"))
    conf = e.conf.read_text()
    assert "provider=ldaps://127.0.0.1:" in conf
    assert "starttls" not in conf  # TLS from the first byte: nothing to start


def test_an_ldaps_listener_needs_the_tls_settings(tmp_path) -> None:
    site = Instance(data_dir=tmp_path / "slapd", port=free_port(), ldaps_port=free_port())
    with pytest.raises(SharingError, match="HPWSN_DIRECTORY_LDAPS_PORT needs"):
        site.prepare()
