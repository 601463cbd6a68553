"""Follow the LDAP directory (RFC 4533 syncrepl) and keep the broker's topics in step."""

from __future__ import annotations

import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from directory.sync import DirectorySync


class Command(BaseCommand):
    help = __doc__

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.HPWSN_LDAP_URL:
            self.stderr.write("no directory configured (LDAP_URL / HPWSN_LDAP_URL): nothing to do")
            return
        runner = DirectorySync()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: runner.stop())
        self.stdout.write(f"following {settings.HPWSN_LDAP_URL} ({settings.HPWSN_LDAP_BASE_DN})")
        runner.run()
