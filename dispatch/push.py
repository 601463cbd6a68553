"""HTTP delivery of Notify envelopes to consumers: allow-listed, pinned, optionally signed."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import os
import re
import select
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote, urlsplit

import httptools
import httpx
import psutil
from django.conf import settings

from hpwsn import ns
from hpwsn.soap import SOAP11_CT, SOAP12_CT
from hpwsn.targets import Target, TargetPolicy, TargetRefused, same_endpoint

_policy: TargetPolicy | None = None
_resolved: dict[str, tuple[float, Target]] = {}
RESOLVE_TTL_S = 30.0


# One keep-alive connection pool per consumer origin, the least recently used dropped beyond
# MAX_CLIENTS: a single shared pool is scanned connection by connection on every request, which with
# a hundred consumers cost ten times the POST itself (bench/fanout.py). The pump threads share them:
# a pool dropped while a push still uses it is closed by that push when it is done, never under it
# (the push would fail while its consumer answers it, and be sent again: a duplicate without a
# fault). A connection is a socket: the request is written in one piece and the answer read with
# httptools (the C parser uvicorn uses), since a POST through http.client cost four times the
# CPU (docs/benchmarks.md), and the pushes are most of a worker's work.
@dataclass
class _Held:
    client: _Pool
    users: int = 0
    dropped: bool = False


_tls: tuple[tuple[str, str], ssl.SSLContext] | None = None


def tls_context() -> ssl.SSLContext:
    """One TLS context for every client (and the federation's calls to peers): making one loads
    the CA bundle, which cost 20-40 ms a client, so each push to a consumer whose client had been
    dropped for room took that long. Made again when SSL_CERT_FILE or SSL_CERT_DIR (which it
    reads) change."""
    global _tls
    where = (os.environ.get("SSL_CERT_FILE", ""), os.environ.get("SSL_CERT_DIR", ""))
    if _tls is None or _tls[0] != where:
        _tls = (where, httpx.create_ssl_context())
    return _tls[1]


USER_AGENT = "HPwsn-push/1"
# What a request must not carry, as http.client refuses it: a space or a control character in the
# path, a line break or another control character in a header (the URL comes from the subscriber).
_PATH_UNSAFE = re.compile(r"[\x00-\x20\x7f]")
_HEADER_UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# What a path keeps as written when its other characters are percent-encoded (RFC 3986's
# delimiters and unreserved characters, "%" for what is encoded already; never a space or control).
_PATH_KEPT = "/?#[]@!$&'()*+,;=:%~-._"
POOL_CONNECTIONS = 8
CONNECT_TIMEOUT_S = 5.0
ANSWER_MAX = 64 * 1024  # what is read of a consumer's answer (the first 200 bytes are kept)


class _ConnectFailed(Exception):
    """The connection could not be opened (refused, unreachable, timed out, TLS refused)."""


class _PoolBusy(Exception):
    """Every connection to the consumer stayed in use for the whole wait."""


class _AnswerError(Exception):
    """The consumer's answer is not HTTP, or ended before it was whole."""


class _Conn:
    """A connection to the checked address (never to whatever the name resolves to next: a
    rebinding DNS answer cannot redirect the push): opened within CONNECT_TIMEOUT_S, then a
    request sent and its whole answer read within the push timeout, however the consumer paces
    its bytes (a byte a second, or interim answers without end, would otherwise hold the push, and
    a pump thread, for as long as the consumer likes). Over TLS the host name is the SNI and what
    the certificate must name."""

    def __init__(self, target: Target, read_timeout: float, context: ssl.SSLContext | None) -> None:
        self.timeout = read_timeout
        try:
            sock = socket.create_connection(
                (target.addresses[0], target.port), timeout=CONNECT_TIMEOUT_S
            )
        except OSError as exc:
            raise _ConnectFailed(exc) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(read_timeout)
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=target.host)
        except OSError as exc:  # ssl.SSLError included
            sock.close()
            raise _ConnectFailed(exc) from exc
        self.sock = sock

    def closed_meanwhile(self) -> bool:
        """Readable while idle: the consumer closed it (or sent what nobody asked for)."""
        ready = select.poll()
        ready.register(self.sock, select.POLLIN)
        return bool(ready.poll(0))

    def _within(self, deadline: float) -> None:
        """The socket's timeout for its next call: what is left of the exchange's time."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer was not whole within the push timeout")
        self.sock.settimeout(left)

    def exchange(self, request: bytes, body: bytes) -> tuple[_Answer, bool]:
        """Send the request, read the answer; and whether the connection may be used again."""
        deadline = time.monotonic() + self.timeout
        self._within(deadline)
        if len(body) <= 65536:
            self.sock.sendall(request + body)
        else:
            self.sock.sendall(request)
            self._within(deadline)
            self.sock.sendall(body)
        answer = _Answer()
        try:
            return answer, self._read(answer, deadline)
        finally:
            answer.parser = None  # it refers to the answer: no cycle left to collect

    def _read(self, answer: _Answer, deadline: float) -> bool:
        """Read one answer; whether the connection may be used again."""
        parser = answer.parser = httptools.HttpResponseParser(answer)
        while True:
            self._within(deadline)
            data = self.sock.recv(65536)
            if not data:
                if answer.headers_done and answer.delimited_by_close:
                    return False  # a body that ends with the connection: it has
                raise _AnswerError("the consumer closed the connection before its answer was whole")
            try:
                parser.feed_data(data)
            except httptools.HttpParserError as exc:
                raise _AnswerError(f"not an HTTP answer: {exc}") from exc
            if answer.size > ANSWER_MAX:
                return False  # not read to its end: the connection goes
            if answer.complete:
                return answer.keep_alive and not answer.extra

    def close(self) -> None:
        self.sock.close()


class _Answer:
    """What httptools reads of an answer: its headers, at most ANSWER_MAX of its body. An interim
    answer (100 Continue and the like) is passed over for the one after it; anything the consumer
    sends after the answer is not read as another (and its connection is not kept)."""

    def __init__(self) -> None:
        self.parser: Any = None
        self.complete = False
        self.extra = False
        self.on_message_begin()

    def on_message_begin(self) -> None:
        if self.complete:
            self.extra = True
            return
        self.status = 0
        self.keep_alive = False
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.size = 0
        self.headers_done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.complete:
            self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self.complete:
            return
        # Asked now: once the answer is complete the parser has moved on to the next one.
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True

    def on_body(self, chunk: bytes) -> None:
        if self.complete:
            return
        self.size += len(chunk)
        if self.size <= ANSWER_MAX:
            self.chunks.append(chunk)

    def on_message_complete(self) -> None:
        if self.status >= 200:
            self.complete = True

    @property
    def delimited_by_close(self) -> bool:
        return "content-length" not in self.headers and "transfer-encoding" not in self.headers

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


class _Pool:
    """Keep-alive connections to one checked address: at most POOL_CONNECTIONS at once, a push
    beyond them waiting for one (up to the push timeout) rather than opening a connection it
    would throw away. Nothing is retried or followed here: a failure is the pump's attempt, and a
    redirect could lead anywhere."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.slots = threading.BoundedSemaphore(POOL_CONNECTIONS)
        self.idle: list[_Conn] = []
        self.lock = threading.Lock()
        self.closed = False

    def _connection(self) -> _Conn:
        """An idle connection the consumer has not closed meanwhile, else a new one."""
        while True:
            with self.lock:
                conn = self.idle.pop() if self.idle else None
            if conn is None:
                break
            if not conn.closed_meanwhile():
                return conn
            conn.close()
        context = tls_context() if self.target.scheme == "https" else None
        return _Conn(self.target, settings.HPWSN_PUSH_TIMEOUT_S, context)

    def post(self, request: bytes, body: bytes, wait: float) -> _Answer:
        """Send one request (its line and headers, then the body); the answer."""
        if not self.slots.acquire(timeout=wait):
            raise _PoolBusy(f"no connection to {self.target.host} free within {wait:.0f} s")
        try:
            conn = self._connection()
            try:
                answer, keep = conn.exchange(request, body)
            except BaseException:
                conn.close()
                raise
            with self.lock:
                keep = keep and not self.closed
                if keep:
                    self.idle.append(conn)
            if not keep:
                conn.close()
            return answer
        finally:
            self.slots.release()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()


_clients: OrderedDict[str, _Held] = OrderedDict()
_clients_lock = threading.Lock()
MAX_CLIENTS = 512


@contextlib.contextmanager
def _http(origin: str, target: Target) -> Iterator[_Pool]:
    """The origin's pool, held for one push."""
    with _clients_lock:
        held = _clients.get(origin)
        if held is not None:
            _clients.move_to_end(origin)
            held.users += 1
    if held is None:
        made = _Held(_Pool(target))
        with _clients_lock:
            held = _clients.get(origin)
            if held is None:
                held = _clients[origin] = made
            held.users += 1
            dropped = []
            while len(_clients) > MAX_CLIENTS:
                old = _clients.popitem(last=False)[1]
                old.dropped = True
                if old.users == 0:
                    dropped.append(old)
        if held is not made:
            made.client.close()
        for old in dropped:
            old.client.close()
    try:
        yield held.client
    finally:
        with _clients_lock:
            held.users -= 1
            done = held.dropped and held.users == 0
        if done:
            held.client.close()


def push_policy() -> TargetPolicy:
    global _policy
    if _policy is None:
        _policy = TargetPolicy(settings.HPWSN_PUSH_ALLOW)
    return _policy


def check_target(url: str) -> Target:
    """The allow-listed, resolved target of a consumer URL (cached briefly per URL)."""
    now = time.monotonic()
    cached = _resolved.get(url)
    if cached and cached[0] > now:
        return cached[1]
    target = push_policy().check(url)
    if len(_resolved) > 10_000:
        _resolved.clear()
    _resolved[url] = (now + RESOLVE_TTL_S, target)
    return target


_own: list[Target] | None = None


def own_endpoints(base_url: str | None = None) -> list[Target]:
    """Where this broker is reached: `base_url` (the address a request came to),
    HPWSN_PUBLIC_URL, and the web server's HPWSN_HTTP_HOST/HPWSN_HTTP_PORT (exported by run.sh).
    Never a push target: the broker would publish its own pushes again, for ever."""
    global _own
    if _own is None:
        _own = _resolve_own([settings.HPWSN_PUBLIC_URL])
        if settings.HPWSN_HTTP_PORT:
            host = settings.HPWSN_HTTP_HOST or "127.0.0.1"
            _own += _resolve_own([f"http://{host}:{settings.HPWSN_HTTP_PORT}"])
            # A wildcard bind address is reached through loopback too.
            _own.append(Target("http", "localhost", settings.HPWSN_HTTP_PORT, ("127.0.0.1", "::1")))
    own = _own + _interfaces_own()
    if not base_url:
        return own
    # The address a request came to is resolved once a while, not at every Subscribe: a name
    # the resolver is slow to answer (or to refuse) would hold every Subscribe that long.
    now = time.monotonic()
    cached = _own_by_base.get(base_url)
    if cached is None or cached[0] <= now:
        if len(_own_by_base) > 1_000:
            _own_by_base.clear()
        cached = _own_by_base[base_url] = (now + RESOLVE_TTL_S, _resolve_own([base_url]))
    return cached[1] + own


_own_by_base: dict[str, tuple[float, list[Target]]] = {}
_WILDCARDS = {"0.0.0.0", "::", "[::]"}  # noqa: S104  (bind addresses recognised, none bound)
_interfaces: tuple[float, list[Target]] = (0.0, [])


def _interfaces_own() -> list[Target]:
    """A web server bound to a wildcard address is reached through every address of this
    host's interfaces (read again once a while: they change with the network)."""
    global _interfaces
    if not settings.HPWSN_HTTP_PORT or settings.HPWSN_HTTP_HOST not in _WILDCARDS:
        return []
    now = time.monotonic()
    if _interfaces[0] <= now:
        addresses = tuple(
            a.address.split("%", 1)[0]
            for nic in psutil.net_if_addrs().values()
            for a in nic
            if a.family in (socket.AF_INET, socket.AF_INET6)
        )
        target = Target("http", settings.HPWSN_HTTP_HOST, settings.HPWSN_HTTP_PORT, addresses)
        _interfaces = (now + RESOLVE_TTL_S, [target])
    return _interfaces[1]


def _resolve_own(urls: list[str]) -> list[Target]:
    everywhere = TargetPolicy(["*"])
    found = []
    for url in filter(None, urls):
        try:
            found.append(everywhere.check(url))
        except TargetRefused:
            continue  # e.g. a wildcard bind address, 0.0.0.0: the loopback spelling stands in
    return found


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    permanent: bool = False  # not worth retrying (4xx other than 408/429, refused URL)
    status: int | None = None
    detail: str = ""
    retry_after: float | None = None  # seconds the consumer asked us to wait
    throttled: bool = False  # 429 or a timeout: wait at least HPWSN_RETRY_THROTTLED_MIN_S


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def signing_key(secret: str) -> bytes:
    """The HMAC key of a SigningSecret, or ValueError saying why it is unusable.

    A secret written `whsec_<base64>` is used as those decoded bytes, any other as UTF-8.
    """
    if not secret.startswith("whsec_"):
        return secret.encode()
    try:
        key = base64.b64decode(secret[6:], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(
            "a SigningSecret written whsec_... must be valid base64 after the prefix"
        ) from None
    if not key:
        raise ValueError("the SigningSecret whsec_... holds no key bytes")
    return key


def signature(key: bytes, message_id: str, timestamp: str, body: bytes) -> str:
    """The Standard Webhooks v1 signature: HMAC-SHA256 over "id.timestamp.body", base64."""
    mac = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return base64.b64encode(mac.digest()).decode()


def signature_headers(secret: str, message_id: str, body: bytes) -> dict[str, str]:
    """Standard Webhooks headers of a push signed with a SigningSecret."""
    timestamp = str(int(time.time()))
    return {
        "webhook-id": message_id,
        "webhook-timestamp": timestamp,
        "webhook-signature": "v1," + signature(signing_key(secret), message_id, timestamp, body),
    }


def post(
    url: str,
    body: bytes,
    *,
    soap_version: str,
    raw: bool = False,
    message_id: str = "",
    secret: str = "",
    content_type: str = "",
) -> Outcome:
    """POST one envelope; classify the result as success, transient or permanent failure."""
    try:
        target = check_target(url)
    except TargetRefused as exc:
        return Outcome(ok=False, permanent=True, detail=f"refused: {exc}")
    if any(same_endpoint(target, own) for own in own_endpoints()):
        # Refused at Subscribe; a subscription stored before that check must not loop either.
        return Outcome(ok=False, permanent=True, detail="refused: the broker's own endpoint")
    if content_type:  # not SOAP (CloudEvents)
        headers = {"Content-Type": content_type}
    elif raw:
        headers = {"Content-Type": "application/xml; charset=utf-8"}
    elif soap_version == "1.2":
        headers = {"Content-Type": f'{SOAP12_CT}; action="{ns.ACTION_NOTIFY}"'}
    else:
        headers = {"Content-Type": SOAP11_CT, "SOAPAction": f'"{ns.ACTION_NOTIFY}"'}
    # A subscription stored before Subscribe checked these would otherwise raise on every
    # attempt, outside the failure handling: it fails for good instead.
    try:
        if secret:
            headers.update(signature_headers(secret, message_id, body))
        parts = urlsplit(url)
    except ValueError as exc:
        return Outcome(ok=False, permanent=True, detail=f"refused: {exc}")
    if target.scheme not in ("http", "https"):
        return Outcome(ok=False, permanent=True, detail=f"unsupported URL scheme: {target.scheme}")
    headers["User-Agent"] = USER_AGENT
    # The connection goes to the checked address; the Host header (and the SNI) keep the name,
    # an internationalised one in its ASCII form (IDNA), as the resolver looked it up.
    netloc = parts.netloc.rpartition("@")[2]
    if not netloc.isascii():
        try:
            netloc = target.host.encode("idna").decode("ascii")
        except UnicodeError as exc:  # stored before Subscribe checked names
            return Outcome(ok=False, permanent=True, detail=f"refused: {exc}")
        netloc += f":{parts.port}" if parts.port else ""
    headers["Host"] = netloc
    headers["Accept-Encoding"] = "identity"
    headers["Content-Length"] = str(len(body))
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"{k}: {v}" for k, v in headers.items()]
    if _PATH_UNSAFE.search(path) or any(_HEADER_UNSAFE.search(line) for line in lines):
        return Outcome(ok=False, permanent=True, detail="refused: a control character in the URL")
    if not path.isascii():  # sent as browsers send it: its UTF-8 bytes percent-encoded
        path = quote(path, safe=_PATH_KEPT)
    try:
        request = "\r\n".join([f"POST {path} HTTP/1.1", *lines, "", ""]).encode("ascii")
    except UnicodeEncodeError:
        return Outcome(ok=False, permanent=True, detail="refused: a character not ASCII in the URL")
    # The pool is per host name as well as per address: a keep-alive TLS connection was opened
    # with one name's SNI and verified against that name's certificate, and must never carry a
    # request for another name that resolves to the same address.
    origin = f"{target.scheme}://{target.host}@{target.addresses[0]}:{target.port}"
    try:
        with _http(origin, target) as pool:
            answer = pool.post(request, body, wait=max(1, round(settings.HPWSN_PUSH_TIMEOUT_S)))
    except _ConnectFailed as exc:  # refused, unreachable; a connect timeout is a timeout
        cause = exc.__cause__
        if isinstance(cause, TimeoutError):
            return Outcome(ok=False, detail="timeout: connecting", throttled=True)
        return Outcome(ok=False, detail=f"{cause.__class__.__name__}: {cause}")
    except TimeoutError:
        return Outcome(ok=False, detail="timeout: reading the answer", throttled=True)
    except (_PoolBusy, _AnswerError, OSError) as exc:
        return Outcome(ok=False, detail=f"{exc.__class__.__name__}: {exc}")
    status = answer.status
    if 200 <= status < 300:
        return Outcome(ok=True, status=status)
    excerpt = answer.body[:200].decode("utf-8", "replace")
    transient = status in (408, 429) or status >= 500
    return Outcome(
        ok=False,
        permanent=not transient,
        status=status,
        detail=excerpt,
        retry_after=_retry_after(answer.headers.get("retry-after")),
        throttled=status == 429,
    )
