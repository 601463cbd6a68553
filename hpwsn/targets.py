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
from urllib.parse import urlsplit

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
DEFAULT_ALLOW = ("127.0.0.0/8", "::1/128")


class TargetRefused(ValueError):
    """The URL may not be pushed to; the message says why."""


def system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise TargetRefused(f"host '{host}' does not resolve: {exc.strerror}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


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
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise TargetRefused(f"'{url}' is not an http(s) URL")
        host = (parts.hostname or "").lower()
        if not host:
            raise TargetRefused(f"'{url}' has no host")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise TargetRefused(f"'{url}' has an invalid port") from None
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
            if any(addr in net for net in ALWAYS_REFUSED):
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
