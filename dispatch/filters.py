"""MessageContent filters as the fan-out evaluates them: never a crash, never unbounded.

A filter is the subscriber's code running in the worker that serves everyone. Whatever it does
at evaluation (raise, or meet a message too large to evaluate on) ends as "no match" for that one
subscription, counted, and the fan-out goes on with the others: one anonymous Subscribe with
`re:test(., '(')` once stopped every delivery on every topic.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from lxml import etree

from hpwsn import ns
from hpwsn_site import state
from monitoring import counters
from subscriptions.selectors import SubEntry

log = logging.getLogger(__name__)

_TOO_LARGE = object()  # the message is over HPWSN_FILTER_MAX_PAYLOAD_BYTES: no filter runs on it


def _message_element(fragment: bytes) -> etree._Element | None:
    root = etree.fromstring(b'<m xmlns:wsnt="' + ns.WSNT.encode() + b'">' + fragment + b"</m>")
    return root.find(f"{{{ns.WSNT}}}Message")


class FilterRun:
    """The filter evaluations of one fan-out batch: each message parsed once, failures counted."""

    def __init__(self) -> None:
        self.parsed: dict[bytes, Any] = {}
        # Outcome of a filter on a message: subscriptions with identical filters share one
        # compiled object (SubscriptionIndex.xpath_filter), so 10,000 of them on one topic cost
        # one evaluation per message. An exception is kept as the outcome: each of them fails.
        self.outcomes: dict[tuple[object, bytes], bool | Exception] = {}
        self.errors: dict[str, int] = {}  # subscription id -> failed evaluations
        self.skipped = 0  # evaluations not run: the message was too large

    def _element(self, nid: bytes, payload: bytes | None) -> Any:
        if nid not in self.parsed:
            if payload is None:
                self.parsed[nid] = None  # the message outlived its retention
            elif len(payload) > settings.HPWSN_FILTER_MAX_PAYLOAD_BYTES:
                self.parsed[nid] = _TOO_LARGE
            else:
                try:
                    self.parsed[nid] = _message_element(payload)
                except etree.XMLSyntaxError:
                    self.parsed[nid] = None
        return self.parsed[nid]

    def passes(self, entry: SubEntry, nid: bytes, payload: bytes | None) -> bool:
        """True if `entry` has no filter or its filter matches; False on any failure."""
        if entry.content_filter is None:
            return True
        message = self._element(nid, payload)
        if message is None:
            return False
        if message is _TOO_LARGE:
            self.skipped += 1
            return False
        key = (entry.content_filter, nid)  # the object, not its id: kept alive while held
        outcome = self.outcomes.get(key)
        if outcome is None:
            try:
                outcome = bool(entry.content_filter(message))
            except Exception as exc:  # the subscriber's expression: whatever it raises is theirs
                outcome = exc
            self.outcomes[key] = outcome
        if isinstance(outcome, Exception):
            self.errors[entry.id] = self.errors.get(entry.id, 0) + 1
            if self.errors[entry.id] == 1:
                log.warning("filter of subscription %s failed: %s", entry.id, outcome)
            return False
        return outcome

    def record(self, r: Any) -> None:
        """Add this batch's failures to the per-subscription counts and the totals."""
        if self.errors:
            pipe = r.pipeline(transaction=False)
            for sub_id, n in self.errors.items():
                pipe.hincrby(state.FILTER_ERRORS, sub_id, n)
            pipe.execute()
            counters.incr("filter_errors", sum(self.errors.values()))
        if self.skipped:
            counters.incr("filter_skipped", self.skipped)
