"""Real parts for integration tests: the running platform, HTTP consumers, SOAP calls."""

from __future__ import annotations

import contextlib
import http.server
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from lxml import etree

from hpwsn import ns

SOAP_NS = {"1.1": ns.SOAP11, "1.2": ns.SOAP12}
CT = {"1.1": "text/xml; charset=utf-8", "1.2": "application/soap+xml; charset=utf-8"}
NSMAP = {"wsnt": ns.WSNT, "wsa": ns.WSA, "s11": ns.SOAP11, "s12": ns.SOAP12, "wsrf-bf": ns.WSRF_BF}


_ports_given: set[int] = set()


def free_port() -> int:
    """A free port never handed out before in this test session: a consumer on a reused port
    would receive what the platform still pushes to an earlier test's subscription there."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _ports_given:
            _ports_given.add(port)
            return port


def wait_until(predicate, timeout: float = 15.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def wait_or_fail(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    """Wait like wait_until; fail the test, naming what never came, on a timeout."""
    if not wait_until(predicate, timeout, 0.1):
        raise AssertionError(f"timed out waiting for {what}")


@dataclass
class SoapResult:
    status: int
    body: bytes
    root: etree._Element | None
    headers: dict[str, str] = field(default_factory=dict)  # HTTP's, names in lower case

    def find(self, path: str) -> etree._Element | None:
        return None if self.root is None else self.root.find(path, NSMAP)

    def findtext(self, path: str) -> str | None:
        el = self.find(path)
        return None if el is None else (el.text or "").strip()

    @property
    def fault_name(self) -> str | None:
        """The local name of the WSN fault element in the detail, or 'Client'/'Sender' codes."""
        if self.root is None:
            return None
        for detail in self.root.iter("detail", f"{{{ns.SOAP12}}}Detail"):
            for child in detail:
                return etree.QName(child).localname
        return None

    @property
    def fault_text(self) -> str:
        if self.root is None:
            return ""
        for tag in ("faultstring", f"{{{ns.SOAP12}}}Text"):
            for el in self.root.iter(tag):
                return el.text or ""
        return ""


def soap_call(
    url: str,
    body_xml: str,
    *,
    version: str = "1.1",
    to: str | None = None,
    headers_xml: str = "",
    message_id: str | None = None,
) -> SoapResult:
    """POST a SOAP envelope around `body_xml` (which declares wsnt/wsa itself or uses these)."""
    env = SOAP_NS[version]
    mid = message_id or f"urn:uuid:{uuid.uuid4()}"
    header = f"<wsa:MessageID>{mid}</wsa:MessageID>"
    if to:
        header += f"<wsa:To>{to}</wsa:To>"
    data = (
        f'<s:Envelope xmlns:s="{env}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}">'
        f"<s:Header>{header}{headers_xml}</s:Header><s:Body>{body_xml}</s:Body></s:Envelope>"
    ).encode()
    resp = httpx.post(url, content=data, headers={"Content-Type": CT[version]}, timeout=30)
    root = etree.fromstring(resp.content) if resp.content.strip().startswith(b"<") else None
    return SoapResult(resp.status_code, resp.content, root)


@dataclass
class Received:
    soap_version: str
    message_id: str | None
    to: str | None
    topic: str | None
    topic_nsmap: dict[str, str]
    subscription_address: str | None
    payload: etree._Element | None
    raw: bytes


@dataclass
class RecordingConsumer:
    """A real HTTP consumer on 127.0.0.1 that records every NotificationMessage it receives."""

    fail_first: int = 0  # answer the first N POSTs with `fail_status`
    fail_containing: bytes = b""  # and every POST whose body contains this
    fail_status: int = 503
    retry_after: str | None = None
    fail_body: bytes = b""  # the body of a failing answer (the broker keeps an excerpt)
    delay: float = 0.0  # seconds to take over each POST (a slow consumer)
    first_delay: float = 0.0  # seconds to take over the first POST only
    inflight: int = 0  # messages being received right now
    max_inflight: int = 0  # the most messages it was ever receiving at once
    port: int = field(default_factory=free_port)
    received: list[Received] = field(default_factory=list)
    posts: list[tuple[float, int]] = field(default_factory=list)  # (time, status answered)
    headers: list[dict[str, str]] = field(default_factory=list)  # of each POST answered 2xx
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/consumer"

    def start(self) -> RecordingConsumer:
        consumer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with consumer.lock:
                    first, consumer.first_delay = consumer.first_delay, 0.0
                time.sleep(first)
                if consumer.delay:
                    count = body.count(b"NotificationMessage>") // 2 or 1
                    with consumer.lock:
                        consumer.inflight += count
                        consumer.max_inflight = max(consumer.max_inflight, consumer.inflight)
                    time.sleep(consumer.delay)
                    with consumer.lock:
                        consumer.inflight -= count
                with consumer.lock:
                    failing = len(consumer.posts) < consumer.fail_first or bool(
                        consumer.fail_containing and consumer.fail_containing in body
                    )
                    status = consumer.fail_status if failing else 200
                    consumer.posts.append((time.time(), status))
                    if not failing:
                        consumer.headers.append({k.lower(): v for k, v in self.headers.items()})
                        consumer.received.extend(parse_push(body, self.headers))
                answer = consumer.fail_body if failing else b""
                self.send_response(status)
                if failing and consumer.retry_after:
                    self.send_header("Retry-After", consumer.retry_after)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def payload_texts(self) -> list[str]:
        with self.lock:
            return [
                "".join(r.payload.itertext()) if r.payload is not None else ""
                for r in self.received
            ]

    def wait_for(self, count: int, timeout: float = 20.0) -> bool:
        return wait_until(lambda: len(self.received) >= count, timeout)


def parse_push(body: bytes, headers: object) -> list[Received]:
    root = etree.fromstring(body)
    version = "1.2" if root.tag == f"{{{ns.SOAP12}}}Envelope" else "1.1"
    if root.tag not in (f"{{{ns.SOAP11}}}Envelope", f"{{{ns.SOAP12}}}Envelope"):
        return [Received("raw", None, None, None, {}, None, root, body)]
    mid = root.findtext(".//wsa:MessageID", namespaces=NSMAP)
    to = root.findtext(".//wsa:To", namespaces=NSMAP)
    out = []
    for nm in root.iterfind(".//wsnt:NotificationMessage", NSMAP):
        topic = nm.find("wsnt:Topic", NSMAP)
        message = nm.find("wsnt:Message", NSMAP)
        payload = (
            next((c for c in message if isinstance(c.tag, str)), None)
            if message is not None
            else None
        )
        out.append(
            Received(
                soap_version=version,
                message_id=mid,
                to=to,
                topic=(topic.text or "").strip() if topic is not None else None,
                topic_nsmap=dict(topic.nsmap) if topic is not None else {},
                subscription_address=nm.findtext(
                    "wsnt:SubscriptionReference/wsa:Address", namespaces=NSMAP
                ),
                payload=payload,
                raw=body,
            )
        )
    return out


def subscribe_xml(
    consumer: str,
    topic: str | None,
    *,
    dialect: str = ns.DIALECT_SIMPLE,
    nsdecl: str = "",
    termination: str | None = None,
    extra: str = "",
) -> str:
    filt = ""
    if topic is not None:
        filt = (
            f'<wsnt:Filter><wsnt:TopicExpression Dialect="{dialect}"{nsdecl}>{topic}'
            f"</wsnt:TopicExpression>{extra}</wsnt:Filter>"
        )
    term = (
        f"<wsnt:InitialTerminationTime>{termination}</wsnt:InitialTerminationTime>"
        if termination
        else ""
    )
    return (
        f"<wsnt:Subscribe><wsnt:ConsumerReference><wsa:Address>{consumer}</wsa:Address>"
        f"</wsnt:ConsumerReference>{filt}{term}</wsnt:Subscribe>"
    )


def notify_xml(
    *messages: tuple[str, str], dialect: str = ns.DIALECT_SIMPLE, nsdecl: str = ""
) -> str:
    parts = "".join(
        f'<wsnt:NotificationMessage><wsnt:Topic Dialect="{dialect}"{nsdecl}>{topic}</wsnt:Topic>'
        f"<wsnt:Message>{payload}</wsnt:Message></wsnt:NotificationMessage>"
        for topic, payload in messages
    )
    return f"<wsnt:Notify>{parts}</wsnt:Notify>"


ANONYMOUS_ALLOWED = {"anonymous_publish": True, "anonymous_subscribe": True}


def topic_with_policy(
    path: str, *, root: dict[str, object] | None = None, **fields: object
) -> None:
    """Create a topic (and its ancestors) and set policy fields on it and on its root, in one
    transaction: a process that reloads the tree never sees the topic without its policy.

    Run it through the `committed` fixture so that the platform's processes see it.
    """
    from django.db import transaction

    from hpwsn_site import state
    from topics.models import Topic
    from topics.services import topic_create

    with transaction.atomic():
        topic_create(path=path)
        if root:
            Topic.objects.filter(path=path.split(":", 1)[0]).update(**root)
        if fields:
            Topic.objects.filter(path=path).update(**fields)
        transaction.on_commit(lambda: state.bump(state.VERSION_TOPICS))


class HoldingRelay:
    """A TCP relay to a server on 127.0.0.1 that can hold what the server sends back.

    While held, the server's replies stop in the relay (and in the socket buffers behind it)
    and reach the client, in order, when released: a network between two sites that stops
    for a while without dropping the connection.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._flowing = threading.Event()
        self._flowing.set()
        self._conns: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._flowing.set()
        self._listener.close()
        for conn in self._conns:
            conn.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:  # the server is not up yet: the client finds it closed, and retries
                client.close()
                continue
            self._conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, holdable: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if holdable:
                    self._flowing.wait()
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def database_sessions() -> int:
    """Connections PostgreSQL has accepted to the test database since it started."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def on_embedded_database(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    """Run `script` (after django.setup()) in a process of its own on a new, migrated SQLite
    database in tmp_path (the default database; the tests' own is PostgreSQL under make test)."""
    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "hpwsn_site.settings",
        "HPWSN_DATA_DIR": str(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'hpwsn.sqlite3'}",
        "HPWSN_EVENTS": "0",
    }
    run: dict[str, Any] = {"cwd": root, "env": env, "capture_output": True, "text": True}
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], check=True, **run)
    return subprocess.run([sys.executable, "-c", "import django; django.setup()\n" + script], **run)


def in_own_thread(fn: Callable[[], Any]) -> Any:
    """Run `fn` in a thread of its own, with its own autocommit database connection; its value,
    or its exception raised here.

    A WebSocket consumer's session lookup (channels' database_sync_to_async) closes "old"
    connections; on the test's own connection, inside the test's transaction, that would end it.
    A thread of its own also makes the lookup see only committed rows, as a real server would.
    """
    out: dict[str, Any] = {}

    def target() -> None:
        from django.db import connection

        try:
            out["value"] = fn()
        except BaseException as exc:  # re-raised in the test's thread
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


def console_login(base_url: str, username: str, password: str) -> httpx.Client:
    """A client logged in through the console's login form, as a browser would be."""
    client = httpx.Client(base_url=base_url, timeout=30)
    client.get("/console/login/")  # sets the CSRF cookie
    r = client.post(
        "/console/login/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
        headers={"Origin": base_url},
    )
    assert r.status_code == 302, r.text[:300]
    assert "sessionid" in client.cookies
    return client


def subscription_made(
    consumer: str, topic: str, principal: Any, *, termination: str | None = None
) -> tuple[Any, bool]:
    """subscription_create as a SOAP Subscribe on a concrete topic calls it (in process)."""
    from hpwsn.wsn import TopicRef
    from subscriptions.services import subscription_create

    return subscription_create(
        consumer_address=consumer,
        topic=TopicRef(text=topic, dialect=None, nsmap={}),
        content=None,
        initial_termination_time=termination,
        soap_version="1.1",
        use_raw=False,
        base_url="http://testserver",
        principal=principal,
    )


def make_run_env(data_dir: Path, **extra: str) -> tuple[dict[str, str], dict[str, int]]:
    """The environment of a `make run` of its own (scripts/run.sh): free ports, its data dir, and
    none of the test platform's services; with the ports it listens on."""
    ports = {"http": free_port(), "redis": free_port(), "ldap": free_port()}
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REDIS_URL", "DATABASE_URL", "LDAP_URL") and not k.startswith("HPWSN_")
    }
    env.update(
        HPWSN_HTTP_PORT=str(ports["http"]),
        HPWSN_REDIS_PORT=str(ports["redis"]),
        HPWSN_LDAP_PORT=str(ports["ldap"]),
        HPWSN_DATA_DIR=str(data_dir),
        **extra,
    )
    return env, ports
