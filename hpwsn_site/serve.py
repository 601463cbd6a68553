"""The web server: uvicorn with read timeouts on request headers and bodies.

uvicorn times out idle keep-alive connections, but not a request that stops halfway: a client
that sends half its headers (or announces a body and never sends it) held its connection and a
slot of the server for ever (100 such sockets were all held 30 s and beyond while other clients
waited). Here a request's headers must be complete within HPWSN_HEADER_TIMEOUT_S of its first
byte, and its body may pause at most HPWSN_BODY_TIMEOUT_S between two reads; otherwise the
connection is answered 408 (if nothing was answered yet) and closed.

    python -m hpwsn_site.serve --host 127.0.0.1 --port 8000 [--workers N]

With N > 1 workers each binds its own listening socket with SO_REUSEPORT, so the kernel spreads
connections over the workers by their addresses: one publisher's 32 connections land on every
worker, where a shared socket let the first worker to wake up accept most of them. A worker that
dies is started again.

scripts/run.sh, the test platform and the benchmarks start the web process with this command.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import signal
import socket
import sys
import time
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hpwsn_site import processes
from hpwsn_site.env import env_float, env_int

APP = "hpwsn_site.asgi:application"
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\ncontent-length: 32\r\n"
    b"connection: close\r\n\r\nthe request was not sent in time"
)


_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: 30\r\n"
    b"retry-after: 1\r\nconnection: close\r\n\r\ntoo many connections are open"
)


class TimedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on reading each request, and a bound on the
    connections a process holds: in all, and from one client address (unless a proxy stands in
    front, HPWSN_API_PROXIES, whose address every client would share). A connection beyond either
    is answered 503 and closed at once, so a client opening connections without end takes neither
    the process's file descriptors nor the other clients' places."""

    header_timeout = env_float("HPWSN_HEADER_TIMEOUT_S", 10.0)
    body_timeout = env_float("HPWSN_BODY_TIMEOUT_S", 30.0)
    max_connections = env_int("HPWSN_WEB_MAX_CONNECTIONS", 4096)
    max_per_client = (
        0
        if env_int("HPWSN_API_PROXIES", 0)
        else env_int("HPWSN_WEB_MAX_CONNECTIONS_PER_CLIENT", 256)
    )
    _per_client: ClassVar[dict[str, int]] = {}  # this process's open connections by address
    _client: str | None = None
    _refused = False
    _read_timer: asyncio.TimerHandle | None = None

    def _admitted(self, transport: asyncio.Transport) -> bool:
        if len(self.connections) > self.max_connections:  # this one included
            return False
        peer = transport.get_extra_info("peername")
        if not self.max_per_client or not peer:
            return True
        client = str(peer[0])
        held = self._per_client.get(client, 0)
        if held >= self.max_per_client:
            return False
        self._per_client[client] = held + 1
        self._client = client
        return True

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(seconds, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(_TIMED_OUT)
        # The application reading this body (if any) sees a disconnect and stops.
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self._admitted(transport):
            # Answered at once, and closed once the request's first bytes are read (closed with
            # them unread, the client would get a reset instead of the answer) or after a second.
            self._refused = True
            transport.write(_REFUSED)
            self._read_timer = self.loop.call_later(1.0, transport.close)
            return
        self._arm(self.header_timeout)  # a connection that never sends a request line

    def data_received(self, data: bytes) -> None:
        if self._refused:
            self.transport.close()
            return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.header_timeout)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.body_timeout)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._arm(self.body_timeout)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()  # from here the application answers, however long it takes

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle is not None and not self.cycle.keep_alive:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._client is not None:
            left = self._per_client.get(self._client, 1) - 1
            if left > 0:
                self._per_client[self._client] = left
            else:
                self._per_client.pop(self._client, None)
            self._client = None
        super().connection_lost(exc)


def command(*, python: str, host: str, port: int, workers: int = 1) -> list[str]:
    """The web process's command line with this interpreter (hpwsn_site/processes.py)."""
    argv = processes.web(processes.Options(host=host, port=port, web_workers=workers))
    return [python, *argv[1:]]


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def _config(**options: Any) -> uvicorn.Config:
    return uvicorn.Config(
        APP,
        loop="uvloop",
        http=TimedHttpToolsProtocol,
        access_log=False,
        lifespan="off",
        # The client's address and scheme are the connection's. uvicorn's default would take them
        # from X-Forwarded-For and X-Forwarded-Proto of any client on loopback, which is every
        # client of a server on 127.0.0.1: a caller could name itself another address to escape
        # its rate limit. Behind reverse proxies, HPWSN_API_PROXIES says how many hops of
        # X-Forwarded-For to trust (hpwsn_site/api/throttling.py) and HPWSN_PUBLIC_URL the scheme
        # and host that addresses carry.
        proxy_headers=False,
        **options,
    )


def _worker(host: str, port: int) -> None:
    """One of several workers: its own socket on the shared port."""
    uvicorn.Server(_config()).run(sockets=[_listen(host, port)])


def _supervise(host: str, port: int, workers: int) -> None:
    ctx = multiprocessing.get_context("spawn")
    stopping = False

    def start() -> Any:
        proc = ctx.Process(target=_worker, args=(host, port), name="hpwsn-web", daemon=False)
        proc.start()
        return proc

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    procs = [start() for _ in range(workers)]
    while not stopping:
        time.sleep(0.5)
        for i, proc in enumerate(procs):
            if not proc.is_alive() and not stopping:
                print(
                    f"web worker {proc.pid} exited ({proc.exitcode}); starting another", flush=True
                )
                procs[i] = start()
    for proc in procs:
        proc.terminate()  # uvicorn ends its requests in flight on SIGTERM
    for proc in procs:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()


def _raise_file_limit() -> None:
    """Room for the connections allowed and as many files again (the database, Redis, logs):
    the soft limit of open files (often 1,024) raised toward the hard one."""
    wanted = 2 * TimedHttpToolsProtocol.max_connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    _raise_file_limit()  # the workers inherit it
    if args.workers > 1:
        _supervise(args.host, args.port, args.workers)
    else:
        uvicorn.Server(_config(host=args.host, port=args.port)).run()


if __name__ == "__main__":
    main(sys.argv[1:])
