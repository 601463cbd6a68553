"""The push clients kept per consumer: a client dropped to make room is never closed under a push
that is still using it (which would fail a push the consumer is answering, and so send it again:
a duplicate without a fault)."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dispatch import push
from hpwsn.targets import TargetPolicy
from tests.support import RecordingConsumer, wait_until


@pytest.fixture
def few_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(push, "_policy", TargetPolicy(["127.0.0.0/8"]))
    monkeypatch.setattr(push, "_clients", type(push._clients)())
    monkeypatch.setattr(push, "MAX_CLIENTS", 1)
    yield
    for held in push._clients.values():
        held.client.close()


def test_a_client_dropped_for_room_is_not_closed_under_a_push_in_flight(
    few_clients: None, consumer_factory
) -> None:
    slow: RecordingConsumer = consumer_factory(first_delay=1.0)
    quick: RecordingConsumer = consumer_factory()
    outcomes: list[push.Outcome] = []
    in_flight = threading.Thread(
        target=lambda: outcomes.append(push.post(slow.url, b"<slow/>", soap_version="1.1"))
    )
    in_flight.start()
    # The slow push holds its client and its POST is on the wire.
    assert wait_until(lambda: len(push._clients) == 1 and slow.first_delay == 0.0, timeout=5)
    # While the slow consumer takes its time, pushes to another consumer take the only room.
    assert push.post(quick.url, b"<quick/>", soap_version="1.1").ok
    assert push.post(quick.url, b"<quick/>", soap_version="1.1").ok
    in_flight.join(timeout=10)

    assert len(outcomes) == 1
    assert outcomes[0].ok, outcomes
    assert len(slow.posts) == 1
    # The slow consumer's client went once its push was done; the next push opens another.
    assert push.post(slow.url, b"<again/>", soap_version="1.1").ok
    assert len(slow.posts) == 2


def test_pushes_over_plain_http_load_no_ca_bundle(
    few_clients: None, consumer_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TLS context loads the CA bundle: 20-40 ms. Plain HTTP consumers need none, however many
    of them are pushed to and dropped for room (tests/dispatch/test_push_tls.py: the TLS ones
    share one)."""
    made: list[ssl.SSLContext] = []
    real = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(ssl, "create_default_context", counted)
    monkeypatch.setattr(push, "_tls", None)
    consumers = [consumer_factory() for _ in range(3)]
    for _ in range(2):
        for consumer in consumers:
            assert push.post(consumer.url, b"<x/>", soap_version="1.1").ok
    assert all(len(c.posts) == 2 for c in consumers)
    assert made == []


def test_a_consumer_gets_at_most_eight_connections_and_every_push_beyond_them_waits(
    few_clients: None, consumer_factory
) -> None:
    """Twelve pushes at once to one slow consumer: never more than eight connections to it, and
    none of the twelve fails or opens a connection only to throw it away."""
    # Each POST is held long enough for the eighth to arrive while the first is still held, on a
    # machine busy with other work too (with half a second, one run saw seven at most).
    slow: RecordingConsumer = consumer_factory(delay=2.0)
    outcomes: list[push.Outcome] = []
    threads = [
        threading.Thread(
            target=lambda: outcomes.append(push.post(slow.url, b"<x/>", soap_version="1.1"))
        )
        for _ in range(12)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert len(outcomes) == 12
    assert all(o.ok for o in outcomes), outcomes
    assert len(slow.posts) == 12
    assert slow.max_inflight == push.POOL_CONNECTIONS == 8


def test_a_refused_connection_is_a_transient_failure_not_a_throttling_timeout(
    few_clients: None,
) -> None:
    """A timeout makes the consumer wait at least HPWSN_RETRY_THROTTLED_MIN_S when it comes
    again; a refused connection must not."""
    from tests.support import free_port

    outcome = push.post(f"http://127.0.0.1:{free_port()}/gone", b"<x/>", soap_version="1.1")
    assert not outcome.ok
    assert not outcome.permanent
    assert not outcome.throttled
    assert outcome.status is None


class _RawConsumer:
    """A consumer written against the socket: it answers each POST with `answer`, then closes
    the connection when `close_after` says so, without saying it would (no Connection: close)."""

    def __init__(
        self, answer: bytes | list[bytes], *, close_after: bool, pace: float = 0.0
    ) -> None:
        """`answer` is sent whole, or piece by piece with `pace` seconds after each piece."""
        import socketserver

        pieces = [answer] if isinstance(answer, bytes) else answer

        self.requests: list[bytes] = []
        self.heads: list[bytes] = []
        self.connections = 0
        consumer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                consumer.connections += 1
                while True:
                    head = b""
                    while not head.endswith(b"\r\n\r\n"):
                        byte = self.rfile.read(1)
                        if not byte:
                            return
                        head += byte
                    length = next(
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    )
                    consumer.heads.append(head)
                    consumer.requests.append(self.rfile.read(length))
                    try:
                        for piece in pieces:
                            self.wfile.write(piece)
                            self.wfile.flush()
                            time.sleep(pace)
                    except OSError:  # the broker gave up and closed the connection
                        return
                    if close_after:
                        return

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/c"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_kept_connection_the_consumer_closed_while_idle_is_not_used_again(
    few_clients: None,
) -> None:
    """Servers close idle keep-alive connections on their own timer, often without a word: the
    next push opens a new connection instead of failing on the dead one (and being sent twice)."""
    consumer = _RawConsumer(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", close_after=True)
    try:
        for i in range(3):
            assert push.post(consumer.url, f"<n{i}/>".encode(), soap_version="1.1").ok
            assert wait_until(lambda i=i: consumer.connections == i + 1, timeout=5)
            time.sleep(0.05)  # the consumer's FIN reaches the idle connection
        assert consumer.requests == [b"<n0/>", b"<n1/>", b"<n2/>"]
    finally:
        consumer.stop()


def test_a_huge_answer_is_not_read_to_its_end_and_its_connection_is_not_kept(
    few_clients: None,
) -> None:
    body = b"x" * (push.ANSWER_MAX * 16)
    answer = b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    consumer = _RawConsumer(answer, close_after=False)
    try:
        outcome = push.post(consumer.url, b"<a/>", soap_version="1.1")
        assert not outcome.ok
        assert not outcome.permanent
        assert outcome.status == 500
        assert outcome.detail == "x" * 200
        # The rest of that answer is still on the first connection: the next push opens another.
        assert push.post(consumer.url, b"<b/>", soap_version="1.1").status == 500
        assert consumer.connections == 2
        assert consumer.requests == [b"<a/>", b"<b/>"]
    finally:
        consumer.stop()


def test_a_consumer_that_never_answers_is_a_throttling_timeout(few_clients: None, settings) -> None:  # type: ignore[no-untyped-def]
    settings.HPWSN_PUSH_TIMEOUT_S = 0.5
    consumer = _RawConsumer(b"", close_after=False)  # reads the POST, says nothing
    try:
        outcome = push.post(consumer.url, b"<a/>", soap_version="1.1")
        assert not outcome.ok
        assert outcome.throttled
        assert outcome.status is None
        assert outcome.detail.startswith("timeout")
        assert consumer.requests == [b"<a/>"]
    finally:
        consumer.stop()


@pytest.mark.parametrize(("status", "throttled"), [(429, True), (503, False), (500, False)])
def test_only_a_429_answer_asks_the_broker_to_throttle(  # type: ignore[no-untyped-def]
    few_clients: None, status, throttled
) -> None:
    # A 503 follows the retry schedule (and its Retry-After); a 429 waits the throttled minimum.
    answer = b"HTTP/1.1 %d No\r\nContent-Length: 4\r\nRetry-After: 7\r\n\r\nbusy" % status
    consumer = _RawConsumer(answer, close_after=False)
    try:
        outcome = push.post(consumer.url, b"<a/>", soap_version="1.1")
        assert (outcome.ok, outcome.permanent, outcome.status) == (False, False, status)
        assert outcome.throttled is throttled
        assert outcome.retry_after == 7.0
        assert outcome.detail == "busy"
    finally:
        consumer.stop()


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_not_followed_and_fails_the_push_for_good(  # type: ignore[no-untyped-def]
    few_clients: None, consumer_factory, status
) -> None:
    elsewhere: RecordingConsumer = consumer_factory()  # allowed, and would take the push
    answer = b"HTTP/1.1 %d Moved\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % (
        status,
        elsewhere.url.encode(),
    )
    consumer = _RawConsumer(answer, close_after=False)
    try:
        outcome = push.post(consumer.url, b"<a/>", soap_version="1.1")
        assert (outcome.ok, outcome.permanent, outcome.status) == (False, True, status)
        assert consumer.requests == [b"<a/>"]
        assert elsewhere.posts == []
    finally:
        consumer.stop()


def test_a_chunked_answer_is_read_whole_and_its_connection_kept(few_clients: None) -> None:
    answer = (
        b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\nRetry-After: 3\r\n\r\n"
        b"5\r\nbusy \r\n4\r\nnow!\r\n0\r\n\r\n"
    )
    consumer = _RawConsumer(answer, close_after=False)
    try:
        for _ in range(2):
            outcome = push.post(consumer.url, b"<a/>", soap_version="1.1")
            assert (outcome.ok, outcome.status, outcome.detail) == (False, 503, "busy now!")
            assert outcome.retry_after == 3.0
        assert consumer.connections == 1, "the answer was read to its end: kept"
    finally:
        consumer.stop()


def test_an_answer_that_ends_with_its_connection_is_read_and_the_connection_not_kept(
    few_clients: None,
) -> None:
    consumer = _RawConsumer(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nthanks", close_after=True)
    try:
        for _ in range(2):
            assert push.post(consumer.url, b"<a/>", soap_version="1.1").ok
        assert consumer.connections == 2
    finally:
        consumer.stop()


def test_an_interim_100_continue_is_skipped_for_the_answer_after_it(few_clients: None) -> None:
    answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n"
    consumer = _RawConsumer(answer, close_after=False)
    try:
        outcome = push.post(consumer.url, b"<a/>", soap_version="1.1")
        assert (outcome.ok, outcome.status) == (True, 202)
    finally:
        consumer.stop()


@pytest.mark.parametrize(
    "answer",
    [
        [b"HTTP/1.1 200 OK\r\nContent-Length: 60\r\n\r\n", *[b"x"] * 60],
        [b"HTTP/1.1 100 Continue\r\n\r\n"] * 60 + [b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"],
        [b"HTTP/1.1 200 OK\r\n", *[b"X-Pad: y\r\n"] * 60, b"Content-Length: 0\r\n\r\n"],
    ],
    ids=["a body a byte at a time", "interim answers without end", "headers a line at a time"],
)
def test_a_consumer_that_paces_its_answer_past_the_push_timeout_fails_that_push(
    few_clients: None, settings: Any, answer: list[bytes]
) -> None:
    """Each piece comes well within the timeout, the whole answer (six seconds) well past it: the
    push is a timeout (and is retried) rather than holding a pump thread for as long as the
    consumer likes."""
    settings.HPWSN_PUSH_TIMEOUT_S = 1.0
    consumer = _RawConsumer(answer, close_after=False, pace=0.1)
    try:
        outcome = push.post(consumer.url, b"<a/>", soap_version="1.1")
        assert (outcome.ok, outcome.permanent, outcome.throttled) == (False, False, True)
        assert outcome.detail == "timeout: reading the answer"
        assert len(consumer.requests) == 1
    finally:
        consumer.stop()


@pytest.mark.parametrize(
    "answer",
    [
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Len",
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhalf",
    ],
    ids=["not HTTP", "cut in the headers", "cut in the body"],
)
def test_a_broken_answer_is_a_transient_failure_and_its_connection_goes(
    few_clients: None, answer: bytes
) -> None:
    consumer = _RawConsumer(answer, close_after=True)
    try:
        outcome = push.post(consumer.url, b"<a/>", soap_version="1.1")
        assert not outcome.ok
        assert not outcome.permanent, outcome
        assert outcome.status is None
        assert "AnswerError" in outcome.detail
        push.post(consumer.url, b"<b/>", soap_version="1.1")
        assert consumer.connections == 2
    finally:
        consumer.stop()


@pytest.mark.parametrize(
    "path", ["/a b", "/a%0d%0aX: 1".replace("%0d%0a", "\r\n"), "/caf\u00e9\r\nX: 1"]
)
def test_a_url_that_would_break_the_request_is_refused_for_good_and_nothing_is_sent(
    few_clients: None, path: str
) -> None:
    consumer = _RawConsumer(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", close_after=False)
    try:
        url = consumer.url.rsplit("/", 1)[0] + path
        outcome = push.post(url, b"<a/>", soap_version="1.1")
        assert not outcome.ok
        assert outcome.permanent
        assert outcome.detail.startswith("refused")
        assert consumer.requests == []
    finally:
        consumer.stop()


def test_a_url_with_an_internationalised_name_and_path_is_sent_in_its_ascii_form(
    few_clients: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a browser sends it: the name in IDNA, the path's UTF-8 percent-encoded (sent as written,
    they were refused for good at every push, so the subscription only ever dead-lettered)."""
    consumer = _RawConsumer(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", close_after=False)
    port = consumer.url.split(":")[2].split("/")[0]
    resolver = lambda host, _port: ["127.0.0.1"] if host == "b\u00fccher.test" else []  # noqa: E731
    monkeypatch.setattr(push, "_policy", TargetPolicy(["127.0.0.0/8"], resolver=resolver))
    try:
        outcome = push.post(
            f"http://B\u00fccher.test:{port}/caf\u00e9/%41?q=\u00e9t\u00e9",
            b"<a/>",
            soap_version="1.1",
        )
        assert outcome.ok, outcome
        head = consumer.heads[0].decode("ascii")
        assert head.startswith("POST /caf%C3%A9/%41?q=%C3%A9t%C3%A9 HTTP/1.1\r\n")
        assert f"\r\nHost: xn--bcher-kva.test:{port}\r\n" in head
    finally:
        consumer.stop()


def test_a_push_sends_the_url_s_host_and_its_body_in_one_request(few_clients: None) -> None:
    consumer = _RawConsumer(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", close_after=False)
    try:
        body = b"<big>" + b"z" * 200_000 + b"</big>"
        assert push.post(consumer.url + "?k=v", body, soap_version="1.2").ok
        assert consumer.requests == [body]
        head = consumer.heads[0].decode()
        port = consumer.url.split(":")[2].split("/")[0]
        assert head.startswith("POST /c?k=v HTTP/1.1\r\n")
        assert f"\r\nHost: 127.0.0.1:{port}\r\n" in head
        assert "\r\nContent-Type: application/soap+xml" in head
    finally:
        consumer.stop()


def _exchange_with(chunks: list[bytes]) -> tuple[push._Answer, bool]:
    """The answer a connection reads when the consumer writes these pieces, one after another."""
    import socket

    ours, theirs = socket.socketpair()
    conn = push._Conn.__new__(push._Conn)
    conn.sock = ours
    conn.timeout = 10.0

    def consumer() -> None:
        theirs.recv(65536)
        for chunk in chunks:
            theirs.sendall(chunk)
            time.sleep(0.02)

    writer = threading.Thread(target=consumer)
    writer.start()
    try:
        return conn.exchange(b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"")
    finally:
        writer.join()
        ours.close()
        theirs.close()


def test_an_answer_that_begins_in_the_piece_of_an_interim_one_is_read_whole() -> None:
    answer, keep = _exchange_with(
        [b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 20", b"2 Accepted\r\nContent-Length: 2\r\n\r\nok"]
    )
    assert (answer.status, answer.body, keep) == (202, b"ok", True)


def test_what_a_consumer_sends_after_its_answer_is_not_read_as_another() -> None:
    answer, keep = _exchange_with(
        [
            b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy"
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        ]
    )
    assert (answer.status, answer.body) == (503, b"busy")
    assert not keep, "a connection with more than its answer on it is not used again"
