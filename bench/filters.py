#!/usr/bin/env python3
"""SQL-like content filters: evaluation cost, the filter index against linear evaluation, and
end to end with 1,000 filtered subscriptions against the same run without them.

In process (no server; hpwsn/sqlfilter.py and subscriptions/filterindex.py are pure Python):

  seed002   seed 002's table 1: no filter, a simple filter (3 nodes) and a complex one (15
            nodes, five times as many), on a simple and a complex data type; microseconds per
            evaluation, each on a fresh message (its fields read from the XML), with the same
            conditions as XPath 1.0 (lxml) beside them
  index     100,000 subscriptions on one topic, equality filters on a field with 1,000 distinct
            values (about 100 match each message); then the same with a range conjunct; one
            message's fan-out through the index and by evaluating every filter, same run

With --e2e, end to end through a private platform started as bench/e2e.py starts it: the e2e
publisher and consumer, rounds without and with 1,000 SQL-filtered subscriptions on the published
topic (ABBA order, so a drift of the machine cancels out), throughput side by side.

    .venv/bin/python -m bench.filters [--subscriptions 100000] [--values 1000] [--json f]
    .venv/bin/python -m bench.filters --e2e [--filtered 1000] [--duration 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lxml import etree

from hpwsn import ns
from hpwsn.sqlfilter import DIALECT, CompiledFilter, _parse, compile_filter, message_of
from subscriptions.filterindex import FilterIndex, linear_matching

M = f'<wsnt:Message xmlns:wsnt="{ns.WSNT}">%s</wsnt:Message>'

# Seed 002, table 1: a simple data type (a few fields) and a complex one (nested, many fields).
SIMPLE_DATA = M % (
    "<quote><StockCode>AAPL</StockCode><price>190.5</price><volume>1200</volume>"
    "<halted>false</halted></quote>"
)
COMPLEX_DATA = M % (
    "<quote><header><source>SSE</source><seq>981234</seq><sent>2026-11-24T01:00:00Z</sent>"
    "<region>APAC</region></header>"
    + "".join(f"<extra{i}>value {i}</extra{i}>" for i in range(20))
    + "<instrument><StockCode>AAPL</StockCode><isin>US0378331005</isin><board>main</board>"
    "<currency>USD</currency></instrument>"
    "<trade><price>190.5</price><volume>1200</volume><bid>190.4</bid><ask>190.6</ask></trade>"
    "<status><halted>false</halted><session>open</session></status></quote>"
)
# The same conditions on both shapes: (field paths, XPath steps) per data type.
PATHS = {
    "simple": {
        "code": "quote.StockCode",
        "price": "quote.price",
        "volume": "quote.volume",
        "halted": "quote.halted",
        "x": "/*/quote",
    },
    "complex": {
        "code": "quote.instrument.StockCode",
        "price": "quote.trade.price",
        "volume": "quote.trade.volume",
        "halted": "quote.status.halted",
        "x": "/*/quote",
    },
}
SIMPLE_FILTER = "{code} = 'AAPL'"  # 3 nodes: =, the field, the literal
# 15 nodes: five times the simple one
COMPLEX_FILTER = "{code} = 'AAPL' AND {price} > 100 AND {volume} >= 1000 AND {halted} = FALSE"
XPATH = {
    "simple": "string({x}//StockCode) = 'AAPL'",
    "complex": (
        "string({x}//StockCode) = 'AAPL' and number({x}//price) > 100"
        " and number({x}//volume) >= 1000 and string({x}//halted) = 'false'"
    ),
}


def nodes(text: str) -> int:
    """Nodes of the filter's syntax tree (operators and operands), as seed 002 counts them."""
    return sum(1 for _ in _parse(text).iter_subtrees())


# CPU time of this process, not wall time: on a machine shared with other work, wall time counts
# the time this process waited for a core. Every figure here is CPU time, baselines included.
clock = time.process_time


def per_call_us(fn: Callable[[], object], *, seconds: float = 0.5) -> float:
    """Median over 5 runs of the mean CPU time of one call, in microseconds."""
    n = 1
    while True:
        t0 = clock()
        for _ in range(n):
            fn()
        if clock() - t0 > seconds / 5:
            break
        n *= 2
    runs = []
    for _ in range(5):
        t0 = clock()
        for _ in range(n):
            fn()
        runs.append((clock() - t0) / n * 1e6)
    return statistics.median(runs)


def bench_seed002() -> dict[str, Any]:
    print(
        "\nseed 002, table 1: CPU µs per evaluation. 'first': on a fresh message, the filter reads"
        "\nits fields from the XML; 'shared': the fields were read by an earlier filter of the same"
        "\nfan-out (each message is read once however many filters test it). XPath 1.0 (lxml, C)"
        "\nof the same conditions beside them."
    )
    head = f"{'data type':<10}{'filter':<9}{'nodes':>6}"
    print(f"{head}{'first µs':>10}{'shared µs':>11}{'XPath µs':>10}")
    out: dict[str, Any] = {}
    props = {"$topic": "ALL:STOCK", "$priority": 4}
    for shape, xml in (("simple", SIMPLE_DATA), ("complex", COMPLEX_DATA)):
        element = etree.fromstring(xml)
        base = per_call_us(lambda e=element: message_of(e, properties=props))
        out[shape] = {"no filter": {"us": 0.0, "message_us": base}}
        print(f"{shape:<10}{'none':<9}{0:>6}{0:>10.2f}{0:>11.2f}   (a message view: {base:.2f} µs)")
        for label, template in (("simple", SIMPLE_FILTER), ("complex", COMPLEX_FILTER)):
            text = template.format(**PATHS[shape])
            f = compile_filter(text)

            def run(f: CompiledFilter = f, e: Any = element) -> bool:
                return f(message_of(e, properties=props))

            assert run(), text
            us = per_call_us(run) - base
            shared = message_of(element, properties=props)
            warm = per_call_us(lambda f=f, m=shared: f(m))
            xp = etree.XPath(XPATH[label].format(**PATHS[shape]))
            assert xp(element), XPATH[label]
            xus = per_call_us(lambda xp=xp, e=element: xp(e))
            out[shape][label] = {
                "nodes": nodes(text),
                "us": round(us, 3),
                "shared_us": round(warm, 3),
                "xpath_us": round(xus, 3),
            }
            print(f"{shape:<10}{label:<9}{nodes(text):>6}{us:>10.2f}{warm:>11.2f}{xus:>10.2f}")
    worst = max(out[s]["complex"]["us"] for s in out)
    worst_shared = max(out[s]["complex"]["shared_us"] for s in out)
    print(
        f"complex filter, worst data type: {worst_shared:.2f} µs per evaluation with its fields"
        f" read, {worst:.2f} µs reading them first (goal < 10 µs)"
    )
    for shape, row in out.items():
        s, c = row["simple"]["us"], row["complex"]["us"]
        times = row["complex"]["nodes"] / row["simple"]["nodes"]
        print(f"  {shape} data: complex / simple = {c / s:.2f}x for {times:.0f}x the nodes")
    return out


def index_scenario(
    text: str, params: Callable[[int], list[Any]], subscriptions: int, values: int
) -> dict[str, Any]:
    """One message's fan-out over `subscriptions` filters: through the index, and linearly."""
    rnd = random.Random(7)
    print(f"\n{subscriptions:,} subscriptions on one topic: {text} ({values:,} symbols)")
    t0 = clock()
    filters = [(i, compile_filter(text, params(i))) for i in range(subscriptions)]
    compile_s = clock() - t0
    t0 = clock()
    index = FilterIndex(filters)
    build_s = clock() - t0
    elements = [
        etree.fromstring(
            M % f"<quote><symbol>S{rnd.randrange(values)}</symbol>"
            f"<price>{rnd.uniform(0, 1000):.2f}</price></quote>"
        )
        for _ in range(50)
    ]
    props = {"$topic": "ALL:STOCK", "$priority": 4}
    messages = itertools.cycle(elements)

    def indexed() -> list[int]:
        return index.matching(message_of(next(messages), properties=props))

    def linear() -> list[int]:
        return linear_matching(filters, message_of(next(messages), properties=props))

    for e in elements[:5]:  # the same answer, before timing either
        m = message_of(e, properties=props)
        assert sorted(index.matching(m)) == sorted(linear_matching(filters, m))
    matches = statistics.mean(
        len(index.matching(message_of(e, properties=props))) for e in elements
    )
    idx_us = per_call_us(indexed)
    lin_us = per_call_us(linear, seconds=3.0)
    ratio = lin_us / idx_us
    print(
        f"  compile {compile_s:.2f} s ({compile_s / subscriptions * 1e6:.1f} µs each),"
        f" index build {build_s * 1000:.0f} ms; {matches:.1f} matches per message"
    )
    print(f"  {'':<22}{'µs per message':>16}")
    print(f"  {'linear (every filter)':<22}{lin_us:>16,.0f}")
    print(f"  {'filter index':<22}{idx_us:>16,.1f}   {ratio:,.0f}x faster")
    return {
        "subscriptions": subscriptions,
        "distinct_values": values,
        "matches_per_message": round(matches, 1),
        "compile_s": round(compile_s, 3),
        "build_ms": round(build_s * 1000, 1),
        "index_us": round(idx_us, 1),
        "linear_us": round(lin_us, 1),
        "speedup": round(ratio, 1),
    }


def bench_index(subscriptions: int, values: int) -> dict[str, Any]:
    rnd = random.Random(2)

    def ranges(i: int) -> list[Any]:
        low = rnd.randint(0, 900)
        return [f"S{i % values}", low, low + 100]

    out = {
        "equality": index_scenario(
            "quote.symbol = %0", lambda i: [f"S{i % values}"], subscriptions, values
        ),
        "equality + range": index_scenario(
            "quote.symbol = %0 AND quote.price BETWEEN %1 AND %2", ranges, subscriptions, values
        ),
    }
    eq = out["equality"]
    print(
        f"\nequality goal: one message's fan-out {eq['index_us']:.0f} µs (goal < 200 µs),"
        f" {eq['speedup']:.0f}x the linear evaluation (goal >= 50x)"
    )
    return out


# ============================================================================ end to end

UNSUBSCRIBE = (
    '<?xml version="1.0" encoding="utf-8"?>'
    f'<s:Envelope xmlns:s="{ns.SOAP12}" xmlns:wsa="{ns.WSA}" xmlns:wsnt="{ns.WSNT}">'
    "<s:Header><wsa:To>%s</wsa:To></s:Header><s:Body><wsnt:Unsubscribe/></s:Body></s:Envelope>"
)


def filtered_subscribe_body(e2e: Any, wsn_url: str, consumer_url: str, i: int) -> bytes:
    """A Subscribe to the published topic whose SQL-like filter the benchmark's messages never
    meet: `m.p` is the phase number, never negative; each subscription has its own value."""
    body = (e2e.SUBSCRIBE_TEMPLATE % (wsn_url, consumer_url)).replace(
        f">{e2e.SUBSCRIBE_TOPIC}</wsnt:TopicExpression>", f">{e2e.TOPIC}</wsnt:TopicExpression>"
    )
    policy = (
        f'<wsnt:SubscriptionPolicy><hpwsn:FilterParameters xmlns:hpwsn="{ns.HPWSN}">'
        f"<hpwsn:Parameter>{-1 - i}</hpwsn:Parameter></hpwsn:FilterParameters>"
        "</wsnt:SubscriptionPolicy>"
    )
    return (
        body.replace(
            "</wsnt:Filter>",
            f'<wsnt:MessageContent Dialect="{DIALECT}">m.p = %0</wsnt:MessageContent>'
            "</wsnt:Filter>",
        )
        .replace("</wsnt:Subscribe>", policy + "</wsnt:Subscribe>")
        .replace("urn:hpwsn-bench:subscribe", f"urn:hpwsn-bench:subscribe:{i}")
        .encode()
    )


def measure_e2e(plat: Any, args: argparse.Namespace, report: dict[str, Any]) -> None:
    from bench import e2e

    wsn_url = plat.base_url + "/wsn/"
    pipe, cport = e2e.start_consumer()
    consumer_url = f"http://127.0.0.1:{cport}/consumer"
    e2e.subscribe(plat, consumer_url)
    refs: list[str] = []

    def add_filtered() -> None:
        t0 = time.time()
        for i in range(args.filtered):
            # Another consumer origin than the measured consumer's: subscriptions that share an
            # origin share its flow-control window (dispatch/flow.py), which is not what is
            # measured here. Nothing is ever pushed to it: no message meets these filters.
            target = f"http://127.0.0.2:{cport}/filtered/{i}"
            status, body = e2e.http(
                wsn_url, filtered_subscribe_body(e2e, wsn_url, target, i), e2e.SUBSCRIBE_CT
            )
            m = re.search(rb"<wsa:Address>([^<]+)</wsa:Address>", body)
            if status != 200 or not m:
                raise RuntimeError(f"Subscribe failed: HTTP {status} {body[:300]!r}")
            refs.append(m.group(1).decode())
        e2e.log(f"{args.filtered} filtered subscriptions made in {time.time() - t0:.1f} s")

    def remove_filtered() -> None:
        for ref in refs:
            status, body = e2e.http(ref, (UNSUBSCRIBE % ref).encode(), e2e.SUBSCRIBE_CT)
            if status != 200:
                raise RuntimeError(f"Unsubscribe failed: HTTP {status} {body[:300]!r}")
        refs.clear()

    order: list[bool] = []
    for r in range(args.rounds):
        order += [False, True] if r % 2 == 0 else [True, False]
    runs = []
    current = False
    for n, filtered in enumerate(order):
        if filtered and not current:
            add_filtered()
        elif current and not filtered:
            remove_filtered()
        current = filtered
        label = f"{args.filtered} filtered" if filtered else "no filters"
        e2e.log(f"end-to-end, {label}: {args.duration:g} s")
        res = e2e.e2e_round(plat, pipe, args, warm_phase=100 + 2 * n, phase=101 + 2 * n)
        res["filtered"] = filtered
        e2e.log(f"end-to-end, {label}: {res['rate']:.0f} msgs/s, missing {res['missing']}")
        runs.append(res)

    def mean(on: bool) -> float:
        return statistics.mean(r["rate"] for r in runs if r["filtered"] == on)

    without, with_ = mean(False), mean(True)
    print(f"\nend to end, {args.filtered} SQL-filtered subscriptions on the published topic:")
    print(f"{'run':<28}{'msgs':>8}{'msgs/s':>10}{'p50 ms':>9}{'p99 ms':>9}")
    for i, r in enumerate(runs):
        d = r["row"].as_dict()
        label = f"{i + 1}. " + (f"{args.filtered} filtered" if r["filtered"] else "no filters")
        if r["missing"]:
            label += " INCOMPLETE"
        print(
            f"{label:<28}{d['msgs']:>8}{d['msgs_per_s']:>10.1f}{d['p50_ms'] or 0:>9.1f}"
            f"{d['p99_ms'] or 0:>9.1f}"
        )
    change = 100 * (with_ - without) / without
    print(f"mean: without {without:.1f}/s, with {with_:.1f}/s: {change:+.1f}% (goal: within 20 %)")
    report["e2e"] = {
        "filtered": args.filtered,
        "rate_without": round(without, 1),
        "rate_with": round(with_, 1),
        "change_percent": round(change, 1),
        "runs": [
            {"filtered": r["filtered"], "rate": round(r["rate"], 1), "missing": r["missing"]}
            for r in runs
        ],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--subscriptions", type=int, default=100_000)
    p.add_argument("--values", type=int, default=1_000, help="distinct values of the field")
    p.add_argument("--json", default="", help="write the figures to this file")
    p.add_argument("--e2e", action="store_true", help="end to end through a private platform")
    p.add_argument("--filtered", type=int, default=1_000, help="filtered subscriptions (--e2e)")
    p.add_argument("--rounds", type=int, default=2, help="without/with pairs (--e2e, ABBA)")
    args, rest = p.parse_known_args(argv)
    if args.e2e:
        from bench import e2e

        e2e_args = e2e.parse_args(rest)
        for key in ("filtered", "rounds", "json"):
            setattr(e2e_args, key, getattr(args, key))
        config = {
            "filtered_subscriptions": args.filtered,
            "rounds": args.rounds,
            "duration_s": e2e_args.duration,
            "publishers_concurrency": e2e_args.publishers_concurrency,
            "worker_concurrency": e2e_args.worker_concurrency,
            "topic": e2e.TOPIC,
        }
        return e2e.run_benchmark(e2e_args, config, measure_e2e, prefix="hpwsn-bench-filters-")
    report = {"seed002": bench_seed002(), "index": bench_index(args.subscriptions, args.values)}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
