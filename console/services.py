"""Operators' actions on subscriptions and pull points: the broker's services, plus the audit log.

The subscription services publish their change to the other processes as they write (they bump
the subscription index version immediately), so they are not wrapped in a transaction here:
the audit entry is written once the change has been made.
"""

from __future__ import annotations

import uuid
from typing import Any

from audit.services import Actor, audit_record
from dispatch.deadletters import dead_letters_delete, dead_letters_redrive
from dispatch.selectors import dead_letters
from hpwsn import errors
from hpwsn.xsdtime import format_datetime
from subscriptions import services as subscriptions
from subscriptions.models import PullPoint, Subscription


def _snapshot(sub: Subscription) -> dict[str, Any]:
    return {
        "id": str(sub.id),
        "consumer": sub.consumer_address,
        "mode": sub.mode,
        "topic": sub.topic_expression,
        "topic_path": sub.topic_path,
        "state": sub.state,
        "termination_time": (
            format_datetime(sub.termination_time) if sub.termination_time else None
        ),
    }


def _current(subscription_id: str) -> Subscription:
    try:
        sub = Subscription.objects.filter(id=uuid.UUID(subscription_id)).first()
    except ValueError:
        sub = None
    if sub is None:
        raise errors.ResourceUnknown(f"subscription {subscription_id} does not exist")
    return sub


def subscription_pause_or_resume(
    *, subscription_id: str, paused: bool, actor: Actor | str
) -> Subscription:
    """Pause a subscription, or resume a paused or suspended one."""
    before = _snapshot(_current(subscription_id))
    sub = subscriptions.subscription_set_state(subscription_id=subscription_id, paused=paused)
    audit_record(
        actor=actor,
        action="subscription.pause" if paused else "subscription.resume",
        object_type="subscription",
        object_id=subscription_id,
        before=before,
        after=_snapshot(sub),
    )
    return sub


def subscription_renew_by_operator(
    *, subscription_id: str, termination_time: str, actor: Actor | str
) -> Subscription:
    """Give a subscription a new termination time (an xsd:duration or xsd:dateTime)."""
    before = _snapshot(_current(subscription_id))
    sub = subscriptions.subscription_renew(
        subscription_id=subscription_id, termination_time=termination_time
    )
    audit_record(
        actor=actor,
        action="subscription.renew",
        object_type="subscription",
        object_id=subscription_id,
        before=before,
        after=_snapshot(sub),
    )
    return sub


def subscription_remove(*, subscription_id: str, actor: Actor | str) -> None:
    """Unsubscribe on the consumer's behalf: the row, its queue and its Redis keys go."""
    before = _snapshot(_current(subscription_id))
    subscriptions.subscription_delete(subscription_id=subscription_id)
    audit_record(
        actor=actor,
        action="subscription.remove",
        object_type="subscription",
        object_id=subscription_id,
        before=before,
    )


def pull_point_remove(*, pull_point_id: str, actor: Actor | str) -> None:
    """Destroy a pull point, its queue and the subscriptions that deliver into it."""
    try:
        pp = PullPoint.objects.filter(id=uuid.UUID(pull_point_id)).first()
    except ValueError:
        pp = None
    if pp is None:
        raise errors.ResourceUnknown(f"pull point {pull_point_id} does not exist")
    before = {
        "id": str(pp.id),
        "address": pp.address,
        "subscriptions": [str(i) for i in pp.subscriptions.values_list("id", flat=True)],
    }
    subscriptions.pull_point_destroy(pull_point_id=pull_point_id)
    audit_record(
        actor=actor,
        action="pullpoint.remove",
        object_type="pullpoint",
        object_id=pull_point_id,
        before=before,
    )


def dead_letters_redrive_by_operator(
    *, ids: list[int] | None, subscription_id: str | None, actor: Actor | str
) -> int:
    """Re-queue dead letters (some, or all of one subscription's); returns how many went back."""
    chosen = list(
        dead_letters(ids=ids, subscription_id=subscription_id, redriven=False).values_list(
            "id", flat=True
        )
    )
    if not chosen:
        return 0
    count = dead_letters_redrive(ids=chosen)
    audit_record(
        actor=actor,
        action="deadletter.redrive",
        object_type="deadletter",
        object_id=subscription_id or ",".join(str(i) for i in chosen),
        before={"ids": chosen, "subscription": subscription_id},
        after={"redriven": count, "left": len(chosen) - count},
    )
    return count


def dead_letters_delete_by_operator(*, ids: list[int], actor: Actor | str) -> int:
    """Drop dead letters an operator has dealt with; returns how many went."""
    chosen = list(
        dead_letters(ids=ids, redriven=False).values("id", "subscription_id", "notification_id")
    )
    if not chosen:
        return 0
    count = dead_letters_delete(ids=[c["id"] for c in chosen])
    audit_record(
        actor=actor,
        action="deadletter.delete",
        object_type="deadletter",
        object_id=",".join(str(c["id"]) for c in chosen),
        before={"letters": chosen},
        after={"deleted": count},
    )
    return count
