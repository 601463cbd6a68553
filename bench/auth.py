"""What authenticating a SOAP caller adds to a Notify, in process (no HTTP, no worker).

    .venv/bin/python -m bench.auth --redis-url redis://127.0.0.1:6379/11 [--n 2000]

Starts its own slapd (the demo directory) and an SQLite database in a temporary directory, and
uses the Redis database given (it is flushed: never give database 0). For each way of calling
(anonymous, HTTP Basic, wsse PasswordText, wsse PasswordDigest with a fresh nonce per request)
it times `hpwsn_site.soap.soap_exchange` on a one-message Notify, and `hpwsn_site.auth.
authenticate` alone, after a warm-up that fills the credential cache; and counts the requests
that reached the directory during the timed calls.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import django_in_process, spare_redis_url

TOPIC = "ALL:ALARM:ALARM1"
USER = "publisher1"


def envelope(token: Any = None) -> bytes:
    from lxml import etree

    from hpwsn import ns

    env = etree.fromstring(
        f'<s:Envelope xmlns:s="{ns.SOAP12}" xmlns:wsnt="{ns.WSNT}" xmlns:wsa="{ns.WSA}">'
        f"<s:Header><wsa:MessageID>urn:uuid:{uuid.uuid4()}</wsa:MessageID></s:Header><s:Body>"
        f'<wsnt:Notify><wsnt:NotificationMessage><wsnt:Topic Dialect="{ns.DIALECT_SIMPLE}">'
        f"{TOPIC}</wsnt:Topic><wsnt:Message><m xmlns='urn:bench'>1</m></wsnt:Message>"
        "</wsnt:NotificationMessage></wsnt:Notify></s:Body></s:Envelope>"
    )
    if token is not None:
        env, _headers = token.apply(env, {})
    return etree.tostring(env)


async def run(
    n: int, password: str, rounds: int = 10
) -> tuple[list[tuple[str, float, float]], int]:
    from zeep.wsse.username import UsernameToken

    from hpwsn.soap import parse_request
    from hpwsn_site import auth, state
    from hpwsn_site.soap import soap_exchange

    asked = 0
    verify = auth.directory_verify

    def counting(credentials: Any) -> Any:
        nonlocal asked
        asked += 1
        return verify(credentials)

    auth.directory_verify = counting  # type: ignore[assignment]
    basic = "Basic " + base64.b64encode(f"{USER}:{password}".encode()).decode()
    ct = "application/soap+xml; charset=utf-8"
    # Every request is a new envelope (its own wsa:MessageID, which is the Notify's idempotency
    # key, and its own nonce for digests); the credentials stay the same.
    total = n + 50
    modes: dict[str, tuple[list[bytes], str | None]] = {
        "anonymous": ([envelope() for _ in range(total)], None),
        "http-basic": ([envelope() for _ in range(total)], basic),
        "wsse-text": ([envelope(UsernameToken(USER, password)) for _ in range(total)], None),
        "wsse-digest": (
            [envelope(UsernameToken(USER, password, use_digest=True)) for _ in range(total)],
            None,
        ),
    }
    for bodies, authorization in modes.values():  # warm-up: caches, connections, the tree
        for data in bodies[:50]:
            ex = await soap_exchange(
                data=data, ctype=ct, base="http://b", resource_id=None, authorization=authorization
            )
            assert ex.status == 202, ex.body[:500]
    digests = [envelope(UsernameToken(USER, password, use_digest=True)) for _ in range(n)]
    securities = {
        name: [
            parse_request(d, max_bytes=10**7, max_depth=64, content_type=ct).security
            for d in (digests if name == "wsse-digest" else bodies[50:])
        ]
        for name, (bodies, _authorization) in modes.items()
    }
    exchange_s = dict.fromkeys(modes, 0.0)
    auth_s = dict.fromkeys(modes, 0.0)
    asked = 0
    # Rounds of every mode in turn, so a drift of the shared machine spreads over all of them.
    step = max(1, n // rounds)
    for start in range(0, n, step):
        for name, (bodies, authorization) in modes.items():
            t0 = time.perf_counter()
            for data in bodies[50 + start : 50 + start + step]:
                await soap_exchange(
                    data=data,
                    ctype=ct,
                    base="http://b",
                    resource_id=None,
                    authorization=authorization,
                )
            exchange_s[name] += time.perf_counter() - t0
            t0 = time.perf_counter()
            for security in securities[name][start : start + step]:
                await auth.authenticate(
                    security=security, authorization=authorization, client="127.0.0.1"
                )
            auth_s[name] += time.perf_counter() - t0
    rows = [(name, exchange_s[name] / n * 1e6, auth_s[name] / n * 1e6) for name in modes]
    # One Redis SET NX round trip, the part of a digest check that is not CPU in this process.
    r = state.get_async_redis()
    t0 = time.perf_counter()
    for i in range(n):
        await r.set(f"{state.PREFIX}bench:{i}", b"1", nx=True, px=60_000)
    rows.append(("redis SET NX", float("nan"), (time.perf_counter() - t0) / n * 1e6))
    return rows, asked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument(
        "--reliability",
        choices=["fast", "reliable"],
        default="fast",
        help="policy of the demo root ALL (reliable adds a database commit per Notify)",
    )
    args = parser.parse_args()
    redis_url = spare_redis_url(args.redis_url)
    from directory.slapdctl import Instance, port_open

    tmp = Path(tempfile.mkdtemp(prefix="hpwsn-bench-auth-"))
    port = next(p for p in range(39000, 39100) if not port_open(p))
    slapd = Instance(data_dir=tmp / "slapd", port=port)
    slapd.prepare()
    slapd.start()
    try:
        os.environ.update(slapd.env)
        django_in_process(tmp, redis_url)
        from hpwsn_site import state
        from topics.models import Topic
        from topics.services import topics_load_demo

        state.get_redis().flushdb()
        topics_load_demo()
        Topic.objects.filter(path="ALL").update(reliability=args.reliability)
        rows, asked = asyncio.run(run(args.n, slapd.demo_password(USER)))
        state.get_redis().flushdb()
    finally:
        slapd.stop()
    print(f"{'caller':<14} {'Notify (µs)':>12} {'authenticate (µs)':>18}")
    for name, exchange_us, auth_us in rows:
        print(f"{name:<14} {exchange_us:>12.0f} {auth_us:>18.1f}")
    print(
        f"{args.n} calls each after 50 warm-up calls, topic policy {args.reliability}, "
        f"{os.cpu_count()} CPUs; directory requests during the timed calls: {asked}"
    )


if __name__ == "__main__":
    main()
