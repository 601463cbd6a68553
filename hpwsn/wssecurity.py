"""Caller credentials: WS-Security UsernameToken (Profile 1.0) and HTTP Basic. Pure Python.

A PasswordDigest is Base64(SHA-1(nonce + created + password)) with the nonce decoded from
Base64 (UsernameToken Profile 1.0, section 3.1). A digest is only as good as its freshness and
its nonce's uniqueness, so a digest token must carry both; the caller of this module keeps the
nonces it has seen (nonce_first_use) for as long as a Created time stays acceptable.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from lxml import etree

from hpwsn import ns
from hpwsn.xsdtime import TimeValueError, parse_datetime

_UTP = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-username-token-profile-1.0"
PASSWORD_TEXT = f"{_UTP}#PasswordText"
PASSWORD_DIGEST = f"{_UTP}#PasswordDigest"
BASE64_BINARY = (
    "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-soap-message-security-1.0#Base64Binary"
)

WSSE = f"{{{ns.WSSE}}}"
WSU = f"{{{ns.WSU}}}"
# Tokens of other profiles: refused by name rather than silently treated as anonymous.
_OTHER_TOKENS = {
    f"{WSSE}BinarySecurityToken",
    f"{WSSE}SecurityTokenReference",
    "{http://www.w3.org/2000/09/xmldsig#}Signature",
    "{http://www.w3.org/2001/04/xmlenc#}EncryptedKey",
    "{urn:oasis:names:tc:SAML:1.0:assertion}Assertion",
    "{urn:oasis:names:tc:SAML:2.0:assertion}Assertion",
}
MAX_FIELD = 1024  # characters of a user name or password
MAX_NONCE_BYTES = 128

METHOD_TEXT = "wsse-text"
METHOD_DIGEST = "wsse-digest"
METHOD_BASIC = "basic"


class SecurityFault(Exception):
    """Refused credentials; `code` is the WS-Security fault's local name (wsse:<code>)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def failed(message: str) -> SecurityFault:
    return SecurityFault("FailedAuthentication", message)


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str  # the password (text, Basic) or the Base64 digest (digest)
    method: str  # METHOD_TEXT, METHOD_DIGEST or METHOD_BASIC
    nonce: bytes | None = None
    created: str | None = None

    @property
    def is_digest(self) -> bool:
        return self.method == METHOD_DIGEST

    def cache_key(self, salt: bytes) -> bytes:
        """A key for verified credentials that does not keep the password in memory."""
        text = f"{self.method}\0{self.username}\0{self.password}".encode()
        return hashlib.sha256(salt + text).digest()


def _text(el: etree._Element | None, what: str, *, required: bool = True) -> str | None:
    if el is None:
        if required:
            raise SecurityFault("InvalidSecurityToken", f"the UsernameToken has no {what}")
        return None
    value = (el.text or "").strip()
    if len(value) > MAX_FIELD:
        raise SecurityFault("InvalidSecurityToken", f"the UsernameToken's {what} is too long")
    return value


def _one(parent: etree._Element, tag: str, what: str) -> etree._Element | None:
    found = parent.findall(tag)
    if len(found) > 1:
        raise SecurityFault("InvalidSecurityToken", f"the UsernameToken has {len(found)} {what}")
    return found[0] if found else None


def _nonce(el: etree._Element | None) -> bytes | None:
    if el is None:
        return None
    encoding = el.get("EncodingType") or BASE64_BINARY
    if not encoding.endswith("#Base64Binary"):
        raise SecurityFault("UnsupportedSecurityToken", f"Nonce EncodingType {encoding}")
    try:
        nonce = base64.b64decode((el.text or "").strip(), validate=True)
    except (binascii.Error, ValueError):
        raise SecurityFault("InvalidSecurityToken", "the Nonce is not valid Base64") from None
    if not 0 < len(nonce) <= MAX_NONCE_BYTES:
        raise SecurityFault("InvalidSecurityToken", "the Nonce is empty or too long")
    return nonce


def parse_security_header(security: etree._Element) -> Credentials | None:
    """The UsernameToken of a wsse:Security header; None when it carries no token at all."""
    tokens = security.findall(f"{WSSE}UsernameToken")
    if len(tokens) > 1:
        raise SecurityFault("InvalidSecurity", "the Security header has several UsernameTokens")
    if not tokens:
        for child in security:
            if isinstance(child.tag, str) and child.tag in _OTHER_TOKENS:
                raise SecurityFault(
                    "UnsupportedSecurityToken",
                    f"{etree.QName(child).localname} is not supported; use a UsernameToken",
                )
        return None  # e.g. a wsu:Timestamp alone: no claim of identity
    token = tokens[0]
    username = _text(_one(token, f"{WSSE}Username", "Usernames"), "Username")
    password_el = _one(token, f"{WSSE}Password", "Passwords")
    password = _text(password_el, "Password")
    if not username or not password:
        raise failed("the UsernameToken has an empty Username or Password")
    assert password_el is not None
    kind = (password_el.get("Type") or PASSWORD_TEXT).strip()
    nonce = _nonce(_one(token, f"{WSSE}Nonce", "Nonces"))
    created = _text(_one(token, f"{WSU}Created", "Created times"), "Created", required=False)
    if kind.endswith("PasswordDigest"):
        if nonce is None or not created:
            raise SecurityFault(
                "InvalidSecurityToken", "a PasswordDigest needs a wsse:Nonce and a wsu:Created"
            )
        method = METHOD_DIGEST
    elif kind.endswith("PasswordText"):
        method = METHOD_TEXT
    else:
        raise SecurityFault("UnsupportedSecurityToken", f"password Type {kind}")
    return Credentials(username, password, method, nonce=nonce, created=created or None)


def parse_basic(authorization: str | None) -> Credentials | None:
    """The credentials of an `Authorization: Basic` header; None for no header or another scheme."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise failed("the Basic credentials are not valid Base64 of UTF-8 text") from None
    username, sep, password = decoded.partition(":")
    if not sep or not username or not password:
        raise failed("the Basic credentials need a user name and a password")
    if len(username) > MAX_FIELD or len(password) > MAX_FIELD:
        raise failed("the Basic credentials are too long")
    return Credentials(username, password, METHOD_BASIC)


def password_digest(nonce: bytes, created: str, password: str) -> str:
    """Base64(SHA-1(nonce + created + password)), the UsernameToken PasswordDigest."""
    digest = hashlib.sha1(nonce + created.encode() + password.encode(), usedforsecurity=False)
    return base64.b64encode(digest.digest()).decode()


def digest_matches(credentials: Credentials, secret: str) -> bool:
    """Constant-time comparison of a digest token with the one the secret gives."""
    assert credentials.nonce is not None
    assert credentials.created is not None
    expected = password_digest(credentials.nonce, credentials.created, secret)
    return hmac.compare_digest(expected.encode(), credentials.password.encode())


def check_created(created: str, *, now: datetime, max_age_s: float, max_skew_s: float) -> None:
    """Refuse a token created too long ago, or too far in the future (clock skew)."""
    try:
        when = parse_datetime(created)
    except TimeValueError:
        raise SecurityFault(
            "InvalidSecurityToken", f"Created '{created}' is not an xsd:dateTime"
        ) from None
    if when < now - timedelta(seconds=max_age_s):
        raise SecurityFault(
            "MessageExpired", f"the UsernameToken was created more than {max_age_s:g} s ago"
        )
    if when > now + timedelta(seconds=max_skew_s):
        raise SecurityFault("MessageExpired", "the UsernameToken's Created time is in the future")


def nonce_key(prefix: str, *, uid: str, nonce: bytes) -> str:
    """The replay key of a nonce: per canonical uid (as the directory spells it, not as sent)."""
    h = hashlib.sha256(uid.encode() + b"\0" + nonce).hexdigest()
    return f"{prefix}{h}"


async def nonce_first_use(redis: Any, key: str, *, ttl_s: float) -> bool:
    """Remember a nonce; False when it was already seen (a replayed token)."""
    return bool(await redis.set(key, b"1", nx=True, px=max(1, int(ttl_s * 1000))))
