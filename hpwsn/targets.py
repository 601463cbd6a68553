"""Which push targets the broker may connect to: an allow-list checked after DNS resolution.

Consumer URLs come from subscribers, so an unchecked push is a request forgery tool aimed at the
broker's own network. Every address a host name resolves to must be inside the allow-list, and
link-local, cloud-metadata, multicast and unspecified addresses are refused whatever the list says.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]

ALWAYS_REFUSED = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",  # "this network"
        "169.254.0.0/16",  # link-local, including 169.254.169.254 (cloud metadata)
        "100.100.100.200/32",  # Alibaba Cloud metadata
        "224.0.0.0/4",  # multicast
        "255.255.255.255/32",
        "::/128",
        "fe80::/10",  # IPv6 link-local
        "fd00:ec2::254/128",  # AWS metadata over IPv6
        "ff00::/8",  # IPv6 multicast
    )
)
# IPv6 spellings of an IPv4 address that a tunnel or a translator on the way (sit, a 6to4 relay,
# NAT64, SIIT) turns back into that IPv4 address: an always-refused one is refused in them too.
_EMBEDDING_V4 = tuple(
    ipaddress.ip_network(n)
    for n in (
        "::/96",  # IPv4-compatible (RFC 4291, deprecated)
        "::ffff:0:0:0/96",  # IPv4-translated (RFC 2765, SIIT)
        "64:ff9b::/96",  # NAT64 well-known prefix (RFC 6052)
        "64:ff9b:1::/48",  # NAT64 local-use prefix (RFC 8215)
    )
)
DEFAULT_ALLOW = ("127.0.0.0/8", "::1/128")
MAX_URL_CHARS = 2048
MAX_HOST_CHARS = 253  # RFC 1035: a name of 255 octets on the wire, 253 characters written
MAX_LABEL_CHARS = 63


class TargetRefused(ValueError):
    """The URL may not be pushed to; the message says why."""


def system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise TargetRefused(f"host '{host}' does not resolve: {exc.strerror}") from None
    except UnicodeError as exc:  # the IDNA codec, on a name validate_url did not see
        raise TargetRefused(f"host name '{host[:80]}' is not a valid IDNA name: {exc}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _shown(url: str) -> str:
    """The URL as a fault may quote it: bounded, control characters escaped."""
    text = url if len(url) <= 120 else url[:120] + "..."
    return text.encode("unicode_escape").decode("ascii")


def validate_url(url: str) -> None:
    """Refuse a URL no HTTP client should be handed: TargetRefused naming the first problem.

    Checked before DNS: a control character would split the request line or a header (CR/LF),
    and the IDNA codec raises UnicodeError, not a refusal, on a host name over 253 characters
    or a label over 63.
    """
    for i, ch in enumerate(url):
        if ord(ch) < 0x21 or ord(ch) == 0x7F:
            raise TargetRefused(
                f"'{_shown(url)}' contains the control or space character U+{ord(ch):04X} "
                f"at position {i}"
            )
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port that is not a number in range
    except ValueError as exc:
        raise TargetRefused(
            f"'{_shown(url)}' is not a valid URL (invalid port or host): {exc}"
        ) from None
    if port == 0:  # read as "no port" below, it was pushed to the scheme's default port
        raise TargetRefused(f"'{_shown(url)}' names port 0, which no server listens on")
    if parts.scheme not in ("http", "https"):
        raise TargetRefused(f"'{_shown(url)}' is not an http(s) URL")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise TargetRefused(f"'{_shown(url)}' has no host")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        _check_host_name(host)
    if len(url) > MAX_URL_CHARS:
        raise TargetRefused(f"the URL has {len(url)} characters; at most {MAX_URL_CHARS}")


def _check_host_name(host: str) -> None:
    if len(host) > MAX_HOST_CHARS:
        raise TargetRefused(
            f"the host name has {len(host)} characters; at most {MAX_HOST_CHARS} (RFC 1035)"
        )
    for label in host.split("."):
        if not label or len(label) > MAX_LABEL_CHARS:
            raise TargetRefused(
                f"the host name label '{_shown(label[:70])}' is empty or longer than "
                f"{MAX_LABEL_CHARS} characters (RFC 1035)"
            )
    try:
        host.encode("idna")
    except UnicodeError as exc:
        raise TargetRefused(
            f"the host name '{_shown(host)}' is not a valid IDNA name: {exc}"
        ) from None


@dataclass(frozen=True, slots=True)
class Target:
    scheme: str
    host: str
    port: int
    addresses: tuple[str, ...]  # every address the host resolved to, all allowed


class TargetPolicy:
    """`allow` holds CIDR networks ("10.1.0.0/16"), host names ("consumer.example.com") and
    domain suffixes (".example.com"); a host allowed by name must still resolve to addresses
    that are not always refused."""

    def __init__(self, allow: Iterable[str] = DEFAULT_ALLOW, *, resolver: Resolver | None = None):
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        self.names: set[str] = set()
        self.suffixes: list[str] = []
        for entry in (e.strip().lower() for e in allow):
            if not entry:
                continue
            if entry == "*":
                self.networks += [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]
                continue
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                if entry.startswith("."):
                    self.suffixes.append(entry)
                else:
                    self.names.add(entry)
        self.resolve = resolver or system_resolver

    def _name_allowed(self, host: str) -> bool:
        return host in self.names or any(host.endswith(s) for s in self.suffixes)

    def check(self, url: str) -> Target:
        """The resolved target of `url`, or TargetRefused naming the reason."""
        validate_url(url)
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            literal: IPAddress | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        addresses = [str(literal)] if literal else self.resolve(host, port)
        if not addresses:
            raise TargetRefused(f"host '{host}' resolves to no address")
        by_name = literal is None and self._name_allowed(host)
        for raw in addresses:
            addr = ipaddress.ip_address(raw.split("%", 1)[0])
            mapped = getattr(addr, "ipv4_mapped", None)
            addr = mapped or addr
            if any(_embedded_v4(addr) in net for net in ALWAYS_REFUSED):
                raise TargetRefused(
                    f"'{host}' resolves to {addr}, a link-local, metadata or multicast address, "
                    "which is always refused"
                )
            if not by_name and not any(addr in net for net in self.networks):
                raise TargetRefused(
                    f"'{host}' resolves to {addr}, which is outside the push allow-list "
                    "(HPWSN_PUSH_ALLOW)"
                )
        return Target(parts.scheme, host, port, tuple(addresses))


def _embedded_v4(addr: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries in a tunnelled or translated spelling, else itself
    (the unspecified and loopback addresses ::/127 are IPv6's own)."""
    if addr.version == 4 or int(addr) <= 1:
        return addr
    six_to_four = getattr(addr, "sixtofour", None)  # 2002:AABB:CCDD::/48, 6to4 (RFC 3056)
    if six_to_four is not None:
        return six_to_four
    if any(addr in net for net in _EMBEDDING_V4):
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return addr


def same_endpoint(a: Target, b: Target) -> bool:
    """True if a connection to `a` reaches the server listening at `b` (one port, one host).

    Loopback addresses are one host whatever their spelling (127.0.0.1, 127.0.1.1, ::1, localhost).
    """
    if a.port != b.port:
        return False
    if a.host == b.host:
        return True
    ips_a = {_plain(x) for x in a.addresses}
    ips_b = {_plain(x) for x in b.addresses}
    if ips_a & ips_b:
        return True
    return any(x.is_loopback for x in ips_a) and any(x.is_loopback for x in ips_b)


def _plain(raw: str) -> IPAddress:
    addr = ipaddress.ip_address(raw.split("%", 1)[0])
    return getattr(addr, "ipv4_mapped", None) or addr


class CheckedTransport(httpx.HTTPTransport):
    """An httpx transport whose connections go only to an address `check` allowed: the address
    it resolved, not one the name resolves to again when the connection is made (a name that
    answers an allowed address to the check and another to the connect is rebinding). Redirects
    are the client's (httpx follows none by default); proxies from the environment are not used.
    """

    def __init__(self, check: Callable[[str], Target], **kwargs: Any) -> None:
        super().__init__(trust_env=False, **kwargs)
        # httpx takes no network backend of its own; its connection pool does.
        self._pool._network_backend = _CheckedBackend(check)


class _CheckedBackend(httpcore.SyncBackend):
    def __init__(self, check: Callable[[str], Target]) -> None:
        self._check = check

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, *args: Any, **kwargs: Any
    ) -> httpcore.NetworkStream:
        try:
            target = self._check(
                f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
            )
        except TargetRefused as exc:
            raise httpcore.ConnectError(str(exc)) from None
        return super().connect_tcp(target.addresses[0], port, timeout, *args, **kwargs)
