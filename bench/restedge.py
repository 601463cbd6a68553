#!/usr/bin/env python3
"""CPU per message of the REST publish edge against the SOAP Notify edge, in one process.

What each edge does before `notifications_accept` (which both then share), for the payloads of
`bench/e2e.py --rest`, one message per request and batches:

  REST   the JSON body parsed, each message's XML payload parsed by the hardened parser and
         assembled into a NotificationMessage (hpwsn/restpublish.py)
  SOAP   the Notify envelope parsed by the hardened parser and its NotificationMessages read
         (hpwsn/soap.py parse_request, hpwsn/wsn.py parse_notify)

CPU time (process_time), best of --rounds, so that other work on the machine counts less.

    .venv/bin/python -m bench.restedge [--rounds 15] [--batch 1 --batch 100]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from bench.e2e import NOTIFY_CT, TOPIC, notify_body, rest_body
from hpwsn import restpublish, soap, wsn

MAX_BYTES, MAX_DEPTH = 10 * 1024 * 1024, 64


def rest_edge(body: bytes) -> int:
    doc = json.loads(body)
    batch = doc.get("messages") or [doc]
    out = [
        restpublish.notification_of(
            topic=TOPIC, xml=m["xml"], max_bytes=MAX_BYTES, max_depth=MAX_DEPTH
        )
        for m in batch
    ]
    return len(out)


def soap_edge(body: bytes) -> int:
    req = soap.parse_request(body, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH, content_type=NOTIFY_CT)
    return len(wsn.parse_notify(req.body))


def cpu_us_per_message(fn: Callable[[bytes], int], bodies: list[bytes], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        n = sum(fn(b) for b in bodies)
        best = min(best, (time.process_time() - t0) / n)
    return best * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--batch", type=int, action="append", help="messages per request (1, 100)")
    p.add_argument("--messages", type=int, default=5000, help="messages per round")
    args = p.parse_args()
    print(f"{'messages/request':>16} {'REST us/msg':>12} {'SOAP us/msg':>12} {'REST/SOAP':>10}")
    for batch in args.batch or [1, 100]:
        requests = max(1, args.messages // batch)
        seqs = [range(i * batch, (i + 1) * batch) for i in range(requests)]
        rest = [rest_body(1, s, 0.0) for s in seqs]
        notify = [notify_body("http://127.0.0.1/wsn/", 1, s, 0.0) for s in seqs]
        assert rest_edge(rest[0]) == soap_edge(notify[0]) == batch
        r = cpu_us_per_message(rest_edge, rest, args.rounds)
        s = cpu_us_per_message(soap_edge, notify, args.rounds)
        print(f"{batch:>16} {r:>12.2f} {s:>12.2f} {r / s:>10.2f}")


if __name__ == "__main__":
    main()
