"""Pushes to subscriptions whose format is `cloudevents` (encoding: hpwsn/cloudevents.py).

Same queue, batches, ids, retries, dead letters, flow control and Standard Webhooks signatures as
a `wsnt:Notify` push; only the body differs. Messages are not split into thesis fragments: a
CloudEvents consumer could not reassemble them.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings

from dispatch import push
from dispatch.ids import notification_id_time
from hpwsn import cloudevents
from subscriptions.selectors import SubEntry


def _source(entry: SubEntry) -> str:
    """The broker as the events' source: its public URL, else where the subscription lives."""
    public: str = settings.HPWSN_PUBLIC_URL
    if public:
        return public.rstrip("/") + "/"
    base, sep, _rest = entry.reference_address.partition("/wsn/")
    return base + "/" if sep else entry.reference_address


def cloudevents_push(
    entry: SubEntry,
    fragments: list[bytes],
    *,
    ids: list[str],
    message_id_of: Callable[[str, list[str]], str],
) -> push.Outcome:
    """POST the messages as CloudEvents: one event alone, more as a batch, in queue order."""
    source = _source(entry)
    size = max(1, settings.HPWSN_PUSH_BATCH)
    outcome = push.Outcome(ok=True)
    for start in range(0, len(fragments), size):
        batch_ids = ids[start : start + size]
        events = [
            cloudevents.event(
                notification_id=nid,
                source=source,
                accepted_at=notification_id_time(nid) or 0.0,
                fragment=fragment,
            )
            for nid, fragment in zip(batch_ids, fragments[start : start + size], strict=True)
        ]
        if len(events) == 1:
            body, ctype = cloudevents.event_body(events[0]), cloudevents.CONTENT_TYPE
        else:
            body, ctype = cloudevents.batch_body(events), cloudevents.BATCH_CONTENT_TYPE
        outcome = push.post(
            entry.consumer_address,
            body,
            soap_version=entry.soap_version,
            message_id=message_id_of(entry.id, batch_ids),
            secret=entry.signing_secret,
            content_type=ctype,
        )
        if not outcome.ok:
            return outcome  # the head stays queued; batches already sent may be resent
    return outcome
