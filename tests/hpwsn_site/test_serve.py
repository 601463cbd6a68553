"""The web server with several workers: one client's connections are spread over all of them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import psutil

from hpwsn_site.serve import command
from tests.support import free_port, wait_until


def _accepted_by(children: list[psutil.Process], port: int) -> dict[int, int]:
    counts = {}
    for child in children:
        conns = child.net_connections(kind="tcp")
        counts[child.pid] = sum(
            1 for c in conns if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port
        )
    return counts


def test_two_workers_share_one_publishers_connections():
    port = free_port()
    proc = subprocess.Popen(
        command(python=sys.executable, host="127.0.0.1", port=port, workers=2),
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    clients: list[socket.socket] = []
    try:
        parent = psutil.Process(proc.pid)

        def servers() -> list[psutil.Process]:
            """The processes listening on the port."""
            found = []
            for child in parent.children():
                try:
                    conns = child.net_connections(kind="tcp")
                except psutil.NoSuchProcess:
                    continue
                if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns):
                    found.append(child)
            return found

        assert wait_until(lambda: len(servers()) == 2, timeout=60)
        # One client, 32 connections from one address (as a publisher with 32 requests in
        # flight opens them).
        for _ in range(32):
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        children = servers()

        assert wait_until(lambda: sum(_accepted_by(children, port).values()) == 32, timeout=20)
        counts = _accepted_by(children, port)
        assert all(n >= 4 for n in counts.values()), counts  # both workers serve this client

        # A worker that dies is replaced; the port keeps answering.
        children[0].kill()
        assert wait_until(lambda: len(servers()) == 2, timeout=60)
    finally:
        for client in clients:
            client.close()
        proc.terminate()
        proc.wait(timeout=20)
