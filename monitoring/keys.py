"""Redis keys of the monitoring app (the counters' own keys are in `monitoring.counters`)."""

from monitoring.counters import PREFIX

NODES = PREFIX + "nodes"  # hash: node id -> JSON record (identity + last heartbeat figures)
HISTORY = PREFIX + "history"  # list of compact JSON points, one per second, the last 15 minutes
LAST = PREFIX + "last"  # the latest full snapshot (JSON), for a page that just connected
LAST_SECOND = PREFIX + "snap:sec"  # second of the latest snapshot: one snapshot per second
HISTORY_LEN = 900
GROUP = "monitoring"  # Channels group of the dashboard sockets
