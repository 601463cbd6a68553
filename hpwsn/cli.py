"""`python -m hpwsn`: publish, subscribe, listen and manage subscriptions from a shell."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from types import FrameType
from urllib.parse import urlsplit

import httpx

from hpwsn import __version__
from hpwsn.client import ReceivedMessage, WsnClient, WsnClientError, WsnFaultError

DEFAULT_ENDPOINT = "http://127.0.0.1:8000/wsn/"
EXIT_FAULT = 2  # the broker answered with a SOAP fault
EXIT_ERROR = 1  # anything else went wrong (unreachable, HTTP error, bad arguments)


def _namespaces(pairs: Sequence[str] | None) -> dict[str, str] | None:
    if not pairs:
        return None
    out = {}
    for pair in pairs:
        prefix, sep, uri = pair.partition("=")
        if not sep or not uri:
            raise SystemExit(f"--ns expects PREFIX=URI, not '{pair}'")
        out[prefix] = uri
    return out


def _line(message: ReceivedMessage) -> str:
    payload = message.payload.decode(errors="replace").replace("\r", "").replace("\n", "\\n")
    return f"{message.topic or '-'}\t{payload}"


def _client(args: argparse.Namespace) -> WsnClient:
    return WsnClient(
        args.endpoint,
        soap_version=args.soap_version,
        timeout=args.timeout,
        username=args.username,
        password=args.password,
        max_in_flight=getattr(args, "concurrency", 64),
    )


# ----------------------------------------------------------------------------- commands


def cmd_publish(args: argparse.Namespace) -> int:
    namespaces = _namespaces(args.ns)
    with _client(args) as client:
        if args.count <= 1:
            client.notify(args.topic, args.message, dialect=args.dialect, namespaces=namespaces)
            print("sent 1")
            return 0
        failed = 0
        first_error: list[BaseException] = []
        lock = threading.Lock()

        def done(future: Future[None]) -> None:
            nonlocal failed
            exc = future.exception()
            if exc is not None:
                with lock:
                    failed += 1
                    if not first_error:
                        first_error.append(exc)

        started = time.perf_counter()
        for n in range(args.count):
            client.notify_async(
                args.topic,
                args.message.replace("{n}", str(n)),
                dialect=args.dialect,
                namespaces=namespaces,
                callback=done,
            )
        client.flush()
        elapsed = time.perf_counter() - started
    rate = args.count / elapsed if elapsed > 0 else float("inf")
    print(
        f"sent {args.count - failed}, failed {failed}, {rate:.0f} msgs/s ({elapsed:.2f} s, "
        f"{args.concurrency} in flight)"
    )
    if first_error:
        print(f"first error: {_describe(first_error[0])}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def cmd_subscribe(args: argparse.Namespace) -> int:
    with _client(args) as client:
        sub = client.subscribe(
            args.consumer,
            args.topic,
            dialect=args.dialect,
            namespaces=_namespaces(args.ns),
            message_content=args.filter,
            termination=args.termination,
            use_raw=args.raw,
        )
    print(sub.address)
    return 0


def cmd_unsubscribe(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.unsubscribe(args.address)
    return 0


def cmd_renew(args: argparse.Namespace) -> int:
    with _client(args) as client:
        termination = client.renew(args.address, args.termination)
    print(termination.isoformat() if termination else "never")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.pause(args.address)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    with _client(args) as client:
        client.resume(args.address)
    return 0


def cmd_current(args: argparse.Namespace) -> int:
    with _client(args) as client:
        payload = client.get_current_message(
            args.topic, dialect=args.dialect, namespaces=_namespaces(args.ns)
        )
    print(payload.decode(errors="replace"))
    return 0


def cmd_pull_point(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.action == "create":
            print(client.create_pull_point())
        elif args.action == "get":
            for message in client.get_messages(args.address, args.max):
                print(_line(message))
        else:
            client.destroy_pull_point(args.address)
    return 0


def cmd_listen(args: argparse.Namespace) -> int:
    from hpwsn.consumer import ConsumerServer  # aiohttp is only needed here

    stop = threading.Event()

    def on_message(message: ReceivedMessage) -> None:
        print(_line(message), flush=True)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_signal)
    with (
        # Each message printed as it comes, none kept: a listener runs for as long as it is left.
        ConsumerServer(
            args.host, args.port, on_message=on_message, public_url=args.advertise, keep=0
        ) as cs,
        _client(args) as client,
    ):
        sub = client.subscribe(
            cs.url,
            args.topic,
            dialect=args.dialect,
            namespaces=_namespaces(args.ns),
            message_content=args.filter,
            termination=args.termination,
            use_raw=args.raw,
        )
        print(f"listening on {cs.url}, subscription {sub.address}", file=sys.stderr, flush=True)
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            try:
                client.unsubscribe(sub.address)
                print("unsubscribed", file=sys.stderr)
            except WsnClientError as exc:
                print(f"could not unsubscribe: {_describe(exc)}", file=sys.stderr)
    return 0


def topics_url(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    return f"{parts.scheme}://{parts.netloc}/api/v1/topics"


def cmd_topics(args: argparse.Namespace) -> int:
    url = topics_url(args.endpoint)
    auth = (args.username, args.password or "") if args.username else None
    try:
        resp = httpx.get(
            url, timeout=args.timeout, auth=auth, headers={"Accept": "application/json"}
        )
    except httpx.HTTPError as exc:
        print(f"error: cannot reach {url}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if resp.status_code == 404:
        print(f"the REST API is not available at {url} (HTTP 404)", file=sys.stderr)
        return EXIT_ERROR
    if resp.status_code >= 400:
        print(f"error: HTTP {resp.status_code} from {url}: {resp.text[:200]}", file=sys.stderr)
        return EXIT_ERROR
    try:
        print(json.dumps(resp.json(), indent=2, ensure_ascii=False))
    except ValueError:
        print(resp.text)
    return 0


# ----------------------------------------------------------------------------- parser


def _topic_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dialect",
        help="simple, concrete, full, colon or a dialect URI (default: guessed from the topic)",
    )
    p.add_argument(
        "--ns",
        action="append",
        metavar="PREFIX=URI",
        help="declare a namespace prefix used by the topic (repeatable)",
    )


def _subscription_options(p: argparse.ArgumentParser) -> None:
    _topic_options(p)
    p.add_argument("--termination", help="xsd:duration (PT1H) or dateTime; default: the broker's")
    p.add_argument("--filter", metavar="XPATH", help="MessageContent XPath filter")
    p.add_argument("--raw", action="store_true", help="ask for raw delivery (UseRaw)")


def _connection_options(p: argparse.ArgumentParser, *, defaults: bool) -> None:
    # Declared on the main parser (with defaults) and again on every command (without), so that
    # `--endpoint` works before or after the command name.
    def d(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    p.add_argument(
        "--endpoint",
        default=d(os.environ.get("HPWSN_ENDPOINT", DEFAULT_ENDPOINT)),
        help=f"broker SOAP endpoint (env HPWSN_ENDPOINT; default {DEFAULT_ENDPOINT})",
    )
    p.add_argument("--soap-version", choices=("1.1", "1.2"), default=d("1.1"))
    p.add_argument("--timeout", type=float, default=d(10.0), help="seconds per request")
    p.add_argument("--username", default=d(os.environ.get("HPWSN_USERNAME")))
    p.add_argument("--password", default=d(os.environ.get("HPWSN_PASSWORD")))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpwsn", description="WS-Notification client for the HPwsn broker."
    )
    parser.add_argument("--version", action="version", version=f"hpwsn {__version__}")
    _connection_options(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _connection_options(common, defaults=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("publish", parents=[common], help="publish a message (Notify)")
    p.add_argument("topic")
    p.add_argument("message", help="an XML element or text; {n} is replaced by the sequence no.")
    p.add_argument("--count", type=int, default=1, help="send N times, asynchronously")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight (--count)")
    _topic_options(p)
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser(
        "subscribe", parents=[common], help="subscribe a consumer; prints the subscription address"
    )
    p.add_argument("topic")
    p.add_argument("--consumer", required=True, metavar="URL", help="consumer or pull point URL")
    _subscription_options(p)
    p.set_defaults(func=cmd_subscribe)

    for name, func, text in (
        ("unsubscribe", cmd_unsubscribe, "delete a subscription"),
        ("pause", cmd_pause, "pause a subscription"),
        ("resume", cmd_resume, "resume a paused subscription"),
    ):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("address", help="subscription address")
        p.set_defaults(func=func)

    p = sub.add_parser("renew", parents=[common], help="set a new termination time")
    p.add_argument("address", help="subscription address")
    p.add_argument("termination", help="xsd:duration (PT1H) or dateTime")
    p.set_defaults(func=cmd_renew)

    p = sub.add_parser("listen", parents=[common], help="receive pushes on TOPIC until Ctrl-C")
    p.add_argument("topic")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--advertise", metavar="URL", help="consumer URL to give the broker")
    _subscription_options(p)
    p.set_defaults(func=cmd_listen)

    p = sub.add_parser("pull-point", parents=[common], help="create, read or destroy a pull point")
    pp = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    pp.add_parser("create", parents=[common], help="create a pull point; prints its address")
    g = pp.add_parser("get", parents=[common], help="take queued messages (GetMessages)")
    g.add_argument("address")
    g.add_argument("--max", type=int, default=None, help="at most N messages")
    d = pp.add_parser("destroy", parents=[common], help="destroy a pull point")
    d.add_argument("address")
    p.set_defaults(func=cmd_pull_point)

    p = sub.add_parser(
        "current", parents=[common], help="print the last message on TOPIC (GetCurrentMessage)"
    )
    p.add_argument("topic")
    _topic_options(p)
    p.set_defaults(func=cmd_current)

    p = sub.add_parser("topics", parents=[common], help="list topics (REST API /api/v1/topics)")
    p.set_defaults(func=cmd_topics)
    return parser


def _describe(exc: BaseException) -> str:
    if isinstance(exc, WsnFaultError):
        return f"{exc.fault_name}: {exc.message}"
    return str(exc) or exc.__class__.__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; 0 on success, 2 for a SOAP fault, 1 for any other error."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except WsnFaultError as exc:
        print(f"{exc.fault_name}: {exc.message}", file=sys.stderr)
        return EXIT_FAULT
    except (WsnClientError, ValueError, OSError) as exc:
        print(f"error: {_describe(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
