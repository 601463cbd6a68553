"""Pushes over TLS to two names served at one address: each connection carries only its name.

One real TLS server on 127.0.0.1 serves `localhost` and `127.0.0.1` with a certificate each
(chosen by SNI), signed by a CA made here; the push client trusts that CA (SSL_CERT_FILE).
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dispatch import push
from hpwsn.targets import TargetPolicy

NAMES = ("localhost", "127.0.0.1")


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
    )
    if issuer is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), True)
    else:
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(subject))
        except ValueError:
            san = x509.DNSName(subject)
        builder = builder.add_extension(x509.SubjectAlternativeName([san]), False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


class TwoNameServer:
    """HTTPS on one port; records (SNI of the connection, Host header) per request."""

    def __init__(self, tmp: Path) -> None:
        ca_key = _key()
        ca = _cert("HPwsn test CA", ca_key, None, ca_key)
        self.ca_file = tmp / "ca.pem"
        self.ca_file.write_bytes(_pem(ca))
        self.contexts: dict[str, ssl.SSLContext] = {}
        for name in NAMES:
            key = _key()
            (tmp / f"{name}.pem").write_bytes(
                _pem(_cert(name, key, ca, ca_key))
                + key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(tmp / f"{name}.pem")
            self.contexts[name] = ctx
        self.sni: dict[int, str] = {}
        self.requests: list[tuple[str, str]] = []
        server = self

        def choose(sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
            # No SNI: an IP literal (RFC 6066 forbids addresses in SNI).
            chosen = name or "127.0.0.1"
            server.sni[id(sock)] = chosen
            sock.context = server.contexts[chosen]

        front = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        front.load_cert_chain(tmp / "localhost.pem")
        front.sni_callback = choose

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
                server.requests.append((server.sni.get(id(self.request), "?"), host))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.socket = front.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path, monkeypatch) -> Iterator[TwoNameServer]:  # type: ignore[no-untyped-def]
    srv = TwoNameServer(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(srv.ca_file))
    monkeypatch.setattr(push, "_policy", TargetPolicy(["127.0.0.0/8"]))
    monkeypatch.setattr(push, "_clients", type(push._clients)())
    yield srv
    for held in push._clients.values():
        held.client.close()
    srv.stop()


def test_a_connection_opened_for_one_name_never_carries_a_push_for_another(server):
    for _ in range(3):
        for name in NAMES:
            outcome = push.post(
                f"https://{name}:{server.port}/consumer", b"<x/>", soap_version="1.1"
            )
            assert outcome.ok, outcome.detail

    assert len(server.requests) == 6
    assert [sni for sni, host in server.requests if sni != host] == []


def test_the_pools_of_every_name_share_one_tls_context(server, monkeypatch):
    """Each context loads the CA bundle (20-40 ms): one for all, also for a pool made again
    after it was dropped for room."""
    made: list[ssl.SSLContext] = []
    real = ssl.create_default_context

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(ssl, "create_default_context", counted)
    monkeypatch.setattr(push, "_tls", None)
    monkeypatch.setattr(push, "MAX_CLIENTS", 1)
    for _ in range(2):
        for name in NAMES:
            outcome = push.post(f"https://{name}:{server.port}/c", b"<x/>", soap_version="1.1")
            assert outcome.ok, outcome.detail
    assert len(server.requests) == 4
    assert len(made) == 1
