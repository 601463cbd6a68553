"""Django's SQLite backend, with the database file's modes set where they take no lock.

`auto_vacuum=INCREMENTAL` takes effect only on a database created with it (the checkpoint then
gives the pages of pruned log rows back: dispatch/reliable.py), and setting it on an existing
file takes the database's write lock. As an init command of every connection it made each new
connection (a task's, a request thread's, a SOAP thread's) wait for any writer's transaction, up
to the 20 s busy timeout, even to read. It is set here on a new, empty file only, before the file
goes to WAL (after which it can no longer change). WAL is kept in the file, and asking for it
again takes no lock. The settings' init commands run before both (synchronous=NORMAL).
"""

from __future__ import annotations

from typing import Any

from django.db.backends.sqlite3 import base


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        conn = super().get_new_connection(conn_params)
        if conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is None:
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # a new file: before WAL and tables
        conn.execute("PRAGMA journal_mode=WAL")
        return conn
