"""A notification consumer: an aiohttp server on a background thread that records pushes.

It takes SOAP 1.1/1.2 wsnt:Notify envelopes (one or more NotificationMessages each) and the
raw bodies of UseRaw subscriptions, and answers with an empty body. Used by the CLI's `listen`,
by tests and by the benchmarks.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections import deque
from collections.abc import Callable
from types import TracebackType

from aiohttp import web

from hpwsn.client import NotNotifyError, ReceivedMessage, parse_notify_post
from hpwsn.soap import SoapFault, content_type, fault_envelope, soap_version_of
from hpwsn.xmlsafe import XMLRejected

__all__ = ["ConsumerServer"]

log = logging.getLogger(__name__)

MessageCallback = Callable[[ReceivedMessage], None]


class ConsumerServer:
    """Receive notifications on http://host:port/ (any path) in a background thread."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        on_message: MessageCallback | None = None,
        status: int = 200,
        public_url: str | None = None,
        max_bytes: int = 16 * 1024 * 1024,
        max_depth: int = 256,
        keep: int | None = None,
    ) -> None:
        """`keep`: how many of the latest messages `messages` holds (None: all of them, for a
        test's run; a long-running consumer that handles them in `on_message` keeps none)."""
        self.host = host
        self.port = port
        self.on_message = on_message
        # The status answered to every accepted POST; tests set 500/503 to make the broker retry.
        self.status = status
        self._public_url = public_url
        self._max_bytes = max_bytes
        self._max_depth = max_depth
        self._messages: deque[ReceivedMessage] = deque(maxlen=keep)
        self._accepted = 0  # every message accepted, kept or not
        self._requests = 0
        self._cond = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle

    def start(self) -> ConsumerServer:
        """Bind and serve; returns once the socket accepts connections."""
        if self._thread is not None:
            raise RuntimeError("the consumer server is already running")
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
            sock.listen(1024)
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        started = threading.Event()
        failure: list[BaseException] = []
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._serve(sock))
            except BaseException as exc:
                failure.append(exc)
                started.set()
                return
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"hpwsn-consumer-{self.port}", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    async def _serve(self, sock: socket.socket) -> None:
        app = web.Application(client_max_size=self._max_bytes)
        app.router.add_route("POST", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    def stop(self) -> None:
        """Stop serving and join the thread (idempotent)."""
        if self._thread is None or self._loop is None:
            return
        loop, runner = self._loop, self._runner
        if runner is not None:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join()
        loop.close()
        self._thread = self._loop = self._runner = None

    def __enter__(self) -> ConsumerServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- what arrived

    @property
    def url(self) -> str:
        """The address to subscribe with (public_url when given)."""
        if self._public_url:
            return self._public_url
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    @property
    def messages(self) -> list[ReceivedMessage]:
        """A snapshot of the messages accepted so far, in arrival order."""
        with self._cond:
            return list(self._messages)

    @property
    def requests(self) -> int:
        """POSTs received, including refused ones and ones answered with a failure status."""
        with self._cond:
            return self._requests

    def clear(self) -> None:
        """Forget the messages kept; `wait_for` counts from here."""
        with self._cond:
            self._messages.clear()
            self._accepted = 0

    def wait_for(self, count: int, timeout: float = 10.0) -> bool:
        """Wait until at least `count` messages were accepted; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._accepted >= count, timeout)

    # --- the handler

    async def _handle(self, request: web.Request) -> web.Response:
        data = await request.read()
        ctype = request.headers.get("Content-Type")
        status = self.status
        try:
            received = parse_notify_post(
                data, content_type=ctype, max_bytes=self._max_bytes, max_depth=self._max_depth
            )
        except (XMLRejected, NotNotifyError) as exc:
            with self._cond:
                self._requests += 1
            version = soap_version_of(ctype)
            return web.Response(
                status=400,
                body=fault_envelope(SoapFault(str(exc)), version=version),
                headers={"Content-Type": content_type(version)},
            )
        with self._cond:
            self._requests += 1
            # A refused delivery will come again: only what we acknowledged counts as received.
            if 200 <= status < 300:
                self._messages.extend(received)
                self._accepted += len(received)
                self._cond.notify_all()
        if self.on_message is not None and 200 <= status < 300:
            for message in received:
                try:
                    self.on_message(message)
                except Exception:
                    log.exception("on_message callback raised")
        return web.Response(status=status)
