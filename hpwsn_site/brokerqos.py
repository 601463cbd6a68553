"""A worker that keeps consuming after an acknowledgement failed (kombu's Redis transport).

kombu's Redis QoS acknowledges a task in two steps: it removes the delivery from Redis's unacked
index, then forgets it locally. When Redis is away at that moment (a master killed before Sentinel
promotes its replica), the first step raises and the second never runs: the delivery stays counted
as in flight. With `worker_prefetch_multiplier = 1` a worker of two processes may have two in
flight, so two failed acknowledgements stop it for good: it never asks Redis for another task,
while beat's tasks pile up and reliable messages wait in the log (tests/integration/
test_sentinel.py saw it: both consumers stopped at the half published before the failover).

Here the local step runs whatever the Redis step did, for an acknowledgement and for a rejection
(a task whose worker process was lost, put back on its queue). The error still reaches Celery,
which logs it ("Couldn't ack"); the index entry left in Redis brings the task back after the
visibility timeout, and every HPwsn task is safe to run twice.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual


class QoS(kombu_redis.QoS):
    def ack(self, delivery_tag: Any) -> None:
        try:
            self._remove_from_indices(delivery_tag).execute()  # type: ignore[no-untyped-call]
        finally:
            virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        """A rejection (a worker process lost under a task) has the same two steps."""
        try:
            if requeue:
                self.restore_by_tag(delivery_tag, leftmost=True)  # type: ignore[no-untyped-call]
            else:
                self._remove_from_indices(delivery_tag).execute()  # type: ignore[no-untyped-call]
        finally:
            virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]


def install() -> None:
    """Make every Redis and Sentinel channel of this process use the QoS above."""
    kombu_redis.Channel.QoS = QoS
