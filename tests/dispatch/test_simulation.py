"""A simulation of the delivery engine: accept, fan-out, pumps, checkpoint, sweeps and Redis
losses interleaved in every order Hypothesis can think of, against a real Redis (the test's own,
so a loss is a real flush) and the real database, with a scripted consumer.

Pumps are driven phase by phase (`Pump.acquire`, `next_batch`, `push`, `delivered`/`failed`),
so a second pump can start while the first one's push is in flight, exactly as the safety net
does when a lease runs out under a slow consumer. A lease running out is the lease key going
away (what Redis does when its time is up); a worker dying is a pump that is dropped between
two of its writes and never settles or releases.

Invariants, checked after every step and once everything has drained:
- every accepted reliable message reaches every subscription that existed when it was accepted
  (pushed at least once, or a dead letter of that subscription);
- per subscription, the first deliveries of each message come in the order of acceptance;
- a log row is never deleted while a subscription still needs it (the next Redis loss would
  lose it otherwise);
- no queue is drained by two owners: a pump that lost its lease never takes a batch off.

`test_it_finds_the_lost_batch_without_the_fence` runs the same machine with the fence taken
out of the pump's take script (the engine as it was) and expects the machine to find the loss.
Run more examples with `--hypothesis-profile=long`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from dispatch import pump as pump_module
from dispatch import reliable
from dispatch.bodies import RELEASE_LUA
from dispatch.fanout import fanout_run
from dispatch.ids import notification_id_new
from dispatch.models import DeadLetter, DeliveryCursor, StoredMessage
from dispatch.pump import Batch, Pump
from dispatch.push import Outcome
from dispatch.services import FANOUT_LEASE
from dispatch.sweeps import retry_sweep, stall_sweep
from hpwsn_site import state
from subscriptions.models import Subscription
from subscriptions.selectors import SubEntry

TOPIC = "SIM"

# The take as the engine had it before the fence: trim "the first N items" after a push, whoever
# holds the lease and whatever the head holds now.
UNFENCED_TAKE = (
    RELEASE_LUA
    + """
local first = 16 + tonumber(ARGV[15])
if ARGV[3] ~= '' then
  redis.call('zrem', KEYS[2], ARGV[3])
else
  redis.call('ltrim', KEYS[2], #ARGV - first + 1, -1)
end
if ARGV[4] ~= '' then
  redis.call('zadd', KEYS[3], ARGV[5], ARGV[4])
  redis.call('sadd', KEYS[4], ARGV[6])
else
  release(ARGV[7], ARGV, first)
end
redis.call('pexpire', KEYS[1], ARGV[2])
return {1}
"""
)
UNFENCED_RENEW = "redis.call('pexpire', KEYS[1], ARGV[2]) return 1"

ANSWERS = ["ok", "ok", "ok", "ok", "ok", "error", "timeout", "crash"]


def _payload(nid: str) -> bytes:
    return (
        f'<wsnt:Topic Dialect="http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple">'
        f"{TOPIC}</wsnt:Topic><wsnt:Message><sim>{nid}</sim></wsnt:Message>"
    ).encode()


@dataclass
class Slot:
    pump: Pump
    batch: Batch | None = None


def _all_faults(machine: DeliveryMachine) -> bool:
    return machine.all_faults


class DeliveryMachine(RuleBasedStateMachine):
    all_faults = True  # False: only slow pushes and leases running out (SlowConsumerMachine)

    def __init__(self) -> None:
        super().__init__()
        self.r = state.get_redis()
        self.r.flushdb()
        for model in (StoredMessage, DeliveryCursor, DeadLetter, Subscription):
            model.objects.all().delete()
        self.subs: list[str] = []
        self.created: dict[str, float] = {}
        self.received: dict[str, list[str]] = {}
        self.accepted: list[tuple[str, float]] = []  # in acceptance (sequence) order
        self.slots: dict[tuple[str, int], Slot] = {}
        self.answer = "ok"
        self._subscribe()

    # ------------------------------------------------------------------ the world

    def _subscribe(self) -> None:
        sub = Subscription.objects.create(
            consumer_address="http://127.0.0.1:9/sim",
            topic_expression=TOPIC,
            topic_dialect="http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple",
            topic_path=TOPIC,
            dedup_key=uuid.uuid4().hex,
        )
        created = state.shared_now()
        Subscription.objects.filter(id=sub.id).update(
            created_at=datetime.fromtimestamp(created, tz=UTC)
        )
        sid = str(sub.id)
        self.subs.append(sid)
        self.created[sid] = created
        self.received[sid] = []
        state.bump(state.VERSION_SUBS)

    def _push(self, entry: SubEntry, batch: Batch) -> Outcome:
        """The consumer: what it is sent under `self.answer`, and what the pump hears back."""
        if self.answer in ("ok", "timeout", "crash"):
            self.received[entry.id].extend(nid for nid, _p in batch.live)
        if self.answer == "ok":
            return Outcome(ok=True, status=200)
        if self.answer == "error":
            return Outcome(ok=False, status=503, detail="unavailable")
        return Outcome(ok=False, detail="timeout: ReadTimeout", throttled=True)

    def _sid(self, sub: int) -> str:
        return self.subs[sub % len(self.subs)]

    def _end(self, key: tuple[str, int]) -> None:
        slot = self.slots.pop(key)
        slot.pump.release()
        slot.pump.finish()

    # ------------------------------------------------------------------ rules

    @rule(n=st.integers(3, 8))
    def publish(self, n: int) -> None:
        now = state.shared_now()
        rows = []
        for _ in range(n):
            nid = notification_id_new(now)
            rows.append(
                StoredMessage(
                    notification_id=nid,
                    topic_path=TOPIC,
                    priority=state.DEFAULT_PRIORITY,
                    payload=_payload(nid),
                    accepted_at=now,
                )
            )
        reliable.messages_store(messages=rows)
        self.accepted += [(m.notification_id, now) for m in rows]
        # The web schedules a fan-out with every accept; one batch of it runs now, and the pumps
        # it queues start.
        fanout_run(linger=0, max_run=60, max_batches=1)
        for sid in self.subs:
            self._start(sid)

    @precondition(_all_faults)
    @rule()
    def subscribe(self) -> None:
        if len(self.subs) < 3:
            self._subscribe()

    def _start(self, sid: str) -> None:
        free = [k for k in (0, 1) if (sid, k) not in self.slots]
        if not free:
            return
        pump = Pump(sid, push=self._push, keep_alive=False)
        if pump.acquire():  # a pump that starts reads its first batch at once
            key = (sid, free[0])
            self.slots[key] = Slot(pump)
            self._read(key)

    def _read(self, key: tuple[str, int]) -> None:
        slot = self.slots[key]
        slot.batch = slot.pump.next_batch()
        if slot.batch is None:
            self._end(key)

    def _pick(self, i: int, *, reading: bool | None = None) -> tuple[str, int] | None:
        """The i-th pump (modulo how many there are), among those reading or pushing if asked."""
        keys = sorted(
            key
            for key, slot in self.slots.items()
            if reading is None or (slot.batch is None) == reading
        )
        return keys[i % len(keys)] if keys else None

    @rule(sub=st.integers(0, 3))
    def pump_starts(self, sub: int) -> None:
        self._start(self._sid(sub))

    @rule(i=st.integers(0, 7))
    def pump_reads(self, i: int) -> None:
        key = self._pick(i, reading=True)
        if key is not None:
            self._read(key)

    @rule(i=st.integers(0, 7), answer=st.sampled_from(ANSWERS))
    def consumer_answers(self, i: int, answer: str) -> None:
        key = self._pick(i, reading=False)
        if key is None:
            return
        slot = self.slots[key]
        batch, pump = slot.batch, slot.pump
        assert batch is not None
        slot.batch = None
        self.answer = answer
        outcome = pump.push(batch)
        if answer == "crash":  # the worker dies once the consumer has the batch, before it settles
            del self.slots[key]
            return
        assert outcome is not None
        go_on = pump.delivered(batch) if outcome.ok else pump.failed(batch, outcome)
        if not go_on or pump.lost:
            self._end(key)

    @precondition(_all_faults)
    @rule(i=st.integers(0, 7))
    def worker_dies(self, i: int) -> None:
        key = self._pick(i)
        if key is not None:
            del self.slots[key]  # no settle, no release: its lease stays until it runs out

    @rule(i=st.integers(0, 7))
    def lease_runs_out(self, i: int) -> None:
        """A pump's lease runs out (its push is slow, or its worker is gone) and the safety net
        starts another pump on the same queue."""
        key = self._pick(i, reading=False) or self._pick(i)  # a push in flight, most likely
        sid = key[0] if key is not None else self._sid(i)
        self.r.delete(state.lease_key(sid))
        self._start(sid)

    @precondition(_all_faults)
    @rule()
    def beat(self) -> None:
        """The periodic work: the checkpoint, the retry sweep and the safety net."""
        reliable.checkpoint_run()
        retry_sweep()
        stall_sweep()
        for sid in self.subs:  # the pumps the sweeps queued
            self._start(sid)

    @precondition(_all_faults)
    @rule()
    def redis_is_lost(self) -> None:
        self.r.flushdb()

    # ------------------------------------------------------------------ invariants

    def _owed(self, sid: str) -> list[str]:
        """What the subscription should get: messages accepted once it existed, in order."""
        return [nid for nid, at in self.accepted if self.created[sid] <= at]

    def _dead(self, sid: str) -> set[str]:
        return set(
            DeadLetter.objects.filter(subscription_id=sid).values_list("notification_id", flat=True)
        )

    @invariant()
    def the_log_keeps_what_a_subscription_still_needs(self) -> None:
        if not self.accepted:
            return
        in_log = set(StoredMessage.objects.values_list("notification_id", flat=True))
        for sid in self.subs:
            had = set(self.received[sid]) | self._dead(sid)
            missing = [nid for nid in self._owed(sid) if nid not in had and nid not in in_log]
            assert not missing, f"{sid}: log rows deleted before delivery: {missing}"

    def teardown(self) -> None:
        try:
            self._drain()
            for sid in self.subs:
                owed, dead = self._owed(sid), self._dead(sid)
                got = list(dict.fromkeys(self.received[sid]))  # redeliveries dropped
                lost = [nid for nid in owed if nid not in got and nid not in dead]
                assert not lost, f"{sid} never got {len(lost)} of {len(owed)}: {lost}"
                order = {nid: i for i, nid in enumerate(owed)}
                firsts = [order[nid] for nid in got if nid in order]
                assert firsts == sorted(firsts), f"{sid} got messages out of order"
            # Memory follows the backlog: with every queue drained, no body and no count is left.
            left = self.r.keys(state.payload_key("*")) + self.r.keys(f"{state.PREFIX}refs:*")
            assert not left, f"bodies kept after every queue let them go: {left[:5]}"
        finally:
            self.slots.clear()

    def _drain(self) -> None:
        """Every process healthy again and every consumer answering: run until nothing is left."""
        self.answer = "ok"
        for _ in range(100):
            self.r.delete(FANOUT_LEASE, *(state.lease_key(s) for s in self.subs))
            self.slots.clear()
            fanout_run(linger=0, max_run=60)
            for sid in self.subs:
                self.r.zrem(state.RETRY, sid)
                Pump(sid, push=self._push, keep_alive=False).run()
            reliable.checkpoint_run()
            queued = any(self.r.exists(*state.queue_keys(s)) for s in self.subs)
            behind = reliable.log_head() > int(self.r.get(state.FANOUT_SEQ) or 0)
            if not queued and not behind:
                return
        pytest.fail("the engine did not drain in 100 rounds")


settings.register_profile(
    "simulation",
    max_examples=30,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)


@pytest.fixture
def engine(db, own_redis, settings):  # type: ignore[no-untyped-def]
    from topics.services import topic_create

    settings.HPWSN_PUSH_BATCH = 3
    settings.HPWSN_FANOUT_BATCH = 10
    settings.HPWSN_FANOUT_TICK_S = 0
    settings.HPWSN_DEDUP_WINDOW_S = 0  # rows are pruned as soon as nobody needs them
    settings.HPWSN_RETRY_SCHEDULE_S = [0.0, 0.0, 0.0]  # the fourth failure makes dead letters
    settings.HPWSN_RETRY_JITTER = 0.0
    settings.HPWSN_RETRY_THROTTLED_MIN_S = 0.0
    settings.HPWSN_CONSUMER_WINDOW = 0
    settings.HPWSN_CONSUMER_RATE = 0.0
    topic_create(path=TOPIC)
    return own_redis


def _machine_settings(profile: settings) -> settings:
    return settings(profile, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("machine", ["DeliveryMachine", "SlowConsumerMachine"])
def test_the_engine_loses_nothing_and_keeps_order_under_any_interleaving(engine, machine):
    # `make test` runs a bounded number of examples; --hypothesis-profile=long runs many more.
    long = settings.get_current_profile_name() == "long"
    base = settings() if long else settings.get_profile("simulation")
    run_state_machine_as_test(globals()[machine], settings=_machine_settings(base))


class SlowConsumerMachine(DeliveryMachine):
    """The same world with one kind of trouble only: pushes that outlive their lease."""

    all_faults = False


def test_it_finds_the_lost_batch_without_the_fence(engine, monkeypatch):
    monkeypatch.setattr(pump_module, "_TAKE", state.Script(UNFENCED_TAKE))
    monkeypatch.setattr(pump_module, "RENEW", state.Script(UNFENCED_RENEW))
    found = settings(
        settings.get_profile("simulation"),
        max_examples=300,
        stateful_step_count=50,
        derandomize=True,
        phases=[Phase.generate],  # finding it is the point; shrinking would only take time
        deadline=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    with pytest.raises(AssertionError, match=r"never got|log rows deleted"):
        run_state_machine_as_test(SlowConsumerMachine, settings=found)
