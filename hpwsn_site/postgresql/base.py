"""Django's PostgreSQL backend, with a health check that costs a poll instead of a round trip.

A kept connection is checked before its first use after each request, task, pump run or group
commit (CONN_HEALTH_CHECKS), so that one the server dropped (a restart, an idle timeout, an
administrator's pg_terminate_backend) is replaced before it fails a publish. Django's check is a
`SELECT 1`: a round trip to the server each time, about a fifth of a short unit of work. A server
that drops a connection sends its reason and closes the socket, so the socket of an idle
connection has something to read only then (or when the server sent something unasked, such as a
changed parameter). The check here looks at the socket; only when it has something to read does
Django's `SELECT 1` decide. A connection whose server went silent without closing (a cable cut)
is found by neither check until TCP gives up, as before.
"""

from __future__ import annotations

import select
from typing import Any

from django.db.backends.postgresql import base


class DatabaseWrapper(base.DatabaseWrapper):
    def close_if_health_check_failed(self) -> None:
        if (
            self.connection is not None
            and self.health_check_enabled
            and not self.health_check_done
            and _nothing_to_read(self.connection)
        ):
            self.health_check_done = True
            return
        super().close_if_health_check_failed()


def _nothing_to_read(conn: Any) -> bool:
    """True when the idle connection's socket has nothing waiting: the server has not closed it."""
    if conn.closed:
        return False
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False
