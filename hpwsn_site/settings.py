"""HPwsn settings from the environment: safe local defaults; production values in the README."""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url

from federation.peers import credentials_parse, group_check, peers_parse, site_name_check
from hpwsn_site.env import env_bool, env_float, env_int, env_list, env_str, parse_rate
from hpwsn_site.redisconn import RedisTarget, sentinels_parse

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("HPWSN_DATA_DIR", str(BASE_DIR / "var")))
# The data dir holds the database (sessions, API token digests, peers' signing secrets), Redis's
# append-only file and the local secrets: its owner only.
DATA_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)


def _secret_key() -> str:
    # A local run without HPWSN_SECRET_KEY gets a random key kept in the data dir, never a constant.
    key = env_str("HPWSN_SECRET_KEY")
    if key:
        return key
    path = DATA_DIR / "secret_key"
    try:
        # Made with its final mode in one step (no moment readable by others), and by one process
        # only when the web, worker and beat start together.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(secrets.token_urlsafe(50))
    return path.read_text(encoding="utf-8").strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("HPWSN_DEBUG", False)
ALLOWED_HOSTS = env_list("HPWSN_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("HPWSN_CSRF_TRUSTED_ORIGINS", [])
# Reverse proxies in front of the web server (docs/deployment.md). With one or more, the nearest
# one's X-Forwarded-Proto says whether the client came over TLS; without, no proxy header is read.
HPWSN_API_PROXIES = env_int("HPWSN_API_PROXIES", 0)
if HPWSN_API_PROXIES > 0:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "topics",
    "subscriptions",
    "dispatch",
    "monitoring",
    "directory",
    "audit",
    "console",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "hpwsn_site.api",
    "spark",
    "federation",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "hpwsn_site.urls"
ASGI_APPLICATION = "hpwsn_site.asgi.application"
WSGI_APPLICATION = "hpwsn_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{DATA_DIR / 'hpwsn.sqlite3'}")
# Connections are kept (CONN_MAX_AGE) by the web's threads (publishing, group commits, requests),
# the worker's tasks and pump loops and the health checks; each is checked before its first use in
# a unit of work (on PostgreSQL a poll of its socket, hpwsn_site/postgresql/base.py; nothing on
# SQLite), so one the server dropped is replaced before a publish or a pump fails on it.
DATABASES = {
    "default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Django's own, with a health check that costs a poll instead of a round trip.
    DATABASES["default"]["ENGINE"] = "hpwsn_site.postgresql"
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL + IMMEDIATE lets the web process, workers and beat share the embedded database safely.
    # Connections are kept: opening one costs more than the insert a reliable publish makes.
    # A new file is made with auto_vacuum, so that the checkpoint gives the pages of pruned log
    # rows back (dispatch/reliable.py) and the file follows the backlog; then WAL
    # (hpwsn_site/sqlite3/base.py: neither as an init command, where auto_vacuum took a lock).
    DATABASES["default"]["ENGINE"] = "hpwsn_site.sqlite3"
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA synchronous=NORMAL;",
    }
    # A file, not memory, so the web and worker processes a test starts share it.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Redis Sentinel (hpwsn_site/redisconn.py, docs/deployment.md): the master is asked of these
# sentinels; REDIS_URL then gives only the password and the database number.
REDIS_SENTINELS = sentinels_parse(env_str("REDIS_SENTINELS"))
REDIS_SENTINEL_MASTER = env_str("REDIS_SENTINEL_MASTER", "mymaster")
REDIS_SENTINEL_PASSWORD = env_str("REDIS_SENTINEL_PASSWORD")
_REDIS = RedisTarget(
    url=REDIS_URL,
    sentinels=REDIS_SENTINELS,
    master=REDIS_SENTINEL_MASTER,
    sentinel_password=REDIS_SENTINEL_PASSWORD,
)

# Celery. Tasks are short and idempotent (leases, conditional claims), so late ack + reject on
# worker loss re-runs a task whose worker died instead of losing it. Nothing ever waits in the
# broker with an ETA: retries are due times in Redis picked up by the beat sweeper, so the
# visibility timeout only has to exceed the longest task run.
CELERY_BROKER_URL = _REDIS.celery_broker_url()
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery's Django fix-up closes every database connection before and after each task, whatever
# CONN_MAX_AGE says: the worker opened a connection for nearly every task, a few a second when idle
# (the periodic sweeps), each a new server process on PostgreSQL. This leaves the fix-up's closing
# to once in 250,000 tasks; hpwsn_site/celery.py closes the connections by CONN_MAX_AGE and
# when broken, before and after each task, as Django does around a request.
CELERY_DB_REUSE_MAX = 250_000
# No remote control (nothing here uses `celery inspect/control`): its broadcast queue is deleted
# when the broker connection drops, and kombu's Redis Sentinel transport then fails to rebuild its
# connection parameters during a failover and stops the worker ("Unrecoverable error").
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600, **_REDIS.celery_transport_options()}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE = {
    "dispatch-retry-sweep": {"task": "dispatch.tasks.retry_sweep", "schedule": 1.0},
    "dispatch-stall-sweep": {"task": "dispatch.tasks.stall_sweep", "schedule": 5.0},
    # Reliable topics: watermarks to the database, log pruning, recovery after a Redis loss.
    "dispatch-reliable-checkpoint": {
        "task": "dispatch.tasks.reliable_checkpoint",
        "schedule": 1.0,
        "options": {"expires": 3.0},
    },
    "subscriptions-pull-points-expire": {
        "task": "subscriptions.tasks.pull_points_expire",
        "schedule": 60.0,
    },
    "subscriptions-expire": {"task": "subscriptions.tasks.subscriptions_expire", "schedule": 5.0},
    "dispatch-fragments-expire": {"task": "dispatch.tasks.fragments_expire", "schedule": 5.0},
}

# Live monitoring (docs/monitoring.md). HPWSN_MONITORING=0 turns the counters and the per-second
# snapshot off (the node registry's heartbeats stay: /healthz needs them).
HPWSN_MONITORING = env_bool("HPWSN_MONITORING", True)
# The node this process belongs to (docs/deployment.md): a site's machines share DATABASE_URL and
# REDIS_URL and are told apart in the node registry by this name (default: the host name).
HPWSN_NODE_NAME = env_str("HPWSN_NODE_NAME") or socket.gethostname()
HPWSN_HEARTBEAT_S = env_float("HPWSN_HEARTBEAT_S", 2.0)
HPWSN_NODE_DEAD_AFTER_S = env_float("HPWSN_NODE_DEAD_AFTER_S", 10.0)
HPWSN_NODE_PRUNE_AFTER_S = env_float("HPWSN_NODE_PRUNE_AFTER_S", 3600.0)
HPWSN_METRICS_TOKEN = env_str("HPWSN_METRICS_TOKEN")  # when set, /metrics wants this bearer token
HPWSN_METRICS_TOP_N = env_int("HPWSN_METRICS_TOP_N", 50)  # label values per topic/consumer metric
# Labelled fields (counters by topic and by consumer) the running totals keep; past it the smallest
# are added into their counter's "(other)" label (monitoring.services.labels_bound).
HPWSN_MONITORING_MAX_LABELS = env_int("HPWSN_MONITORING_MAX_LABELS", 5000)
if HPWSN_MONITORING:
    # Expires: a snapshot that waited behind a backlog is stale; the next second brings a fresh one.
    CELERY_BEAT_SCHEDULE["monitoring-stats-snapshot"] = {
        "task": "monitoring.tasks.stats_snapshot",
        "schedule": 1.0,
        "options": {"expires": 3.0},
    }
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [_REDIS.channel_layer_host()], "prefix": "hpwsn:asgi"},
    }
}

# Broker behaviour.
HPWSN_PUBLIC_URL = env_str(
    "HPWSN_PUBLIC_URL", ""
)  # e.g. https://wsn.example.com; default: from Host
if HPWSN_PUBLIC_URL:  # the console's forms are posted from there (behind a TLS proxy too)
    _public = urlsplit(HPWSN_PUBLIC_URL)
    CSRF_TRUSTED_ORIGINS = [*CSRF_TRUSTED_ORIGINS, f"{_public.scheme}://{_public.netloc}"]
    # Served over TLS: the login's session and CSRF cookies never travel in clear, not even to
    # an http:// address of the same host an attacker on the path makes the browser ask for.
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = _public.scheme == "https"
HPWSN_MAX_REQUEST_BYTES = env_int("HPWSN_MAX_REQUEST_BYTES", 10 * 1024 * 1024)
HPWSN_MAX_XML_DEPTH = env_int("HPWSN_MAX_XML_DEPTH", 64)
# Namespace declarations one request may carry (hpwsn/xmlsafe.py): each is copied into every
# message serialised below it, so their number multiplies the cost of a request.
HPWSN_MAX_XML_NAMESPACES = env_int("HPWSN_MAX_XML_NAMESPACES", 256)
HPWSN_MAX_XML_ATTRIBUTES = env_int("HPWSN_MAX_XML_ATTRIBUTES", 256)  # per element
# MessageContent filters (hpwsn/xpathfilter.py): the longest expression accepted at Subscribe, and
# the largest message a filter is evaluated on (a larger one matches no filter, and is counted).
HPWSN_FILTER_MAX_CHARS = env_int("HPWSN_FILTER_MAX_CHARS", 1024)
HPWSN_FILTER_MAX_PAYLOAD_BYTES = env_int("HPWSN_FILTER_MAX_PAYLOAD_BYTES", 256 * 1024)
# Topics made by publishing under a topic that creates children on publish: at most this many by
# one Notify or REST publish, and none once the tree holds HPWSN_MAX_TOPICS. Each is a database
# row, a directory entry and a node of every process's tree.
HPWSN_AUTO_CREATE_MAX_PER_NOTIFY = env_int("HPWSN_AUTO_CREATE_MAX_PER_NOTIFY", 100)
HPWSN_MAX_TOPICS = env_int("HPWSN_MAX_TOPICS", 100_000)
HPWSN_MESSAGE_RETENTION_S = env_int("HPWSN_MESSAGE_RETENTION_S", 3 * 24 * 3600)
HPWSN_PUSH_BATCH = env_int("HPWSN_PUSH_BATCH", 250)
# A push batch (and a fan-out batch) also ends at the message that brings it to this many bytes
# of payload: a hundred 10 MiB messages must not make one 1 GiB envelope.
HPWSN_PUSH_BATCH_BYTES = env_int("HPWSN_PUSH_BATCH_BYTES", 4 * 1024 * 1024)
HPWSN_FANOUT_BATCH_BYTES = env_int("HPWSN_FANOUT_BATCH_BYTES", 16 * 1024 * 1024)
HPWSN_PUSH_TIMEOUT_S = env_float("HPWSN_PUSH_TIMEOUT_S", 10.0)
# Networks (CIDR), host names and .domain suffixes consumers may live in; checked after DNS.
# Link-local and cloud-metadata addresses are refused whatever this says.
HPWSN_PUSH_ALLOW = env_list("HPWSN_PUSH_ALLOW", ["127.0.0.0/8", "::1/128"])
# Where the web server listens (scripts/run.sh exports them): never a push target, like
# HPWSN_PUBLIC_URL and the address a Subscribe reached the broker at.
HPWSN_HTTP_HOST = env_str("HPWSN_HTTP_HOST", "")
HPWSN_HTTP_PORT = env_int("HPWSN_HTTP_PORT", 0)
# Delay after the 1st, 2nd, ... failed attempt at a batch; a failure after the last step moves the
# batch to the dead-letter store (so a batch gets 1 + len(schedule) attempts). A topic's policy
# may set its own schedule. The default backs off within the first minute (a consumer that drops
# an odd request is retried at once, then after a second, two, five...) and gives up after about
# 27.6 hours, as the schedule before it did.
HPWSN_RETRY_SCHEDULE_S = [
    float(x)
    for x in env_list(
        "HPWSN_RETRY_SCHEDULE_S",
        ["0", "1", "2", "5", "10", "30", "60", "300", "1800", "7200", "18000", "36000", "36000"],
    )
]
HPWSN_RETRY_JITTER = env_float("HPWSN_RETRY_JITTER", 0.2)
# A consumer that throttles (429), or times out twice in a row, waits this long at least.
HPWSN_RETRY_THROTTLED_MIN_S = env_float("HPWSN_RETRY_THROTTLED_MIN_S", 60.0)
# A consumer failing continuously this long (since its last success) is suspended.
HPWSN_SUSPEND_AFTER_S = env_float("HPWSN_SUSPEND_AFTER_S", 86400.0)
HPWSN_FANOUT_BATCH = env_int("HPWSN_FANOUT_BATCH", 500)
# After a batch smaller than HPWSN_FANOUT_BATCH the fan-out waits this long for more: bigger
# batches and pushes, less CPU a notification at moderate rates, for later deliveries.
HPWSN_FANOUT_TICK_S = env_float("HPWSN_FANOUT_TICK_S", 0.005)
HPWSN_PULLPOINT_MAX_DEPTH = env_int("HPWSN_PULLPOINT_MAX_DEPTH", 100_000)
# A full pull point drops its oldest messages (drop_oldest) or refuses new ones (refuse); both
# are counted. A pull point nobody has read for HPWSN_PULLPOINT_IDLE_S is destroyed (0: never).
HPWSN_PULLPOINT_OVERFLOW = env_str("HPWSN_PULLPOINT_OVERFLOW", "drop_oldest")
if HPWSN_PULLPOINT_OVERFLOW not in ("drop_oldest", "refuse"):
    raise ValueError("HPWSN_PULLPOINT_OVERFLOW must be drop_oldest or refuse")
HPWSN_PULLPOINT_IDLE_S = env_int("HPWSN_PULLPOINT_IDLE_S", 7 * 24 * 3600)
# What one principal may hold at once (anonymous callers share one allowance; 0: no limit). Each
# is a database row; a subscription or registration also a directory entry, and a subscription an
# entry of every worker's index.
HPWSN_MAX_SUBSCRIPTIONS_PER_OWNER = env_int("HPWSN_MAX_SUBSCRIPTIONS_PER_OWNER", 100_000)
HPWSN_MAX_PULLPOINTS_PER_OWNER = env_int("HPWSN_MAX_PULLPOINTS_PER_OWNER", 10_000)
HPWSN_MAX_REGISTRATIONS_PER_OWNER = env_int("HPWSN_MAX_REGISTRATIONS_PER_OWNER", 10_000)
# One GetMessages reply ends at the message that brings it to this many bytes of payload (one
# message at least): 10,000 queued 10 MiB messages must not be read into one reply.
HPWSN_PULL_BATCH_BYTES = env_int("HPWSN_PULL_BATCH_BYTES", 4 * 1024 * 1024)
# A repeated wsa:MessageID / Idempotency-Key within this window is accepted and not stored again.
HPWSN_DEDUP_WINDOW_S = env_int("HPWSN_DEDUP_WINDOW_S", 300)
# A pump or fan-out that stops renewing its lease (a killed worker) is replaced after this long.
HPWSN_LEASE_S = env_float("HPWSN_LEASE_S", 30.0)
# The periodic work whose cost grows with the busy subscriptions (the checkpoint, the stall sweep,
# the snapshot's queue depths) is spaced out to take at most this share of the time.
HPWSN_PERIODIC_SHARE = env_float("HPWSN_PERIODIC_SHARE", 0.05)
# Django's HTTP requests (pages, REST other than publishing) run their synchronous work on this many
# threads per web process, each keeping its database connection (hpwsn_site/requestthreads.py); more
# requests at once wait for a thread.
HPWSN_WEB_REQUEST_THREADS = env_int("HPWSN_WEB_REQUEST_THREADS", 16)
# SOAP's operations on subscriptions, pull points and registrations (and a REST publisher's token
# check) reach the database on this many threads per web process, each keeping its connection
# (hpwsn_site/soapcall.py): a slow call holds up its own thread, not the others. Under load more
# threads cost more CPU a call (they take turns at the interpreter's lock): 4 cost a third more
# than 1 on SQLite, 2 about the same (docs/benchmarks.md).
HPWSN_WEB_SOAP_THREADS = env_int("HPWSN_WEB_SOAP_THREADS", 2)
# Each worker process pushes to this many subscriptions at once (dispatch/pumploop.py); a pump
# drains its subscription for at most HPWSN_PUMP_SLICE_S before the others get their turn.
HPWSN_PUMP_THREADS = env_int("HPWSN_PUMP_THREADS", 16)
HPWSN_PUMP_SLICE_S = env_float("HPWSN_PUMP_SLICE_S", 2.0)
# Their database work (dead letters, suspensions, the change log) runs on this many threads of
# the process, which keep their connections (hpwsn_site/dblane.py): a pool process holds at most
# this many connections and one for its tasks, not one per pump thread.
HPWSN_PUMP_DB_THREADS = env_int("HPWSN_PUMP_DB_THREADS", 2)
# A thread shared by many callers (a SOAP thread of the web, a pump lane's) waits at most this
# long for a lock (PostgreSQL's rows an operator's transaction holds, SQLite's write lock), then
# fails its call: a SOAP caller gets ResourceUnavailableFault (503, Retry-After), a pump pushes
# the batch again later.
HPWSN_DB_LOCK_TIMEOUT_S = env_float("HPWSN_DB_LOCK_TIMEOUT_S", 5.0)
# Flow control per consumer (scheme://host:port): at most this many messages in flight at once
# over all its subscriptions, and at most this many messages per second (0: unlimited).
HPWSN_CONSUMER_WINDOW = env_int("HPWSN_CONSUMER_WINDOW", 500)
HPWSN_CONSUMER_RATE = env_float("HPWSN_CONSUMER_RATE", 0.0)
HPWSN_QUEUE_MAX_DEPTH = env_int("HPWSN_QUEUE_MAX_DEPTH", 1_000_000)
# Fragmentation (thesis 5.3.3.4, dispatch/fragments.py). Pushes: a message whose payload exceeds
# HPWSN_FRAGMENT_SIZE bytes goes as fragments (0: never split; the size bounds each fragment's
# payload bytes, before XML escaping), marked as deliverable one by one if HPWSN_FRAGMENT_PARTIAL.
# Ingest: a reassembly is dropped when its next fragment has not come within the timeout.
HPWSN_FRAGMENT_SIZE = env_int("HPWSN_FRAGMENT_SIZE", 0)
if 0 < HPWSN_FRAGMENT_SIZE < 4:
    raise ValueError("HPWSN_FRAGMENT_SIZE must be 0 (never split) or at least 4 bytes")
HPWSN_FRAGMENT_PARTIAL = env_bool("HPWSN_FRAGMENT_PARTIAL", False)
HPWSN_FRAGMENT_TIMEOUT_S = env_float("HPWSN_FRAGMENT_TIMEOUT_S", 60.0)
HPWSN_MAX_REASSEMBLY_BYTES = env_int("HPWSN_MAX_REASSEMBLY_BYTES", 100 * 1024 * 1024)
# ... and of all the reassemblies held at once: each is in Redis until it completes or times out.
HPWSN_MAX_REASSEMBLIES_BYTES = env_int("HPWSN_MAX_REASSEMBLIES_BYTES", 1024 * 1024 * 1024)

# ------------------------------------------------------------- LDAP directory (docs/directory.md)
# The OpenLDAP directory of record for topics, subscriptions, people and groups. An empty URL means
# no directory: the broker runs from its database only, login is by local Django users.
HPWSN_LDAP_URL = env_str("LDAP_URL") or env_str("HPWSN_LDAP_URL")
HPWSN_LDAP_BASE_DN = env_str("HPWSN_LDAP_BASE_DN", "dc=hpwsn,dc=local")
# The broker's own identity: writes ou=topics, ou=subscriptions and ou=registrations, reads people
# and groups, and is the only one that may read hpwsnDigestSecret (slapd ACL,
# directory/slapd/slapd.conf.in).
HPWSN_LDAP_BIND_DN = env_str("HPWSN_LDAP_BIND_DN", f"cn=broker,{HPWSN_LDAP_BASE_DN}")
HPWSN_LDAP_BIND_PASSWORD = env_str("HPWSN_LDAP_BIND_PASSWORD")
HPWSN_LDAP_TIMEOUT_S = env_float("HPWSN_LDAP_TIMEOUT_S", 5.0)
HPWSN_LDAP_TOPICS_DN = f"ou=topics,{HPWSN_LDAP_BASE_DN}"
HPWSN_LDAP_SUBSCRIPTIONS_DN = f"ou=subscriptions,{HPWSN_LDAP_BASE_DN}"
HPWSN_LDAP_REGISTRATIONS_DN = f"ou=registrations,{HPWSN_LDAP_BASE_DN}"
HPWSN_LDAP_PEOPLE_DN = f"ou=people,{HPWSN_LDAP_BASE_DN}"
HPWSN_LDAP_GROUPS_DN = f"ou=groups,{HPWSN_LDAP_BASE_DN}"
# Outbox writes that failed wait this long (times 2 per attempt, capped) before the next try.
HPWSN_LDAP_RETRY_S = env_float("HPWSN_LDAP_RETRY_S", 2.0)
HPWSN_LDAP_RETRY_MAX_S = env_float("HPWSN_LDAP_RETRY_MAX_S", 60.0)
CELERY_BEAT_SCHEDULE["directory-outbox-flush"] = {
    "task": "directory.tasks.outbox_flush",
    "schedule": 2.0,
    "options": {"expires": 10.0},
}
# Login: LDAP accounts (directory/auth.py, configured from the settings above; it declines when no
# directory is configured), then local Django users (ModelBackend) as the fallback.
AUTHENTICATION_BACKENDS = [
    "directory.auth.DirectoryBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# ------------------------------------------------------------- end of LDAP directory

# SOAP callers (hpwsn_site/auth.py, docs/protocol.md "Security"): how long a verified caller is
# trusted without asking the directory, and for how long when the directory is down; the window of
# a UsernameToken's Created time (and so how long its nonce is remembered).
HPWSN_AUTH_CACHE_S = env_float("HPWSN_AUTH_CACHE_S", 60.0)
HPWSN_AUTH_STALE_S = env_float("HPWSN_AUTH_STALE_S", 3600.0)
HPWSN_WSSE_MAX_AGE_S = env_float("HPWSN_WSSE_MAX_AGE_S", 300.0)
HPWSN_WSSE_MAX_SKEW_S = env_float("HPWSN_WSSE_MAX_SKEW_S", 60.0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("HPWSN_LOG_LEVEL", "INFO")},
    "loggers": {
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
        # Spyne logs every Client fault with a traceback at ERROR; hpwsn_site.legacy logs one
        # line instead. Its Server faults (spyne.application) still log with their traceback.
        "spyne.application.client": {"level": "CRITICAL"},
        "spyne.server._base": {"level": "CRITICAL"},  # the same, for faults found while parsing
    },
}

# ------------------------------------------------------------- analytics (docs/analytics.md)
# The event log every process appends to (spark/eventlog.py); HPWSN_EVENTS=0 turns it off.
HPWSN_EVENTS = env_bool("HPWSN_EVENTS", True)
HPWSN_EVENTS_DIR = Path(env_str("HPWSN_EVENTS_DIR", str(DATA_DIR / "events")))
HPWSN_EVENTS_FLUSH_S = env_float("HPWSN_EVENTS_FLUSH_S", 1.0)
HPWSN_EVENTS_RETENTION_DAYS = env_int("HPWSN_EVENTS_RETENTION_DAYS", 30)
# Where the jobs read the log: any URI Spark reads (file://, hdfs://, s3a://) holding the same
# date=/hour= layout, e.g. after an export; by default the local directory above.
HPWSN_EVENTS_URI = env_str("HPWSN_EVENTS_URI", HPWSN_EVENTS_DIR.resolve().as_uri())
# A run first compacts the closed hours of its range to Parquet (spark/compaction.py).
HPWSN_EVENTS_COMPACT = env_bool("HPWSN_EVENTS_COMPACT", True)
HPWSN_ANALYTICS_DIR = Path(env_str("HPWSN_ANALYTICS_DIR", str(DATA_DIR / "analytics")))
HPWSN_SPARK_MASTER = env_str("HPWSN_SPARK_MASTER", "local[*]")
HPWSN_SPARK_SHUFFLE_PARTITIONS = env_int("HPWSN_SPARK_SHUFFLE_PARTITIONS", 8)
HPWSN_SPARK_DRIVER_MEMORY = env_str("HPWSN_SPARK_DRIVER_MEMORY", "1g")
# The nightly run: every job over the last HPWSN_ANALYTICS_NIGHTLY_DAYS days, at this UTC time
# ("HH:MM"; empty turns the schedule off).
HPWSN_ANALYTICS_NIGHTLY_AT = env_str("HPWSN_ANALYTICS_NIGHTLY_AT", "02:30")
HPWSN_ANALYTICS_NIGHTLY_DAYS = env_int("HPWSN_ANALYTICS_NIGHTLY_DAYS", 7)
# The longest range a run may cover: a run lists every hour of its range (twice as long with the
# regressions job) before Spark reads anything, holding the one Spark lease meanwhile.
HPWSN_ANALYTICS_MAX_DAYS = env_int("HPWSN_ANALYTICS_MAX_DAYS", 366)
# Rows of each job's result kept in the database for the page and CSV (the Parquet has them all).
HPWSN_ANALYTICS_MAX_ROWS = env_int("HPWSN_ANALYTICS_MAX_ROWS", 20000)
# Runs queued or running at once: beyond it a new run is refused (one holds Spark at a time, so
# a script or a stuck button that queues thousands only fills the history with failed runs).
HPWSN_ANALYTICS_MAX_QUEUED = env_int("HPWSN_ANALYTICS_MAX_QUEUED", 20)
if HPWSN_ANALYTICS_NIGHTLY_AT:
    from celery.schedules import crontab

    _hour, _minute = HPWSN_ANALYTICS_NIGHTLY_AT.split(":")
    CELERY_BEAT_SCHEDULE["spark-analytics-nightly"] = {
        "task": "spark.tasks.analytics_nightly",
        "schedule": crontab(hour=_hour, minute=_minute),
    }
CELERY_BEAT_SCHEDULE["spark-events-housekeeping"] = {
    "task": "spark.tasks.events_housekeeping",
    "schedule": 600.0,
}

# Federation of sites (docs/deployment.md): this site's name, its peers (name=base URL, comma-
# separated), the base URL peers reach it at, how often its links at the peers are brought in
# step (and the peers heartbeat), how long a link lives without renewal, when a peer is down.
HPWSN_SITE_NAME = site_name_check(env_str("HPWSN_SITE_NAME", "site"))
HPWSN_FEDERATION_PEERS = peers_parse(env_str("HPWSN_FEDERATION_PEERS"), own=HPWSN_SITE_NAME)
# The directory account this site's links use at each peer (HTTP Basic; `peer=user:password,...`,
# or from HPWSN_FEDERATION_CREDENTIALS_FILE): the links are that account's at the peer. A peer not
# listed is subscribed at anonymously. What a peer forwards here is published as `site:<peer>`, a
# principal in HPWSN_FEDERATION_GROUP, which topics' publish_groups may name.
HPWSN_FEDERATION_CREDENTIALS = credentials_parse(
    env_str("HPWSN_FEDERATION_CREDENTIALS"), peers=(p.name for p in HPWSN_FEDERATION_PEERS)
)
HPWSN_FEDERATION_GROUP = group_check(env_str("HPWSN_FEDERATION_GROUP", "federation"))
HPWSN_FEDERATION_URL = env_str(
    "HPWSN_FEDERATION_URL",
    HPWSN_PUBLIC_URL
    or f"http://{env_str('HPWSN_HTTP_HOST', '127.0.0.1')}:{env_str('HPWSN_HTTP_PORT', '8000')}",
)
HPWSN_FEDERATION_SYNC_S = env_float("HPWSN_FEDERATION_SYNC_S", 5.0)
HPWSN_FEDERATION_LINK_TTL_S = env_float("HPWSN_FEDERATION_LINK_TTL_S", 300.0)
HPWSN_FEDERATION_DEAD_AFTER_S = env_float("HPWSN_FEDERATION_DEAD_AFTER_S", 30.0)
# Every push a peer makes here must be signed with the SigningSecret of this site's links there
# (federation.peers.link_signing_secret). On for the time an upgrade from a version whose links
# were not signed takes (until the links are made again, within one sync round): those pushes are
# then taken on the strength of their address alone.
HPWSN_FEDERATION_ACCEPT_UNSIGNED = env_bool("HPWSN_FEDERATION_ACCEPT_UNSIGNED", False)
# What each peer may push here, in notifications (count/second|minute|hour; 0/second: no limit),
# and how many it may push at once after a quiet spell (a token bucket per peer, in Redis). Past
# it a push is answered 503 with a Retry-After and nothing of it is stored: the peer's pump pushes
# it again. Generous, so that a peer's catching up after an outage is slowed, not refused for good.
HPWSN_FEDERATION_INBOUND_RATE = env_str("HPWSN_FEDERATION_INBOUND_RATE", "5000/second")
HPWSN_FEDERATION_INBOUND_BURST = env_int("HPWSN_FEDERATION_INBOUND_BURST", 20000)
try:  # a malformed rate stops the start, not a push
    parse_rate(HPWSN_FEDERATION_INBOUND_RATE)
except (ValueError, KeyError):
    raise ValueError(
        f"HPWSN_FEDERATION_INBOUND_RATE: {HPWSN_FEDERATION_INBOUND_RATE!r} is not "
        "<count>/<second|minute|hour>"
    ) from None
if HPWSN_FEDERATION_PEERS:
    CELERY_BEAT_SCHEDULE["federation-sync"] = {
        "task": "federation.tasks.federation_sync",
        "schedule": HPWSN_FEDERATION_SYNC_S,
        "options": {"expires": HPWSN_FEDERATION_SYNC_S * 2},
    }

# request.body refuses anything larger; the SOAP view answers a fault before that.
DATA_UPLOAD_MAX_MEMORY_SIZE = HPWSN_MAX_REQUEST_BYTES

# REST API (/api/v1/, hpwsn_site/api/, docs/api.md): API tokens, HTTP Basic against the directory,
# the console's session; problem+json errors; rate limits per principal (count/second|minute|hour,
# 0 = none) by scope: `publish` for POST .../messages, `tokens` for token creation, `api` the rest.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "hpwsn_site.api.auth.TokenAuthentication",
        "hpwsn_site.api.auth.DirectoryBasicAuthentication",
        "hpwsn_site.api.auth.ConsoleSessionAuthentication",
    ],
    # Closed unless a view says otherwise (hpwsn_site/api/permissions.py).
    "DEFAULT_PERMISSION_CLASSES": ["hpwsn_site.api.permissions.Authenticated"],
    "DEFAULT_THROTTLE_CLASSES": ["hpwsn_site.api.throttling.PrincipalThrottle"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["hpwsn_site.api.parsers.JsonParser"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "hpwsn_site.api.problems.exception_handler",
    "UNAUTHENTICATED_USER": None,
    # Anonymous callers are told apart by the peer address, not by an X-Forwarded-For they could
    # make up; behind a proxy set HPWSN_API_PROXIES to the number of proxies in front.
    "NUM_PROXIES": HPWSN_API_PROXIES,
}
# Failed logins at the console's and the admin's forms, per client address and user name, before
# the form refuses until the window ends (hpwsn_site/loginguard.py; 0/hour: no limit).
HPWSN_LOGIN_THROTTLE = env_str("HPWSN_LOGIN_THROTTLE", "20/hour")
# Live (unrevoked) API tokens a principal may hold: each is a row every web process loads.
HPWSN_API_MAX_TOKENS = env_int("HPWSN_API_MAX_TOKENS", 100)
HPWSN_API_THROTTLE = {
    "api": env_str("HPWSN_API_THROTTLE_API", "1200/minute"),
    "publish": env_str("HPWSN_API_THROTTLE_PUBLISH", "600000/minute"),
    "tokens": env_str("HPWSN_API_THROTTLE_TOKENS", "20/minute"),
}
SPECTACULAR_SETTINGS = {
    "TITLE": "HPwsn REST API",
    "DESCRIPTION": (
        "Publish, subscribe, pull and operate the HPwsn WS-Notification broker over JSON. "
        "Errors are RFC 9457 problem+json; see docs/api.md."
    ),
    "VERSION": "1",
    "OAS_VERSION": "3.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": "/api/v1",
}
