"""A peer that answers this site's calls as no HPwsn site would: what this site calls, reads and
keeps of it.

Each peer here is a small HTTP server on a loopback address that answers as the test scripts it.
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from dispatch import push, reliable
from federation.models import Link
from federation.peers import credentials_parse, peers_parse
from federation.services import PeerError, federation_peer_sync, federation_sync
from hpwsn import ns
from hpwsn.targets import TargetPolicy
from hpwsn_site import state
from tests.support import free_port, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Answer = Callable[[http.server.BaseHTTPRequestHandler, str, bytes], None]


def _soap(body: str) -> bytes:
    return (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}">'
        f"<s:Body>{body}</s:Body></s:Envelope>"
    ).encode()


def subscribe_response(reference: str) -> bytes:
    return _soap(
        f"<wsnt:SubscribeResponse><wsnt:SubscriptionReference><wsa:Address>{reference}"
        "</wsa:Address></wsnt:SubscriptionReference></wsnt:SubscribeResponse>"
    )


class FakePeer:
    """A peer on `host`: answers /healthz, and Subscribe with `reference` (its own address
    unless set), Renew and Unsubscribe as a site does; `answer`, when set, answers every SOAP
    call instead. Records each request (method, path, body)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        self.reference = f"{self.url}/wsn/subscriptions/1"
        self.answer: Answer | None = None
        self.requests: list[tuple[str, str, bytes]] = []
        self.authorization: list[str | None] = []  # each POST's Authorization header
        self.stopping = threading.Event()
        peer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                peer.requests.append(("GET", self.path, b""))
                if peer.answer is not None and self.path != "/healthz":
                    peer.answer(self, self.path, b"")
                    return
                self.reply(200, b"ok")

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                peer.requests.append(("POST", self.path, body))
                peer.authorization.append(self.headers.get("Authorization"))
                if peer.answer is not None:
                    peer.answer(self, self.path, body)
                elif b"<wsnt:Subscribe>" in body:
                    self.reply(200, subscribe_response(peer.reference))
                elif b"<wsnt:Renew>" in body:
                    self.reply(200, _soap("<wsnt:RenewResponse/>"))
                else:
                    self.reply(200, _soap("<wsnt:UnsubscribeResponse/>"))

            def reply(self, status: int, body: bytes, **headers: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/xml; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name.replace("_", "-"), value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def soap_calls(self) -> list[bytes]:
        return [body for method, _path, body in self.requests if method == "POST"]

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fakes() -> Iterator[Callable[..., FakePeer]]:
    made: list[FakePeer] = []

    def make(host: str = "127.0.0.1") -> FakePeer:
        made.append(FakePeer(host))
        return made[-1]

    yield make
    for fake in made:
        fake.stop()


@pytest.fixture
def site(settings):  # type: ignore[no-untyped-def]
    """This site is a, its site registry empty; each push target checked afresh."""
    from topics.services import topics_load_demo

    topics_load_demo()
    settings.HPWSN_SITE_NAME = "a"
    settings.HPWSN_FEDERATION_URL = "http://127.0.0.1:9"
    push._resolved.clear()
    r = state.get_redis()
    r.delete(state.FEDERATION_PEERS, state.FEDERATION_SYNC_LOCK)
    yield settings
    r.delete(state.FEDERATION_PEERS, state.FEDERATION_SYNC_LOCK)
    push._resolved.clear()


@pytest.fixture
def allow_only_127_0_0_1(monkeypatch):  # type: ignore[no-untyped-def]
    """The push allow-list (HPWSN_PUSH_ALLOW) admits 127.0.0.1 and nothing else here: an
    address on 127.0.0.3 stands for one of the site's internal network."""
    monkeypatch.setattr(push, "_policy", TargetPolicy(["127.0.0.1/32"]))
    monkeypatch.setattr(push, "_resolved", {})


def _subscriber_of(topic: str) -> None:
    from hpwsn.wsn import TopicRef
    from subscriptions.services import subscription_create
    from topics.acl import Principal

    subscription_create(
        consumer_address="http://127.0.0.1:9/own",
        topic=TopicRef(text=topic, dialect=ns.DIALECT_CONCRETE, nsmap={}),
        content=None,
        initial_termination_time=None,
        soap_version="1.1",
        use_raw=False,
        base_url="http://testserver",
        principal=Principal(name="admin1", groups=frozenset({"hpwsn-admins"})),
    )


def _registry(peer: str) -> dict[str, object]:
    raw = state.get_redis().hget(state.FEDERATION_PEERS, peer)
    return json.loads(raw) if raw else {}


# ----------------------------------------------------------------------------- references


@pytest.mark.parametrize(
    ("reference", "why"),
    [
        ("http://169.254.169.254/latest/meta-data/", "always refused"),
        ("internal", "outside the push allow-list"),
    ],
)
def test_a_subscription_reference_outside_the_push_allow_list_is_never_kept_nor_called(
    site, allow_only_127_0_0_1, fakes, reference, why
):
    b, internal = fakes(), fakes("127.0.0.3")
    b.reference = f"{internal.url}/admin/drop" if reference == "internal" else reference
    site.HPWSN_FEDERATION_PEERS = peers_parse(f"b={b.url}", own="a")
    peer = site.HPWSN_FEDERATION_PEERS[0]
    ttl = site.HPWSN_FEDERATION_LINK_TTL_S
    now = time.time()

    done = federation_peer_sync(peer=peer, interest={"ALL1": ("a",)}, now=now)

    assert done.linked == []
    assert "not called" in done.refused["ALL1"]
    assert why in done.refused["ALL1"]
    assert not Link.objects.exists()
    # The next rounds (past any renewal) ask again, and never call what the peer answered.
    federation_peer_sync(peer=peer, interest={"ALL1": ("a",)}, now=now + ttl)
    assert len([c for c in b.soap_calls() if b"<wsnt:Subscribe>" in c]) == 2
    assert internal.requests == []
    # The peer answers a reference the site may call: the link is made.
    b.reference = f"{b.url}/wsn/subscriptions/2"
    done = federation_peer_sync(peer=peer, interest={"ALL1": ("a",)}, now=now + 2 * ttl)
    assert (done.linked, done.refused) == (["ALL1"], {})
    assert Link.objects.get().reference == b.reference


def test_a_kept_reference_the_allow_list_refuses_is_not_called_and_the_link_is_made_again(
    site, allow_only_127_0_0_1, fakes
):
    """A link made before the allow-list changed (or whose host now resolves elsewhere): the
    round neither renews nor ends it there, makes the link again and says why."""
    b, internal = fakes(), fakes("127.0.0.3")
    site.HPWSN_FEDERATION_PEERS = peers_parse(f"b={b.url}", own="a")
    _subscriber_of("ALL1")
    now = time.time()
    federation_sync(now=now)
    link = Link.objects.get(topic_path="ALL1")
    Link.objects.filter(pk=link.pk).update(reference=f"{internal.url}/admin/renew")
    gone = Link.objects.create(
        peer="b",
        topic_path="ALL2",
        reference=f"{internal.url}/admin/end",
        expires_at=now + 300,
        interest_path=["a"],
        producer_filter=link.producer_filter,
        signed=True,
    )

    # Past half its life: due for renewal; ALL2 is wanted by nobody here any more.
    errors = federation_sync(now=now + site.HPWSN_FEDERATION_LINK_TTL_S)

    assert internal.requests == []
    assert list(Link.objects.values_list("topic_path", "reference")) == [("ALL1", b.reference)]
    assert not Link.objects.filter(pk=gone.pk).exists()
    rec = _registry("b")
    assert rec["links"] == ["ALL1"]
    assert str(rec["last_error"]).startswith("ALL1 refused: b answered the SubscriptionReference")
    assert "outside the push allow-list" in str(rec["last_error"])
    assert set(errors) == {"b"}


@pytest.mark.parametrize("elsewhere", [False, True], ids=["at the peer", "another host"])
def test_the_site_s_account_at_a_peer_goes_only_to_references_at_the_peer_s_own_origin(
    site, monkeypatch, fakes, elsewhere
):
    """A peer may answer a reference on another host the allow-list admits: the site renews
    and ends its link there, but without its password for the peer."""
    monkeypatch.setattr(push, "_policy", TargetPolicy(["127.0.0.0/8"]))
    b, other = fakes(), fakes("127.0.0.3")
    if elsewhere:
        b.reference = f"{other.url}/wsn/subscriptions/1"
    site.HPWSN_FEDERATION_PEERS = peers_parse(f"b={b.url}", own="a")
    site.HPWSN_FEDERATION_CREDENTIALS = credentials_parse("b=site-a:s3cret", peers=["b"])
    peer = site.HPWSN_FEDERATION_PEERS[0]
    now = time.time()

    assert federation_peer_sync(peer=peer, interest={"ALL1": ("a",)}, now=now).linked == ["ALL1"]
    federation_peer_sync(peer=peer, interest={"ALL1": ("a",)}, now=now + 200)  # renewed
    federation_peer_sync(peer=peer, interest={}, now=now + 210)  # ended

    basic = "Basic " + base64.b64encode(b"site-a:s3cret").decode()
    assert b.authorization[0] == basic  # the Subscribe, at the peer's configured URL
    at_reference = other if elsewhere else b
    calls = at_reference.soap_calls()[-2:]
    assert b"<wsnt:Renew>" in calls[0]
    assert b"<wsnt:Unsubscribe/>" in calls[1]
    assert at_reference.authorization[-2:] == ([None, None] if elsewhere else [basic, basic])


def test_a_redirect_or_an_entity_in_the_answer_leads_the_site_nowhere(
    site, allow_only_127_0_0_1, fakes
):
    b, internal = fakes(), fakes("127.0.0.3")
    site.HPWSN_FEDERATION_PEERS = peers_parse(f"b={b.url}", own="a")
    peer = site.HPWSN_FEDERATION_PEERS[0]

    def redirect(handler, path, body):  # type: ignore[no-untyped-def]
        handler.reply(307, b"", Location=f"{internal.url}/wsn/")

    b.answer = redirect
    with pytest.raises(PeerError, match="HTTP 307"):
        federation_peer_sync(peer=peer, interest={"ALL1": ("a",)}, now=time.time())

    entity = (
        f'<!DOCTYPE s:Envelope [<!ENTITY ref SYSTEM "{internal.url}/xxe">]>'.encode()
        + subscribe_response("&ref;")
    )
    b.answer = lambda handler, path, body: handler.reply(200, entity)
    with pytest.raises(PeerError, match="not SOAP"):
        federation_peer_sync(peer=peer, interest={"ALL1": ("a",)}, now=time.time())
    assert internal.requests == []
    assert not Link.objects.exists()


# ----------------------------------------------------------------------------- answers


def _chunked(handler: http.server.BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/xml; charset=utf-8")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()


def test_a_peer_answering_a_byte_at_a_time_does_not_hold_the_round_for_the_other_peers(site, fakes):
    """Each read comes well within the read timeout, so only a bound on the whole call ends it."""
    b, c = fakes(), fakes()
    site.HPWSN_FEDERATION_PEERS = peers_parse(f"b={b.url},c={c.url}", own="a")
    _subscriber_of("ALL1")

    def dribble(handler, path, body):  # type: ignore[no-untyped-def]
        _chunked(handler)
        while not b.stopping.wait(0.2):
            handler.wfile.write(b"1\r\n \r\n")
            handler.wfile.flush()

    b.answer = dribble  # its /healthz answers; its SOAP endpoint dribbles
    done = threading.Event()

    def round_() -> None:
        from django.db import connection

        try:
            federation_sync()
        finally:
            connection.close()
            done.set()

    threading.Thread(target=round_, daemon=True).start()
    assert wait_until(done.is_set, timeout=60), "the round is held by the peer that dribbles"
    assert _registry("c")["links"] == ["ALL1"]
    assert "no whole answer within" in str(_registry("b")["last_error"])


def test_an_endless_answer_is_not_read_past_a_bound(site, fakes):
    b = fakes()
    site.HPWSN_FEDERATION_PEERS = peers_parse(f"b={b.url}", own="a")
    limit = 64 << 20  # what the peer sends at most, if the site reads on
    sent = {"bytes": 0}
    finished = threading.Event()
    chunk = b"x" * 65536

    def endless(handler, path, body):  # type: ignore[no-untyped-def]
        try:
            _chunked(handler)
            while sent["bytes"] < limit and not b.stopping.is_set():
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent["bytes"] += len(chunk)
        except OSError:  # the site hung up
            pass
        finally:
            finished.set()

    b.answer = endless
    with pytest.raises(PeerError):
        federation_peer_sync(
            peer=site.HPWSN_FEDERATION_PEERS[0], interest={"ALL1": ("a",)}, now=time.time()
        )
    assert not Link.objects.exists()
    assert wait_until(finished.is_set, timeout=30)
    # The site stopped reading: what the peer got rid of is a megabyte and the sockets' buffers.
    assert sent["bytes"] < limit // 4


# ----------------------------------------------------------------------------- pushes


def test_a_signed_push_sent_again_while_its_signature_holds_is_not_stored_again(site):
    """Someone who recorded a push (a proxy, a log) sends it again, byte for byte, after the dedup
    window has passed but within the five minutes its signature holds."""
    from django.test import Client

    from dispatch.models import StoredMessage
    from dispatch.push import signature_headers
    from federation.peers import inbound_token, link_signing_secret

    site.HPWSN_DEDUP_WINDOW_S = 1
    site.HPWSN_FEDERATION_PEERS = peers_parse("b=http://127.0.0.1:9", own="a")
    Link.objects.create(  # this site asked b for ALL1
        peer="b",
        topic_path="ALL1",
        reference="http://127.0.0.1:9/wsn/subscriptions/1",
        expires_at=time.time() + 300,
        interest_path=["a"],
        signed=True,
    )
    path = f"/federation/in/b/{inbound_token(site.SECRET_KEY, 'b')}/"
    nid = uuid.uuid4().hex
    body = (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}" xmlns:hpwsn="{ns.HPWSN}">'
        f'<s:Body><wsnt:Notify><wsnt:NotificationMessage><wsnt:Topic Dialect="{ns.DIALECT_COLON}">'
        f"ALL1</wsnt:Topic><wsnt:Message><n>{nid}</n></wsnt:Message></wsnt:NotificationMessage>"
        f"<hpwsn:MessageIds><hpwsn:Id>{nid}</hpwsn:Id></hpwsn:MessageIds></wsnt:Notify>"
        "</s:Body></s:Envelope>"
    ).encode()
    signed = signature_headers(link_signing_secret(site.SECRET_KEY, "b"), f"msg_{nid}", body)
    headers = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in signed.items()}
    sent_at = time.time()

    def send() -> int:
        return Client().post(path, data=body, content_type="text/xml", **headers).status_code

    assert send() == 202
    (seq,) = StoredMessage.objects.values_list("seq", flat=True)
    # The window passes, the fan-out has passed the message and the checkpoint prunes the log.
    assert wait_until(lambda: time.time() > sent_at + 2, timeout=10)
    r = state.get_redis()
    r.set(state.EPOCH, repr(time.time()), nx=True)
    r.set(state.FANOUT_SEQ, seq)
    reliable.checkpoint_run()
    assert not StoredMessage.objects.exists()

    assert send() == 202
    assert not StoredMessage.objects.exists()
