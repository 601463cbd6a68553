"""HPwsn's own slapd instance: render its config into a data dir, seed it, run it (no Django).

Used by scripts/run.sh (`python -m directory.slapdctl prepare ...`, then slapd in the foreground)
and by the test suite's session fixture. Debian's packaged /etc/ldap/slapd.d is never touched: the
instance runs as the current user from `<data dir>/slapd.conf` on a port of its own.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

FILES = Path(__file__).resolve().parent / "slapd"
DEMO_USERS = ("admin1", "operator1", "analyst1", "publisher1", "subscriber1")
# The demo people's password, published in the README: fit for a directory reached from this
# machine only (_main refuses to serve it further).
DEMO_PASSWORD = "hpwsn-demo"  # noqa: S105
# The seeded topic entries get an entryUUID derived from their DN, and this entryCSN (older than
# any change), so that every site's demo tree is the same entries: sites that share their topic
# trees then agree on it instead of holding one DN under two entryUUIDs.
SEED_UUID_NAMESPACE = uuid.UUID("5b0f7a2e-3c1d-4d8e-9a57-6f2c0b1e4d90")
SEED_CSN = "20000101000000.000000Z#000000#000#000000"
SHARE_RETRY = "5 +"  # syncrepl: reconnect to a peer every 5 s, for ever


class SharingError(ValueError):
    """The topic tree sharing settings are incomplete or malformed; the message says which."""


@dataclass(frozen=True)
class SharingTLS:
    """TLS between sharing sites: this slapd's certificate and key, and the CA that signed the
    peers' certificates. With it, replication goes over TLS only (StartTLS on ldap:// peers)."""

    cert: Path
    key: Path
    ca: Path

    def __post_init__(self) -> None:
        for name, path in (("CERT", self.cert), ("KEY", self.key), ("CA", self.ca)):
            if not path.is_file():
                raise SharingError(f"HPWSN_DIRECTORY_TLS_{name}: {str(path)!r} is not a file")
            if any(c in str(path) for c in '"\\\r\n'):
                raise SharingError(f"HPWSN_DIRECTORY_TLS_{name}: {str(path)!r} is not plain")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SharingTLS | None:
        names = ("HPWSN_DIRECTORY_TLS_CERT", "HPWSN_DIRECTORY_TLS_KEY", "HPWSN_DIRECTORY_TLS_CA")
        values = [environ.get(n, "").strip() for n in names]
        if not any(values):
            return None
        if not all(values):
            raise SharingError(f"TLS between sharing sites needs all of {', '.join(names)}")
        cert, key, ca = (Path(v).resolve() for v in values)
        return cls(cert=cert, key=key, ca=ca)

    def server_lines(self) -> str:
        return "\n".join(
            [
                f'TLSCACertificateFile "{self.ca}"',
                f'TLSCertificateFile "{self.cert}"',
                f'TLSCertificateKeyFile "{self.key}"',
            ]
        )


@dataclass(frozen=True)
class Sharing:
    """This site's part in sharing the topic tree: multi-provider syncrepl of ou=topics with the
    peers' slapd (docs/deployment.md, "Sharing the topic tree")."""

    server_id: int
    peers: tuple[str, ...]
    replicator_password: str
    tls: SharingTLS | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.server_id <= 4095:
            raise SharingError(
                f"HPWSN_DIRECTORY_SERVER_ID must be 1..4095 (unique per site), not {self.server_id}"
            )
        if not self.peers:
            raise SharingError("HPWSN_DIRECTORY_SHARE_WITH names no peer")
        if len(self.peers) > 999:
            raise SharingError("HPWSN_DIRECTORY_SHARE_WITH names more than 999 peers")
        for url in self.peers:
            parts = urlsplit(url)
            if parts.scheme not in ("ldap", "ldaps") or not parts.hostname:
                raise SharingError(
                    f"HPWSN_DIRECTORY_SHARE_WITH: {url!r} is not an ldap:// or ldaps:// URL"
                )
            if any(c in url for c in ' "\\') or parts.path not in ("", "/"):
                raise SharingError(f"HPWSN_DIRECTORY_SHARE_WITH: {url!r} is not host and port")
        if len({url.rstrip("/").lower() for url in self.peers}) != len(self.peers):
            raise SharingError("HPWSN_DIRECTORY_SHARE_WITH names a peer twice")
        if not self.replicator_password:
            raise SharingError(
                "HPWSN_DIRECTORY_SHARE_WITH is set: HPWSN_DIRECTORY_REPLICATOR_PASSWORD (or "
                "HPWSN_DIRECTORY_REPLICATOR_PASSWORD_FILE) must name the replicator's password, "
                "the same at every site that shares the topic tree; there is no default"
            )
        if any(c in self.replicator_password for c in "\r\n\0"):
            raise SharingError("HPWSN_DIRECTORY_REPLICATOR_PASSWORD must be one line")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Sharing | None:
        """The sharing settings of the environment; None when the site keeps its own tree."""
        peers = tuple(u.strip() for u in environ.get("HPWSN_DIRECTORY_SHARE_WITH", "").split(","))
        peers = tuple(u for u in peers if u)
        if not peers:
            return None
        raw_id = environ.get("HPWSN_DIRECTORY_SERVER_ID", "").strip()
        if not raw_id:
            raise SharingError(
                "HPWSN_DIRECTORY_SHARE_WITH is set: HPWSN_DIRECTORY_SERVER_ID must give this "
                "site's replica id, 1..4095, different at each site"
            )
        try:
            server_id = int(raw_id)
        except ValueError:
            raise SharingError(
                f"HPWSN_DIRECTORY_SERVER_ID must be an integer 1..4095, not {raw_id!r}"
            ) from None
        password = _env("HPWSN_DIRECTORY_REPLICATOR_PASSWORD", "", environ)
        return cls(
            server_id=server_id,
            peers=peers,
            replicator_password=password,
            tls=SharingTLS.from_env(environ),
        )

    def serverid_line(self) -> str:
        return f"serverID {self.server_id}"

    def syncrepl_lines(self, *, suffix: str, replicator_dn: str) -> str:
        """One consumer per peer, of the topics subtree only, then multiprovider."""
        credentials = _conf_quote(self.replicator_password)
        stanzas = [
            f"syncrepl rid={rid:03d}\n"
            f"    provider={url}\n"
            "    bindmethod=simple\n"
            f'    binddn="{replicator_dn}"\n'
            f"    credentials={credentials}\n"
            f'    searchbase="ou=topics,{suffix}"\n'
            "    scope=sub\n"
            "    type=refreshAndPersist\n"
            f'    retry="{SHARE_RETRY}"\n'
            "    network-timeout=5\n"
            "    timeout=10" + self._tls_options(url)
            for rid, url in enumerate(self.peers, start=1)
        ]
        return "\n".join([*stanzas, "multiprovider on"])

    def _tls_options(self, url: str) -> str:
        """With TLS: the peer's certificate must be signed by the CA and name the peer's host, and
        an ldap:// peer is asked for StartTLS before the replicator's password is sent."""
        if self.tls is None:
            return ""
        starttls = "    starttls=critical\n" if url.lower().startswith("ldap://") else ""
        return f'\n{starttls}    tls_cacert="{self.tls.ca}"\n    tls_reqcert=demand'


def _conf_quote(value: str) -> str:
    # slapd.conf's tokenizer takes a backslash as escaping the next character.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def ssha(password: str) -> str:
    """The {SSHA} userPassword value slapd verifies binds against."""
    salt = secrets.token_bytes(8)
    digest = hashlib.sha1(password.encode() + salt).digest()  # noqa: S324 - the LDAP {SSHA} scheme
    return "{SSHA}" + base64.b64encode(digest + salt).decode()


def ssha_matches(hashed: str, password: str) -> bool:
    """Whether an {SSHA} userPassword value is the hash of this password."""
    if not hashed.startswith("{SSHA}"):
        return False
    raw = base64.b64decode(hashed[6:])
    digest, salt = raw[:20], raw[20:]
    return secrets.compare_digest(
        hashlib.sha1(password.encode() + salt).digest(),  # noqa: S324 - the LDAP {SSHA} scheme
        digest,
    )


def _sbin(name: str) -> str:
    # slapd and slapadd live in /usr/sbin, which a non-root PATH may lack.
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class Instance:
    """One slapd: its data dir, suffix, port and the passwords it was seeded with."""

    data_dir: Path
    port: int
    suffix: str = "dc=hpwsn,dc=local"
    # Local demo defaults, documented in the README; make run takes them from the environment.
    admin_password: str = "admin"  # noqa: S105
    broker_password: str = "broker"  # noqa: S105
    demo_passwords: dict[str, str] = field(default_factory=dict)
    loglevel: str = "none"
    # None: the site keeps its own topic tree (the default).
    sharing: Sharing | None = None
    # slapd also listens here (a host or address), so that peer sites can reach it.
    listen_host: str = ""
    # And on ldaps:// at this port (on the same addresses), for peers that name it so. Needs the
    # sharing's TLS settings (the certificate slapd presents).
    ldaps_port: int | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"ldap://127.0.0.1:{self.port}/"

    @property
    def conf(self) -> Path:
        return self.data_dir / "slapd.conf"

    @property
    def admin_dn(self) -> str:
        return f"cn=admin,{self.suffix}"

    @property
    def broker_dn(self) -> str:
        return f"cn=broker,{self.suffix}"

    @property
    def replicator_dn(self) -> str:
        """The account peer sites replicate the topic tree as (read on ou=topics only)."""
        return f"cn=replicator,{self.suffix}"

    @property
    def env(self) -> dict[str, str]:
        """The settings (environment) that point the broker at this instance."""
        return {
            "LDAP_URL": self.url,
            "HPWSN_LDAP_URL": self.url,
            "HPWSN_LDAP_BASE_DN": self.suffix,
            "HPWSN_LDAP_BIND_DN": self.broker_dn,
            "HPWSN_LDAP_BIND_PASSWORD": self.broker_password,
        }

    def demo_password(self, uid: str) -> str:
        return self.demo_passwords.get(uid, DEMO_PASSWORD)

    def prepare(self, *, seed: bool = True) -> bool:
        """Write slapd.conf (with replication of the topic tree when sharing); seed an empty
        database. True when it seeded. SharingError: the tree cannot be shared as it is."""
        if self.ldaps_port is not None and (self.sharing is None or self.sharing.tls is None):
            raise SharingError(
                "HPWSN_DIRECTORY_LDAPS_PORT needs HPWSN_DIRECTORY_SHARE_WITH and the "
                "HPWSN_DIRECTORY_TLS_* settings (the certificate slapd presents on ldaps://)"
            )
        db = self.data_dir / "db"
        db.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        conf = (FILES / "slapd.conf.in").read_text(encoding="utf-8")
        tls = "# no TLS: HPWSN_DIRECTORY_TLS_* are not set"
        replicator_reads = f'    by dn.exact="{self.replicator_dn}" read'
        if self.sharing is None:
            serverid = syncrepl = "# not shared: HPWSN_DIRECTORY_SHARE_WITH is empty"
        else:
            serverid = self.sharing.serverid_line()
            syncrepl = self.sharing.syncrepl_lines(
                suffix=self.suffix, replicator_dn=self.replicator_dn
            )
            if self.sharing.tls is not None:
                tls = self.sharing.tls.server_lines()
                # And the peers' replicator reads the topics over TLS only.
                replicator_reads = (
                    f'    by dn.exact="{self.replicator_dn}" tls_ssf=128 read\n'
                    f'    by dn.exact="{self.replicator_dn}" none'
                )
        for key, value in {
            "@SCHEMA@": str(FILES / "hpwsn.schema"),
            "@DATA@": str(self.data_dir),
            "@SUFFIX@": self.suffix,
            "@ROOTPW@": ssha(self.admin_password),
            "@BROKER@": self.broker_dn,
            "@REPLICATOR@": self.replicator_dn,
            "@LOGLEVEL@": self.loglevel,
            "@SERVERID@": serverid,
            "@SYNCREPL@": syncrepl,
            "@TLS@": tls,
            "@REPLICATOR_READS@": replicator_reads,
        }.items():
            conf = conf.replace(key, value)
        self.conf.write_text(conf, encoding="utf-8")
        self.conf.chmod(0o600)
        if not seed:
            return False
        if (db / "data.mdb").exists():
            if self.sharing is not None:
                self._require_shareable_topics()
            self._add_missing_containers()
            self._broker_account()
            self._replicator_account()
            return False
        ldif = (FILES / "seed.ldif.in").read_text(encoding="utf-8")
        first_rdn = self.suffix.split(",", 1)[0]
        values = {
            "@SUFFIX@": self.suffix,
            "@DC@": first_rdn.split("=", 1)[1],
            "@PW_broker@": ssha(self.broker_password),
        }
        for uid in DEMO_USERS:
            values[f"@PW_{uid}@"] = ssha(self.demo_password(uid))
            values[f"@SECRET_{uid}@"] = self.demo_password(uid)
        for key, value in values.items():
            ldif = ldif.replace(key, value)
        ldif = _fixed_topic_identities(ldif, f"ou=topics,{self.suffix}")
        self._offline_write("slapadd", "seed.ldif", ldif, "-q")
        self._replicator_account()
        return True

    def _add_missing_containers(self) -> None:
        """Add the seed's containers (ou=... below the suffix) that a database seeded by an older
        release lacks, e.g. ou=registrations. The broker cannot add them itself: it may write
        only below them (slapd.conf.in)."""
        listing = self._slapcat("(objectClass=organizationalUnit)")
        present = {
            line[4:].strip().lower() for line in listing.splitlines() if line.startswith("dn: ")
        }
        missing = [block for dn, block in seed_containers(self.suffix) if dn.lower() not in present]
        if missing:
            self._offline_write("slapadd", "containers.ldif", "\n\n".join(missing) + "\n")

    def _broker_account(self) -> None:
        """The broker's entry has the configured password: a directory seeded with another (an
        older release's constant default) takes this one. Written with slapmodify."""
        entry = self._slapcat(f"(entryDN={self.broker_dn})")
        if not entry.strip() or any(
            ssha_matches(value, self.broker_password)
            for value in _attribute_values(entry, "userPassword")
        ):
            return
        change = (
            f"dn: {self.broker_dn}\nchangetype: modify\nreplace: userPassword\n"
            f"userPassword: {ssha(self.broker_password)}\n-\n"
        )
        self._offline_write("slapmodify", "broker.ldif", change)

    def accounts_with_password(self, password: str) -> list[str]:
        """The people (uid) whose login or WS-Security digest secret is this password."""
        listing = self._slapcat(
            f"(&(objectClass=inetOrgPerson)(entryDN:dnSubtreeMatch:=ou=people,{self.suffix}))"
        )
        found = []
        for block in listing.split("\n\n"):
            uids = _attribute_values(block, "uid")
            hashes = _attribute_values(block, "userPassword")
            digest_secrets = _attribute_values(block, "hpwsnDigestSecret")
            if uids and (
                password in digest_secrets or any(ssha_matches(h, password) for h in hashes)
            ):
                found.append(uids[0])
        return found

    def _replicator_account(self) -> None:
        """The replicator entry exists, with the configured password, while this site shares
        its topic tree, and not otherwise. Written with slapmodify: slapd is not running yet."""
        present = bool(self._slapcat(f"(entryDN={self.replicator_dn})").strip())
        if self.sharing is None:
            change = f"dn: {self.replicator_dn}\nchangetype: delete\n" if present else ""
        elif present:
            change = (
                f"dn: {self.replicator_dn}\nchangetype: modify\nreplace: userPassword\n"
                f"userPassword: {ssha(self.sharing.replicator_password)}\n-\n"
            )
        else:
            change = (
                f"dn: {self.replicator_dn}\nchangetype: add\nobjectClass: organizationalRole\n"
                "objectClass: simpleSecurityObject\ncn: replicator\n"
                "description: peer sites replicate the topic tree as this account\n"
                f"userPassword: {ssha(self.sharing.replicator_password)}\n"
            )
        if change:
            self._offline_write("slapmodify", "replicator.ldif", change)

    def _offline_write(self, tool: str, name: str, ldif: str, *options: str) -> None:
        """Apply an LDIF with slapadd or slapmodify while slapd is not running. The file may hold
        password hashes: only the owner reads it, and it goes once applied."""
        ldif_file = self.data_dir / name
        ldif_file.write_text(ldif, encoding="utf-8")
        ldif_file.chmod(0o600)
        try:
            subprocess.run(  # noqa: S603 - fixed argv
                [_sbin(tool), *options, "-f", str(self.conf), "-l", str(ldif_file)],
                check=True,
                capture_output=True,
            )
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"{tool} failed: {exc.stderr.decode(errors='replace')}") from exc
        finally:
            ldif_file.unlink(missing_ok=True)

    def _require_shareable_topics(self) -> None:
        """Refuse to share a topic tree written to while this site kept its own.

        Such entries carry replica id 000 in their entryCSN, as every other unshared site's do:
        multi-provider replication cannot tell them apart, and the first refresh from a peer
        deletes them or leaves them different at each site. The seeded entries (SEED_CSN) are the
        same at every site and are safe.
        """
        topics_dn = f"ou=topics,{self.suffix}"
        listing = self._slapcat(f"(entryDN:dnSubtreeMatch:={topics_dn})")
        unshared: list[str] = []
        dn = ""
        for line in listing.splitlines():
            if line.startswith("dn: "):
                dn = line[4:].strip()
            elif line.startswith("entryCSN: "):
                csn = line[10:].strip()
                if csn != SEED_CSN and csn.split("#")[2:3] == ["000"]:
                    unshared.append(dn)
        if unshared:
            raise SharingError(
                f"the topic tree in {self.data_dir / 'db'} has {len(unshared)} entries written "
                f"while this site kept its own tree (e.g. {unshared[0]}); shared, they would be "
                "deleted or differ between the sites. Start sharing from a new directory "
                '(docs/deployment.md, "Sharing the topic tree"), or unset '
                "HPWSN_DIRECTORY_SHARE_WITH"
            )

    def _slapcat(self, ldap_filter: str) -> str:
        return subprocess.run(  # noqa: S603 - fixed argv
            [_sbin("slapcat"), "-f", str(self.conf), "-o", "ldif-wrap=no", "-a", ldap_filter],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def listen_urls(self) -> str:
        """Loopback for the broker, and listen_host for the peer sites when one is given; the
        same on ldaps:// at ldaps_port when one is given."""
        host = self.listen_host.strip()
        if not host or host in ("127.0.0.1", "localhost"):
            hosts = ["127.0.0.1"]
        elif host in ("0.0.0.0", "*"):  # noqa: S104 - asked for: every IPv4 address
            hosts = ["0.0.0.0"]  # noqa: S104
        else:
            hosts = ["127.0.0.1", f"[{host}]" if ":" in host and not host.startswith("[") else host]
        urls = [f"ldap://{h}:{self.port}/" for h in hosts]
        if self.ldaps_port is not None:
            urls += [f"ldaps://{h}:{self.ldaps_port}/" for h in hosts]
        return " ".join(urls)

    def command(self) -> list[str]:
        """slapd in the foreground (-d keeps it attached), listening on loopback (and on
        listen_host for peer sites)."""
        return [_sbin("slapd"), "-d", "0", "-h", self.listen_urls(), "-f", str(self.conf)]

    def start(self, *, timeout: float = 20.0) -> None:
        """Start slapd as a child process and wait until it accepts connections."""
        log = open(self.data_dir / "slapd.log", "ab")  # noqa: SIM115 - lives as long as slapd
        self.process = subprocess.Popen(  # noqa: S603 - fixed argv
            self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while not port_open(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log_text = (self.data_dir / "slapd.log").read_text(errors="replace")
                raise RuntimeError(f"slapd did not start on {self.url}:\n{log_text[-3000:]}")
            time.sleep(0.05)

    def stop(self, *, timeout: float = 10.0) -> None:
        """Stop the slapd this instance started (SIGTERM, then SIGKILL)."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def seed_containers(suffix: str) -> list[tuple[str, str]]:
    """The seed's organizational units directly below the suffix: (DN, LDIF entry) each."""
    text = (FILES / "seed.ldif.in").read_text(encoding="utf-8").replace("@SUFFIX@", suffix)
    out = []
    for block in text.split("\n\n"):
        lines = [line for line in block.strip().splitlines() if not line.startswith("#")]
        if not lines or not lines[0].startswith("dn: ou="):
            continue
        dn = lines[0][4:].strip()
        if dn.split(",", 1)[1] == suffix and "objectClass: organizationalUnit" in lines:
            out.append((dn, "\n".join(lines)))
    return out


def _fixed_topic_identities(ldif: str, topics_dn: str) -> str:
    """The seed LDIF with an entryUUID (from the DN) and SEED_CSN on each topic entry."""
    blocks = []
    for block in ldif.split("\n\n"):
        dn = next((line[4:].strip() for line in block.splitlines() if line.startswith("dn: ")), "")
        if dn.lower() == topics_dn.lower() or dn.lower().endswith("," + topics_dn.lower()):
            entry_uuid = uuid.uuid5(SEED_UUID_NAMESPACE, dn.lower())
            block = f"{block.rstrip()}\nentryUUID: {entry_uuid}\nentryCSN: {SEED_CSN}"
        blocks.append(block)
    return "\n\n".join(blocks)


def _attribute_values(ldif: str, name: str) -> list[str]:
    """An attribute's values in unwrapped LDIF (slapcat -o ldif-wrap=no), base64 ones decoded."""
    values = []
    for line in ldif.splitlines():
        if line.lower().startswith(f"{name.lower()}:: "):
            values.append(base64.b64decode(line.split(":: ", 1)[1]).decode(errors="replace"))
        elif line.lower().startswith(f"{name.lower()}: "):
            values.append(line.split(": ", 1)[1])
    return values


def kept_secret(path: Path) -> str:
    """A random secret made at the first start and kept in the file, its owner's only (as
    hpwsn_site/settings.py keeps the Django secret key): each installation its own."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text(encoding="utf-8").strip()
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        # No newline: `ldapmodify -y FILE` takes the whole file as the password.
        secret = secrets.token_urlsafe(24)
        out.write(secret)
    return secret


def _beyond_loopback(host: str) -> bool:
    """Whether a listening address (empty: the default, loopback) is reached from elsewhere."""
    host = host.strip().removeprefix("[").removesuffix("]")
    if not host or host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a host name: whatever it resolves to, it was named to be reached


def _exposed(env: Mapping[str, str]) -> list[str]:
    """The settings that make the platform reachable from other machines: a listening address
    beyond loopback, and a web server on loopback behind a reverse proxy (its public URL, its
    proxies) or in a federation of sites."""
    found = [
        f"{name}={env[name]}"
        for name in ("HPWSN_HTTP_HOST", "HPWSN_DIRECTORY_LISTEN")
        if _beyond_loopback(env.get(name, ""))
    ]
    public = env.get("HPWSN_PUBLIC_URL", "").strip()
    with contextlib.suppress(ValueError):
        if public and _beyond_loopback(urlsplit(public).hostname or ""):
            found.append(f"HPWSN_PUBLIC_URL={public}")
    if env.get("HPWSN_API_PROXIES", "").strip() not in ("", "0"):
        found.append(f"HPWSN_API_PROXIES={env['HPWSN_API_PROXIES']}")
    found += [f"{name} set" for name in ("HPWSN_FEDERATION_PEERS",) if env.get(name, "").strip()]
    return found


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _env(name: str, default: str, environ: Mapping[str, str] = os.environ) -> str:
    # Same rule as hpwsn_site/env.py: a secret may come from NAME_FILE.
    path = environ.get(f"{name}_FILE")
    if path:
        return Path(path).read_text(encoding="utf-8").strip()
    return environ.get(name) or default


def _main() -> None:
    parser = argparse.ArgumentParser(description="Render and seed HPwsn's slapd instance.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    prep = sub.add_parser("prepare", help="write slapd.conf, seed an empty database")
    prep.add_argument("--data-dir", required=True, type=Path)
    prep.add_argument("--port", required=True, type=int)
    prep.add_argument("--loglevel", default="none")
    args = parser.parse_args()
    demo = _env("HPWSN_LDAP_DEMO_PASSWORD", DEMO_PASSWORD)
    try:
        sharing = Sharing.from_env(os.environ)
    except SharingError as exc:
        sys.exit(f"slapd not started: {exc}")
    data_dir = args.data_dir.resolve()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Where the platform is reached from other machines (the web server, or this slapd for the
    # peer sites), the demo people's published password would let anyone in as admin1.
    exposed = _exposed(os.environ)

    def refusal(people: str) -> str:
        return (
            f"slapd not started: the platform listens beyond this machine ({', '.join(exposed)})"
            f" and the demo people {people} the published password {DEMO_PASSWORD!r}. Set "
            "HPWSN_LDAP_DEMO_PASSWORD before the directory is first seeded, or change their "
            "passwords (README, Directory), or listen on 127.0.0.1 only"
        )

    if exposed and demo == DEMO_PASSWORD and not (data_dir / "db" / "data.mdb").exists():
        sys.exit(refusal("would have"))
    inst = Instance(
        data_dir=data_dir,
        port=args.port,
        suffix=_env("HPWSN_LDAP_BASE_DN", "dc=hpwsn,dc=local"),
        # Unless given, made at the first start and kept in the data dir (README, Directory).
        admin_password=_env("HPWSN_LDAP_ADMIN_PASSWORD", "")
        or kept_secret(data_dir / "admin.password"),
        broker_password=_env("HPWSN_LDAP_BIND_PASSWORD", "")
        or kept_secret(data_dir / "broker.password"),
        demo_passwords={uid: demo for uid in DEMO_USERS},
        loglevel=args.loglevel,
        sharing=sharing,
        listen_host=os.environ.get("HPWSN_DIRECTORY_LISTEN", ""),
        ldaps_port=_ldaps_port(os.environ.get("HPWSN_DIRECTORY_LDAPS_PORT", "")),
    )
    try:
        seeded = inst.prepare()
    except SharingError as exc:
        sys.exit(f"slapd not started: {exc}")
    if exposed:
        weak = inst.accounts_with_password(DEMO_PASSWORD)
        if weak:
            sys.exit(refusal(f"({', '.join(weak)}) have"))
    if seeded:
        print(f"seeded {inst.data_dir / 'db'} with the demo directory", file=sys.stderr)
    # The command line for the caller to run, one argument per line.
    print("\n".join(inst.command()))


def _ldaps_port(value: str) -> int | None:
    if not value.strip():
        return None
    if not value.strip().isdigit() or not 0 < int(value) < 65536:
        sys.exit(f"slapd not started: HPWSN_DIRECTORY_LDAPS_PORT: {value!r} is not a port")
    return int(value)


if __name__ == "__main__":
    _main()
