"""Subscription services racing each other: each test holds one of them at the point where the
other can slip in (a pause hooked into the service), so the interleaving happens every time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from hpwsn import errors
from hpwsn_site import state
from subscriptions import services as subs
from subscriptions.models import PullPoint, Subscription
from tests.support import subscription_made
from topics import services as topics
from topics.acl import Principal

ADMIN = Principal(name="admin1", groups=frozenset({"hpwsn-admins"}))
CONSUMER = "http://127.0.0.1:9/races"  # nothing listens: these tests push nothing
WAIT_S = 10.0


class Call(threading.Thread):
    """A service called on a thread (and a database connection) of its own."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn = fn
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:  # looked at by the test
            self.error = exc
        finally:
            connection.close()

    def outcome(self) -> Any:
        self.join(WAIT_S)
        assert not self.is_alive(), "the call did not end"
        return self.value


def _held(
    monkeypatch, name: str, *, before: bool = False
) -> tuple[threading.Event, threading.Event]:  # type: ignore[no-untyped-def]
    """Hold the caller of `subscriptions.services.<name>` right after it returns (or, `before`,
    before it is called): `reached` is set there, and the call goes on once `go` is."""
    reached, go = threading.Event(), threading.Event()
    real = getattr(subs, name)

    def hold() -> None:
        reached.set()
        assert go.wait(WAIT_S)

    def held(*args: Any, **kwargs: Any) -> Any:
        if before:
            hold()
        value = real(*args, **kwargs)
        if not before:
            hold()
        return value

    monkeypatch.setattr(subs, name, held)
    return reached, go


def _subscribe(consumer: str = CONSUMER, termination: str | None = None) -> Subscription:
    return subscription_made(consumer, "Plant:Hall", ADMIN, termination=termination)[0]


@pytest.mark.django_db(transaction=True)
def test_a_renewed_subscription_outlives_an_expiry_sweep_that_read_its_old_time(
    monkeypatch,
) -> None:
    """The sweep reads the subscriptions whose time has passed, then frees them one by one; a
    Renew answered in between must not be undone (the sweep runs on another host, whose clock
    is a little ahead)."""
    topics.topic_create(path="Plant:Hall")
    sub = _subscribe(termination="PT30S")
    sweep_thread: list[threading.Thread] = []
    real_now = timezone.now

    def now() -> Any:
        ahead = timedelta(minutes=1) if threading.current_thread() in sweep_thread else timedelta()
        return real_now() + ahead

    monkeypatch.setattr(timezone, "now", now)
    read, go = _held(
        monkeypatch, "_free", before=True
    )  # the sweep has read the old termination time
    sweep = Call(subs.subscriptions_expire)
    sweep_thread.append(sweep)
    sweep.start()
    assert read.wait(WAIT_S)

    renewed = subs.subscription_renew(
        subscription_id=str(sub.id), termination_time="PT1H", principal=ADMIN
    )
    go.set()
    sweep.outcome()

    assert renewed.termination_time is not None
    stored = Subscription.objects.filter(id=sub.id).first()
    assert stored is not None, "the sweep deleted a subscription renewed after it read it"
    assert stored.termination_time == renewed.termination_time


@pytest.mark.django_db(transaction=True)
def test_a_renew_that_meets_the_expiry_sweep_either_renews_or_is_refused(monkeypatch) -> None:
    """Renew found the subscription alive, then the sweep found it expired: whichever writes
    first, the answer the subscriber gets is what happened."""
    topics.topic_create(path="Plant:Hall")
    sub = _subscribe(termination="PT30S")
    renew_thread: list[threading.Thread] = []
    real_now = timezone.now

    def now() -> Any:  # the renewing host's clock is behind: its Renew came just in time
        behind = timedelta(minutes=1) if threading.current_thread() in renew_thread else timedelta()
        return real_now() - behind + timedelta(seconds=31)

    monkeypatch.setattr(timezone, "now", now)
    checked, go_renew = _held(monkeypatch, "_termination")  # Renew has found it alive
    renew = Call(
        lambda: subs.subscription_renew(
            subscription_id=str(sub.id), termination_time="PT1H", principal=ADMIN
        )
    )
    renew_thread.append(renew)
    renew.start()
    assert checked.wait(WAIT_S)
    read, go_sweep = _held(monkeypatch, "_free", before=True)
    sweep = Call(subs.subscriptions_expire)
    sweep.start()
    assert read.wait(WAIT_S)  # the sweep has read the old time too
    go_renew.set()
    renew.outcome()
    go_sweep.set()
    sweep.outcome()

    stored = Subscription.objects.filter(id=sub.id).first()
    if renew.error is None:
        assert stored is not None, "RenewResponse was answered for a subscription then deleted"
        assert stored.termination_time == renew.value.termination_time
    else:
        assert isinstance(renew.error, errors.ResourceUnknown), renew.error
        assert stored is None


@pytest.mark.django_db(transaction=True)
def test_a_pause_answered_while_a_renew_runs_stays_paused(monkeypatch) -> None:
    """Renew read the subscription active, a PauseSubscription was answered, then Renew wrote:
    the subscription stays paused (Renew leaves a paused one paused)."""
    topics.topic_create(path="Plant:Hall")
    sub = _subscribe()
    read, go = _held(monkeypatch, "_termination")
    renew = Call(
        lambda: subs.subscription_renew(
            subscription_id=str(sub.id), termination_time="PT1H", principal=ADMIN
        )
    )
    renew.start()
    assert read.wait(WAIT_S)

    subs.subscription_set_state(subscription_id=str(sub.id), paused=True, principal=ADMIN)
    go.set()
    renew.outcome()

    assert renew.error is None, renew.error
    stored = Subscription.objects.get(id=sub.id)
    assert stored.state == Subscription.State.PAUSED
    assert stored.termination_time is not None


@pytest.mark.django_db(transaction=True)
def test_a_renew_or_pause_of_a_subscription_unsubscribed_meanwhile_is_resource_unknown(
    monkeypatch,
) -> None:
    """Not an internal error: the subscription is gone, as the fault table says."""
    topics.topic_create(path="Plant:Hall")
    for operation in (
        lambda sid: subs.subscription_renew(subscription_id=sid, termination_time="PT1H"),
        lambda sid: subs.subscription_set_state(subscription_id=sid, paused=True),
    ):
        sub = _subscribe()
        read, go = _held(monkeypatch, "_get")
        call = Call(lambda op=operation, sid=str(sub.id): op(sid))
        call.start()
        assert read.wait(WAIT_S)
        monkeypatch.undo()
        subs.subscription_delete(subscription_id=str(sub.id))
        go.set()
        call.outcome()

        assert isinstance(call.error, errors.ResourceUnknown), call.error
        assert not Subscription.objects.filter(id=sub.id).exists()


@pytest.mark.django_db(transaction=True)
def test_a_subscribe_into_a_pull_point_being_destroyed_leaves_no_subscription_behind(
    monkeypatch,
) -> None:
    """DestroyPullPoint removes the subscriptions delivering into it, also one whose Subscribe
    found the pull point alive a moment before: that Subscribe is refused instead."""
    topics.topic_create(path="Plant:Hall")
    pp = subs.pull_point_create(base_url="http://testserver", principal=ADMIN)
    found, go = _held(monkeypatch, "_pull_point_of")
    subscribe = Call(lambda: _subscribe(consumer=pp.address))
    subscribe.start()
    assert found.wait(WAIT_S)

    destroy = Call(lambda: subs.pull_point_destroy(pull_point_id=str(pp.id), principal=ADMIN))
    destroy.start()
    destroy.join(0.5)  # it may wait for the Subscribe's transaction, or be done
    go.set()
    subscribe.outcome()
    destroy.outcome()

    assert destroy.error is None, destroy.error
    assert PullPoint.objects.get(id=pp.id).destroyed_at is not None
    left = Subscription.objects.filter(pull_point_id=pp.id)
    assert not left.exists(), "a subscription delivers into a destroyed pull point"
    if subscribe.error is not None:
        assert isinstance(subscribe.error, errors.ResourceUnknown), subscribe.error


@pytest.mark.django_db(transaction=True)
def test_of_two_destroys_of_one_pull_point_at_once_the_second_is_refused(monkeypatch) -> None:
    pp = subs.pull_point_create(base_url="http://testserver", principal=ADMIN)
    read, go = _held(monkeypatch, "_get_pull_point")
    first = Call(lambda: subs.pull_point_destroy(pull_point_id=str(pp.id)))
    first.start()
    assert read.wait(WAIT_S)
    monkeypatch.undo()
    subs.pull_point_destroy(pull_point_id=str(pp.id))
    go.set()
    first.outcome()

    assert isinstance(first.error, errors.UnableToDestroyPullPoint), first.error


def _pull_point_with(count: int) -> PullPoint:
    r = state.get_redis()
    pp = subs.pull_point_create(base_url="http://testserver", principal=ADMIN)
    for i in range(count):
        r.set(state.payload_key(f"{pp.id}-q{i}"), f"q{i}".encode())
        r.rpush(state.pullpoint_key(str(pp.id)), f"{pp.id}-q{i}|sub|f0".encode())
    return pp


@pytest.mark.django_db(transaction=True)
def test_two_get_messages_at_once_take_distinct_messages_and_lose_none() -> None:
    """One GetMessages holds its reply while another runs to the end: each gets messages the
    other did not, in order, and together they get all."""
    pp = _pull_point_with(4)
    rendered, go = threading.Event(), threading.Event()

    def held(out: list[tuple[str, bytes]]) -> list[bytes]:
        if not rendered.is_set():
            rendered.set()
            assert go.wait(WAIT_S)
        return [payload for _address, payload in out]

    first = Call(
        lambda: subs.pull_point_get_messages(pull_point_id=str(pp.id), maximum=2, render=held)
    )
    first.start()
    assert rendered.wait(WAIT_S)  # it has read q0, q1 and built its reply
    second = subs.pull_point_get_messages(
        pull_point_id=str(pp.id), maximum=2, render=lambda out: [p for _a, p in out]
    )
    go.set()

    assert second == [b"q0", b"q1"]
    assert first.outcome() == [b"q2", b"q3"]


@pytest.mark.django_db(transaction=True)
def test_a_get_messages_that_meets_destroy_pull_point_hands_out_nothing() -> None:
    pp = _pull_point_with(2)
    rendered, go = threading.Event(), threading.Event()

    def held(out: list[tuple[str, bytes]]) -> list[bytes]:
        if not rendered.is_set():
            rendered.set()
            assert go.wait(WAIT_S)
        return [payload for _address, payload in out]

    reader = Call(
        lambda: subs.pull_point_get_messages(pull_point_id=str(pp.id), maximum=None, render=held)
    )
    reader.start()
    assert rendered.wait(WAIT_S)
    subs.pull_point_destroy(pull_point_id=str(pp.id))
    go.set()

    assert reader.outcome() == []  # what it read went with the pull point


@pytest.mark.django_db(transaction=True)
def test_a_subscribe_identical_to_one_the_expiry_sweep_takes_meanwhile_makes_it_anew(
    monkeypatch,
) -> None:
    """An identical Subscribe finds the subscription expired and ends it itself, while the sweep
    frees it at the same moment: the Subscribe is answered with a new subscription."""
    topics.topic_create(path="Plant:Hall")
    old = _subscribe(termination="PT30S")
    Subscription.objects.filter(id=old.id).update(
        termination_time=timezone.now() - timedelta(seconds=1)
    )
    reached, go = _held(monkeypatch, "subscription_delete", before=True)
    again = Call(lambda: _subscribe(termination="PT1H"))
    again.start()
    assert reached.wait(WAIT_S)
    assert subs.subscriptions_expire() == 1  # the sweep frees it first
    go.set()

    made = again.outcome()
    assert again.error is None, again.error
    assert made.id != old.id
    assert list(Subscription.objects.values_list("id", flat=True)) == [made.id]
