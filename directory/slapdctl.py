"""HPwsn's own slapd instance: render its config into a data dir, seed it, run it (no Django).

Used by scripts/run.sh (`python -m directory.slapdctl prepare ...`, then slapd in the foreground)
and by the test suite's session fixture. Debian's packaged /etc/ldap/slapd.d is never touched: the
instance runs as the current user from `<data dir>/slapd.conf` on a port of its own.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

FILES = Path(__file__).resolve().parent / "slapd"
DEMO_USERS = ("admin1", "operator1", "analyst1", "publisher1", "subscriber1")


def ssha(password: str) -> str:
    """The {SSHA} userPassword value slapd verifies binds against."""
    salt = secrets.token_bytes(8)
    digest = hashlib.sha1(password.encode() + salt).digest()  # noqa: S324 - the LDAP {SSHA} scheme
    return "{SSHA}" + base64.b64encode(digest + salt).decode()


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
        return self.demo_passwords.get(uid, "hpwsn-demo")

    def prepare(self, *, seed: bool = True) -> bool:
        """Write slapd.conf; seed an empty database. True when it seeded."""
        db = self.data_dir / "db"
        db.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        conf = (FILES / "slapd.conf.in").read_text(encoding="utf-8")
        for key, value in {
            "@SCHEMA@": str(FILES / "hpwsn.schema"),
            "@DATA@": str(self.data_dir),
            "@SUFFIX@": self.suffix,
            "@ROOTPW@": ssha(self.admin_password),
            "@BROKER@": self.broker_dn,
            "@LOGLEVEL@": self.loglevel,
        }.items():
            conf = conf.replace(key, value)
        self.conf.write_text(conf, encoding="utf-8")
        self.conf.chmod(0o600)
        if not seed:
            return False
        if (db / "data.mdb").exists():
            self._add_missing_containers()
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
        seed_file = self.data_dir / "seed.ldif"
        seed_file.write_text(ldif, encoding="utf-8")
        seed_file.chmod(0o600)
        try:
            subprocess.run(  # noqa: S603 - fixed argv
                [_sbin("slapadd"), "-q", "-f", str(self.conf), "-l", str(seed_file)],
                check=True,
                capture_output=True,
            )
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"slapadd failed: {exc.stderr.decode(errors='replace')}") from exc
        finally:
            seed_file.unlink(missing_ok=True)
        return True

    def _add_missing_containers(self) -> None:
        """Add the seed's containers (ou=... below the suffix) that a database seeded by an older
        release lacks, e.g. ou=registrations. The broker cannot add them itself: it may write
        only below them (slapd.conf.in)."""
        listing = subprocess.run(  # noqa: S603 - fixed argv
            [
                _sbin("slapcat"),
                "-f",
                str(self.conf),
                "-o",
                "ldif-wrap=no",
                "-a",
                "(objectClass=organizationalUnit)",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        present = {
            line[4:].strip().lower() for line in listing.splitlines() if line.startswith("dn: ")
        }
        missing = [block for dn, block in seed_containers(self.suffix) if dn.lower() not in present]
        if not missing:
            return
        ldif_file = self.data_dir / "containers.ldif"
        ldif_file.write_text("\n\n".join(missing) + "\n", encoding="utf-8")
        try:
            subprocess.run(  # noqa: S603 - fixed argv
                [_sbin("slapadd"), "-f", str(self.conf), "-l", str(ldif_file)],
                check=True,
                capture_output=True,
            )
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"slapadd failed: {exc.stderr.decode(errors='replace')}") from exc
        finally:
            ldif_file.unlink(missing_ok=True)

    def command(self) -> list[str]:
        """slapd in the foreground (-d keeps it attached), listening on loopback only."""
        return [_sbin("slapd"), "-d", "0", "-h", self.url, "-f", str(self.conf)]

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


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _env(name: str, default: str) -> str:
    # Same rule as hpwsn_site/env.py: a secret may come from NAME_FILE.
    path = os.environ.get(f"{name}_FILE")
    if path:
        return Path(path).read_text(encoding="utf-8").strip()
    return os.environ.get(name) or default


def _main() -> None:
    parser = argparse.ArgumentParser(description="Render and seed HPwsn's slapd instance.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    prep = sub.add_parser("prepare", help="write slapd.conf, seed an empty database")
    prep.add_argument("--data-dir", required=True, type=Path)
    prep.add_argument("--port", required=True, type=int)
    prep.add_argument("--loglevel", default="none")
    args = parser.parse_args()
    demo = _env("HPWSN_LDAP_DEMO_PASSWORD", "hpwsn-demo")
    inst = Instance(
        data_dir=args.data_dir.resolve(),
        port=args.port,
        suffix=_env("HPWSN_LDAP_BASE_DN", "dc=hpwsn,dc=local"),
        admin_password=_env("HPWSN_LDAP_ADMIN_PASSWORD", "admin"),
        broker_password=_env("HPWSN_LDAP_BIND_PASSWORD", "broker"),
        demo_passwords={uid: demo for uid in DEMO_USERS},
        loglevel=args.loglevel,
    )
    if inst.prepare():
        print(f"seeded {inst.data_dir / 'db'} with the demo directory", file=sys.stderr)
    # The command line for the caller to run, one argument per line.
    print("\n".join(inst.command()))


if __name__ == "__main__":
    _main()
