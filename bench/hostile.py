"""What hostile input costs the broker, beside the same work on ordinary input, in one run.

    .venv/bin/python -m bench.hostile

In process, without Django or servers: the parse and extraction a Notify goes through in the web
process (hpwsn.soap.parse_request, hpwsn.wsn.parse_notify), and the check and evaluation of
MessageContent filters (hpwsn.xpathfilter, lxml). Each figure is printed beside its baseline as
a ratio; the hostile forms are timed both as the broker treats them now (refused, or cleaned) and
as it used to (accepted, every declaration copied into every message; evaluated as sent).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lxml import etree

from hpwsn import ns, wsn, xpathfilter
from hpwsn.soap import SoapFault, parse_request

MB = 10 * 1024 * 1024
TOPIC = "ALL:ALARM:ALARM1"


def notify(unused_namespaces: int, messages: int = 100) -> bytes:
    decls = "".join(f' xmlns:p{i}="urn:unused:{i}"' for i in range(unused_namespaces))
    body = "".join(
        f'<wsnt:NotificationMessage><wsnt:Topic Dialect="{ns.DIALECT_SIMPLE}">{TOPIC}'
        f"</wsnt:Topic><wsnt:Message><m xmlns='urn:x'>{i}</m></wsnt:Message>"
        "</wsnt:NotificationMessage>"
        for i in range(messages)
    )
    return (
        f'<s:Envelope xmlns:s="{ns.SOAP11}" xmlns:wsnt="{ns.WSNT}"><s:Body{decls}>'
        f"<wsnt:Notify>{body}</wsnt:Notify></s:Body></s:Envelope>"
    ).encode()


def accept(data: bytes, *, max_namespaces: int = 256) -> int:
    """Bytes stored for the request's messages (0 if refused)."""
    try:
        req = parse_request(
            data,
            max_bytes=MB,
            max_depth=64,
            content_type="text/xml",
            max_namespaces=max_namespaces,
        )
    except SoapFault:
        return 0
    return sum(len(wsn.stored_fragment(n)) for n in wsn.parse_notify(req.body))


def accept_as_before(data: bytes) -> int:
    """What the broker did before: every message serialised with every declaration in scope."""
    req = parse_request(
        data, max_bytes=MB, max_depth=64, content_type="text/xml", max_namespaces=10**9
    )
    stored = 0
    for el in req.body.findall(f"{{{ns.WSNT}}}NotificationMessage"):
        for child in el:
            stored += len(etree.tostring(child, with_tail=False))
    return stored


def timed(fn: Callable[[], object], repeat: int = 3) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def main() -> None:
    plain = notify(0)
    base, stored = timed(lambda: accept(plain))
    print(f"Notify, 100 messages, no extra namespaces: {base * 1000:.1f} ms, {stored} B stored")
    rows = [
        ("200 unused namespaces, accepted and cleaned", lambda: accept(notify(200))),
        ("10,000 unused namespaces, refused", lambda: accept(notify(10_000))),
        ("10,000 unused namespaces, as before", lambda: accept_as_before(notify(10_000))),
    ]
    for label, fn in rows:
        t, stored = timed(fn, repeat=1 if "before" in label else 3)
        print(f"  {label}: {t * 1000:.1f} ms ({t / base:.1f}x), {stored} B stored")

    payload = etree.fromstring(
        "<m>" + "".join(f"<r i='{i}'><v>{i}</v></r>" for i in range(300)) + "</m>"
    )
    size = len(etree.tostring(payload))
    ordinary = "boolean(//r[v > 150]) and count(//r) > 10"
    cubic = "count(//*[count(following::*[count(preceding::*) > 0]) > 0]) > 0"
    f = xpathfilter.compile_filter(ordinary, {}, max_chars=1024)
    base, _ = timed(lambda: f(payload), repeat=5)
    print(f"\nfilter {ordinary!r} on a {size} B message: {base * 1e6:.0f} us")

    def refuse() -> None:
        try:
            xpathfilter.check(cubic, max_chars=1024)
        except xpathfilter.FilterRejected:
            return
        raise AssertionError("accepted")

    t, _ = timed(refuse, repeat=5)
    print(f"  the cubic filter refused at Subscribe: {t * 1e6:.0f} us ({t / base:.2f}x)")
    t, _ = timed(lambda: etree.XPath(cubic)(payload), repeat=1)
    print(f"  the cubic filter evaluated, as before: {t * 1000:.0f} ms ({t / base:.0f}x)")


if __name__ == "__main__":
    main()
