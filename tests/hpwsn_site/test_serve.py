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


def _held(client: str, port: int) -> socket.socket:
    """An idle connection to the web server from this loopback address."""
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(client, 0))


def _answer(client: str, port: int) -> bytes:
    """The status line the server answers a request from this loopback address with."""
    with _held(client, port) as sock:
        request = f"GET /no-such-page/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close"
        sock.sendall(request.encode() + b"\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data.split(b"\r\n", 1)[0]


def test_a_client_that_opens_connections_without_end_takes_no_other_client_s_place():
    port = free_port()
    env = {
        **os.environ,
        "HPWSN_WEB_MAX_CONNECTIONS": "6",
        "HPWSN_WEB_MAX_CONNECTIONS_PER_CLIENT": "3",
        "HPWSN_HEADER_TIMEOUT_S": "120",  # the idle connections stay open for the whole test
    }
    proc = subprocess.Popen(
        command(python=sys.executable, host="127.0.0.1", port=port),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    held: list[socket.socket] = []
    refused = b"HTTP/1.1 503 Service Unavailable"
    try:

        def up() -> bool:
            try:
                return _answer("127.0.0.9", port) == b"HTTP/1.1 404 Not Found"
            except OSError:
                return False

        assert wait_until(up, timeout=60)
        held += [_held("127.0.0.2", port) for _ in range(3)]
        # The same address's next connection is refused; another address's is served.
        assert _answer("127.0.0.2", port) == refused
        assert _answer("127.0.0.3", port) == b"HTTP/1.1 404 Not Found"
        # Six held in all: a seventh connection is refused whatever its address.
        held += [_held(f"127.0.0.{n}", port) for n in (4, 5, 6)]
        assert _answer("127.0.0.7", port) == refused
        # A place given back is taken again.
        held.pop().close()
        assert wait_until(lambda: _answer("127.0.0.7", port) != refused, timeout=20)
        held.pop(0).close()
        assert wait_until(lambda: _answer("127.0.0.2", port) != refused, timeout=20)
    finally:
        for sock in held:
            sock.close()
        proc.terminate()
        proc.wait(timeout=20)
