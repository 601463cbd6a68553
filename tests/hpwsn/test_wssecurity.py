"""UsernameToken and HTTP Basic parsing, digests and freshness (pure, no servers)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from datetime import UTC, datetime, timedelta

import pytest
from lxml import etree
from zeep.wsse.username import UsernameToken

from hpwsn import ns, wssecurity
from hpwsn.soap import SoapFault, fault_envelope, security_fault
from hpwsn.wssecurity import SecurityFault

NOW = datetime(2026, 11, 21, 8, 0, tzinfo=UTC)


def security_of(token: UsernameToken) -> etree._Element:
    """The wsse:Security header zeep puts on an envelope."""
    envelope = etree.fromstring(
        f'<s:Envelope xmlns:s="{ns.SOAP11}"><s:Header/><s:Body><x/></s:Body></s:Envelope>'
    )
    envelope, _headers = token.apply(envelope, {})
    security = envelope.find(f".//{{{ns.WSSE}}}Security")
    assert security is not None
    return security


def security_xml(inner: str) -> etree._Element:
    return etree.fromstring(
        f'<wsse:Security xmlns:wsse="{ns.WSSE}" xmlns:wsu="{ns.WSU}">{inner}</wsse:Security>'
    )


def test_it_reads_a_text_password_as_zeep_sends_it() -> None:
    creds = wssecurity.parse_security_header(security_of(UsernameToken("publisher1", "s3cret")))

    assert creds is not None
    assert (creds.username, creds.password, creds.method) == ("publisher1", "s3cret", "wsse-text")
    assert not creds.is_digest


def test_a_zeep_digest_token_matches_the_secret_it_was_made_with() -> None:
    creds = wssecurity.parse_security_header(
        security_of(UsernameToken("publisher1", "s3cret", use_digest=True))
    )

    assert creds is not None
    assert creds.is_digest
    assert creds.nonce
    assert creds.created
    assert wssecurity.digest_matches(creds, "s3cret")
    assert not wssecurity.digest_matches(creds, "other")


def test_the_digest_is_base64_of_sha1_over_nonce_created_and_password() -> None:
    # The example of the UsernameToken Profile: nonce, created and password concatenated.
    nonce = base64.b64decode("WScqanjCEAC4mQoBE07sAQ==")
    created = "2003-07-16T01:24:32Z"
    expected = base64.b64encode(
        hashlib.sha1(nonce + created.encode() + b"pw", usedforsecurity=False).digest()
    ).decode()

    assert wssecurity.password_digest(nonce, created, "pw") == expected


def test_a_password_without_type_is_a_text_password() -> None:
    sec = security_xml(
        "<wsse:UsernameToken><wsse:Username>u</wsse:Username>"
        "<wsse:Password>p</wsse:Password></wsse:UsernameToken>"
    )

    creds = wssecurity.parse_security_header(sec)

    assert creds is not None
    assert creds.method == "wsse-text"


def test_a_security_header_without_token_claims_no_identity() -> None:
    sec = security_xml(
        "<wsu:Timestamp><wsu:Created>2026-11-21T08:00:00Z</wsu:Created></wsu:Timestamp>"
    )

    assert wssecurity.parse_security_header(sec) is None


@pytest.mark.parametrize(
    ("inner", "code"),
    [
        (
            "<wsse:UsernameToken><wsse:Password>p</wsse:Password></wsse:UsernameToken>",
            "InvalidSecurityToken",
        ),
        (
            "<wsse:UsernameToken><wsse:Username>u</wsse:Username><wsse:Password "
            f'Type="{wssecurity.PASSWORD_DIGEST}">x</wsse:Password></wsse:UsernameToken>',
            "InvalidSecurityToken",
        ),
        (
            "<wsse:UsernameToken><wsse:Username>u</wsse:Username>"
            '<wsse:Password Type="urn:other#Kerberos">x</wsse:Password></wsse:UsernameToken>',
            "UnsupportedSecurityToken",
        ),
        (
            "<wsse:UsernameToken><wsse:Username>u</wsse:Username><wsse:Password>p</wsse:Password>"
            "<wsse:Nonce>not base64!</wsse:Nonce></wsse:UsernameToken>",
            "InvalidSecurityToken",
        ),
        (
            "<wsse:UsernameToken><wsse:Username>u</wsse:Username>"
            "<wsse:Password></wsse:Password></wsse:UsernameToken>",
            "FailedAuthentication",
        ),
        ("<wsse:BinarySecurityToken>AAAA</wsse:BinarySecurityToken>", "UnsupportedSecurityToken"),
        (
            "<wsse:UsernameToken><wsse:Username>a</wsse:Username><wsse:Password>p</wsse:Password>"
            "</wsse:UsernameToken><wsse:UsernameToken><wsse:Username>b</wsse:Username>"
            "<wsse:Password>p</wsse:Password></wsse:UsernameToken>",
            "InvalidSecurity",
        ),
    ],
    ids=["no-username", "digest-without-nonce", "unknown-type", "bad-nonce", "empty-password",
         "binary-token", "two-tokens"],
)  # fmt: skip
def test_it_refuses_malformed_tokens_with_the_ws_security_fault_code(inner: str, code: str) -> None:
    with pytest.raises(SecurityFault) as caught:
        wssecurity.parse_security_header(security_xml(inner))

    assert caught.value.code == code


def test_it_reads_http_basic_credentials() -> None:
    header = "Basic " + base64.b64encode(b"publisher1:pa:ss").decode()

    creds = wssecurity.parse_basic(header)

    assert creds is not None
    assert (creds.username, creds.password, creds.method) == ("publisher1", "pa:ss", "basic")


@pytest.mark.parametrize("header", [None, "", "Bearer abc", "Digest username=x"])
def test_no_basic_header_means_no_credentials(header: str | None) -> None:
    assert wssecurity.parse_basic(header) is None


@pytest.mark.parametrize(
    "header",
    ["Basic !!!", "Basic " + base64.b64encode(b"nopassword").decode(), "Basic " + "Og=="],
)
def test_malformed_basic_credentials_fail_authentication(header: str) -> None:
    with pytest.raises(SecurityFault) as caught:
        wssecurity.parse_basic(header)

    assert caught.value.code == "FailedAuthentication"


def test_a_token_created_within_the_window_is_fresh() -> None:
    created = (NOW - timedelta(seconds=299)).isoformat().replace("+00:00", "Z")

    wssecurity.check_created(created, now=NOW, max_age_s=300, max_skew_s=60)


@pytest.mark.parametrize("offset", [-301, 61])
def test_a_token_too_old_or_from_the_future_has_expired(offset: int) -> None:
    created = (NOW + timedelta(seconds=offset)).isoformat()

    with pytest.raises(SecurityFault) as caught:
        wssecurity.check_created(created, now=NOW, max_age_s=300, max_skew_s=60)

    assert caught.value.code == "MessageExpired"


def test_different_credentials_have_different_cache_keys() -> None:
    salt = b"salt"
    a = wssecurity.Credentials("u", "p1", "basic").cache_key(salt)
    b = wssecurity.Credentials("u", "p2", "basic").cache_key(salt)
    c = wssecurity.Credentials("u", "p1", "wsse-text").cache_key(salt)

    assert len({a, b, c}) == 3
    assert b"p1" not in a


class FakeRedis:
    """SET NX semantics only (the integration tests use the real Redis)."""

    def __init__(self) -> None:
        self.keys: set[str] = set()

    async def set(self, key: str, value: bytes, *, nx: bool, px: int) -> bool | None:
        if key in self.keys:
            return None
        self.keys.add(key)
        return True


def test_a_nonce_is_accepted_once_per_user() -> None:
    r = FakeRedis()
    token = wssecurity.Credentials("u", "d", "wsse-digest", nonce=b"n1", created="x")
    other_user = wssecurity.Credentials("v", "d", "wsse-digest", nonce=b"n1", created="x")

    async def uses() -> list[bool]:
        return [
            await wssecurity.nonce_first_use(
                r, wssecurity.nonce_key("p:", uid=c.username, nonce=c.nonce or b""), ttl_s=1
            )
            for c in (token, token, other_user)
        ]

    assert asyncio.run(uses()) == [True, False, True]


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_failed_authentication_is_the_ws_security_fault_code(version: str) -> None:
    fault = security_fault("FailedAuthentication", "authentication failed for 'x'")

    root = etree.fromstring(fault_envelope(fault, version=version))

    if version == "1.1":
        code = root.find(".//faultcode")
        assert code is not None
        prefix, _, local = (code.text or "").partition(":")
    else:
        code = root.find(f".//{{{ns.SOAP12}}}Subcode/{{{ns.SOAP12}}}Value")
        assert code is not None
        prefix, _, local = (code.text or "").partition(":")
        value = root.find(f".//{{{ns.SOAP12}}}Code/{{{ns.SOAP12}}}Value")
        assert value is not None
        assert value.text == "soap:Sender"
    assert code.nsmap[prefix] == ns.WSSE
    assert local == "FailedAuthentication"


def test_refused_basic_credentials_ask_for_basic_authentication() -> None:
    fault = security_fault("FailedAuthentication", "no", http_status=401)

    assert isinstance(fault, SoapFault)
    assert fault.http_status == 401
    assert dict(fault.http_headers)["WWW-Authenticate"].startswith("Basic ")
