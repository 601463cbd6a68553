#!/usr/bin/env bash
# `make run`: install what is missing, then run HPwsn in the foreground
# (redis, web, worker, beat) with prefixed output. Ctrl-C / SIGTERM stops
# everything this script started; if any process dies, the rest are stopped
# and the script exits non-zero.
#
# Settings (environment):
#   REDIS_URL                 use this Redis; else a local one is started on
#                             127.0.0.1:$HPWSN_REDIS_PORT (default 6399)
#   DATABASE_URL              use this database; else SQLite in the data dir
#   HPWSN_DATA_DIR            data dir (default var/)
#   HPWSN_HTTP_HOST / _PORT   default 127.0.0.1 / 8000
#   HPWSN_ROLES               which processes this node runs: any of web,worker,beat,directory
#                             (comma-separated; default all). A site may run many nodes on one
#                             PostgreSQL and Redis (docs/deployment.md)
#   HPWSN_NODE_NAME           this node's name in the node registry (default: the host name)
#   HPWSN_LOCAL_SERVICES      auto (default): start Redis / slapd when REDIS_URL / LDAP_URL is
#                             not given; none: start neither, REDIS_URL (or REDIS_SENTINELS)
#                             and DATABASE_URL must name the site's shared servers, and without
#                             LDAP_URL the node runs without a directory
#   HPWSN_MIGRATE             1 (default): apply database migrations at start; 0 on nodes that
#                             join a site whose database is already migrated
#   HPWSN_WEB_WORKERS         uvicorn workers (default 1)
#   HPWSN_WORKER_CONCURRENCY  celery worker concurrency (default 2)
#   LDAP_URL                  use this LDAP directory; else a local slapd is started
#                             on 127.0.0.1:$HPWSN_LDAP_PORT (default 3899), data in
#                             the data dir, seeded with the demo directory (README)
#   HPWSN_LDAP_BIND_PASSWORD  the broker's LDAP password (local slapd default: made at the
#                             first start, kept in <data dir>/slapd/broker.password)
#   HPWSN_LDAP_ADMIN_PASSWORD the local slapd's directory manager password (default: made at
#                             the first start, kept in <data dir>/slapd/admin.password)
#   HPWSN_LDAP_DEMO_PASSWORD  the demo people's password at first seeding (default hpwsn-demo,
#                             refused when the web or slapd listens beyond 127.0.0.1)
#   HPWSN_DIRECTORY_SHARE_WITH  the local slapd shares its topic tree (ou=topics only) with
#                             these peer sites' slapd: ldap:// URLs, comma-separated; empty
#                             (default): the site keeps its own tree (docs/deployment.md)
#   HPWSN_DIRECTORY_SERVER_ID  this site's replica id when sharing, 1..4095, unique per site
#   HPWSN_DIRECTORY_REPLICATOR_PASSWORD (or _FILE)  the replicator account's password, the
#                             same at every sharing site; required when sharing (no default)
#   HPWSN_DIRECTORY_TLS_CERT / _KEY / _CA  PEM files: the local slapd's certificate and key
#                             and the CA of the peers' certificates; set, sharing goes over
#                             TLS only (StartTLS; docs/deployment.md)
#   HPWSN_DIRECTORY_LISTEN    the local slapd also listens on this address (e.g. 0.0.0.0) so
#                             that peer sites reach it; default: 127.0.0.1 only
#   HPWSN_DIRECTORY_LDAPS_PORT  the local slapd listens on ldaps:// at this port too (same
#                             addresses), for peers that name it by an ldaps:// URL; needs the
#                             HPWSN_DIRECTORY_TLS_* settings
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$HP_ROOT"

HTTP_HOST="${HPWSN_HTTP_HOST:-127.0.0.1}"
HTTP_PORT="${HPWSN_HTTP_PORT:-8000}"
WEB_WORKERS="${HPWSN_WEB_WORKERS:-1}"
WORKER_CONCURRENCY="${HPWSN_WORKER_CONCURRENCY:-2}"
REDIS_PORT="${HPWSN_REDIS_PORT:-6399}"
LDAP_PORT="${HPWSN_LDAP_PORT:-3899}"
NODE_NAME="${HPWSN_NODE_NAME:-$(hostname)}"
LOCAL_SERVICES="${HPWSN_LOCAL_SERVICES:-auto}"
HEALTH_TIMEOUT=60
case "$LOCAL_SERVICES" in
    auto) ;;
    none)
        [[ -n "${REDIS_URL:-}${REDIS_SENTINELS:-}" ]] ||
            hp_die "HPWSN_LOCAL_SERVICES=none: set REDIS_URL (or REDIS_SENTINELS) to the site's Redis"
        [[ -n "${DATABASE_URL:-}" ]] ||
            hp_die "HPWSN_LOCAL_SERVICES=none: set DATABASE_URL to the site's PostgreSQL"
        ;;
    *) hp_die "HPWSN_LOCAL_SERVICES must be auto or none, not '$LOCAL_SERVICES'" ;;
esac
# Start a Redis / slapd of our own only when the site's are not named.
START_REDIS=0
START_SLAPD=0
if [[ "$LOCAL_SERVICES" == auto ]]; then
    [[ -n "${REDIS_URL:-}${REDIS_SENTINELS:-}" ]] || START_REDIS=1
    [[ -n "${LDAP_URL:-}" ]] || START_SLAPD=1
fi
# A stop takes at most ~9 s: SIGTERM, APP_STOP_S for the web, workers, beat and the directory
# sync to finish (a push in flight is not waited for: its batch stays queued and is pushed again
# after the restart), SIGKILL; then the same for Redis and slapd with INFRA_STOP_S. Whoever
# stops us (a service manager, a test) gives up after 10 s and kills this script, which would
# leave its children running: each child also gets SIGTERM if this script dies (setpriv
# --pdeathsig below).
APP_STOP_S=5
INFRA_STOP_S=2

# Host to probe / to show in URLs (a wildcard bind address is reached via loopback).
case "$HTTP_HOST" in
    0.0.0.0 | '') PROBE_HOST=127.0.0.1 ;;
    :: | '[::]') PROBE_HOST=::1 ;;
    *)
        PROBE_HOST="${HTTP_HOST#\[}"
        PROBE_HOST="${PROBE_HOST%\]}"
        ;;
esac
if [[ "$PROBE_HOST" == *:* ]]; then URL_HOST="[$PROBE_HOST]"; else URL_HOST="$PROBE_HOST"; fi
BASE_URL="http://$URL_HOST:$HTTP_PORT"
# The broker never pushes to its own listening address (subscriptions/services.py).
export HPWSN_HTTP_HOST="$HTTP_HOST" HPWSN_HTTP_PORT="$HTTP_PORT"

# ---------------------------------------------------------------- 1. system packages
deps=(curl:curl setpriv:util-linux)
if ((START_REDIS)); then
    deps+=(redis-server:redis-server redis-cli:redis-tools)
fi
hp_ensure_cmds "${deps[@]}"
if ((START_SLAPD)); then
    hp_ensure_slapd
fi
hp_ensure_java  # the analytics jobs (Spark) run on the worker

# ---------------------------------------------------------------- 2. virtualenv
hp_ensure_venv

# ---------------------------------------------------------------- 3. data dir, roles
# Everything from here on (the database, Redis's append-only file, slapd's files, the event log,
# the local secrets) is its owner's only, in a data dir only its owner enters.
umask 077
DATA_DIR="$(hp_data_dir)"
chmod 700 "$DATA_DIR"
export HPWSN_DATA_DIR="$DATA_DIR"
export PYTHONUNBUFFERED=1
export HPWSN_NODE_NAME="$NODE_NAME"

roles_lines="$(.venv/bin/python -m hpwsn_site.processes roles "${HPWSN_ROLES:-all}")" || exit 2
mapfile -t ROLES <<<"$roles_lines"
if [[ -z "${LDAP_URL:-}" && "$LOCAL_SERVICES" == none ]]; then
    hp_log "no LDAP_URL: this node runs without a directory (no directory sync)"
    for i in "${!ROLES[@]}"; do [[ "${ROLES[$i]}" != directory ]] || unset 'ROLES[i]'; done
    ROLES=("${ROLES[@]}")
fi
has_role() { [[ " ${ROLES[*]} " == *" $1 "* ]]; }
# node_cmd ROLE: that role's command line (hpwsn_site/processes.py), into the array NODE_CMD.
node_cmd() {
    local lines
    lines="$(.venv/bin/python -m hpwsn_site.processes "$1" --host "$HTTP_HOST" --port "$HTTP_PORT" \
        --web-workers "$WEB_WORKERS" --concurrency "$WORKER_CONCURRENCY" --node-name "$NODE_NAME" \
        --data-dir "$DATA_DIR" --bin-dir "$HP_ROOT/.venv/bin")"
    mapfile -t NODE_CMD <<<"$lines"
}

# Fail early and clearly instead of half-starting next to another instance.
if has_role web && hp_port_open "$PROBE_HOST" "$HTTP_PORT"; then
    hp_die "port $HTTP_PORT is already in use on $PROBE_HOST (another 'make run'?); set HPWSN_HTTP_PORT"
fi
if ((START_REDIS)) && hp_port_open 127.0.0.1 "$REDIS_PORT"; then
    hp_die "port $REDIS_PORT is already in use (another 'make run'?); set HPWSN_REDIS_PORT or REDIS_URL"
fi
if ((START_SLAPD)) && hp_port_open 127.0.0.1 "$LDAP_PORT"; then
    hp_die "port $LDAP_PORT is already in use (another 'make run'?); set HPWSN_LDAP_PORT or LDAP_URL"
fi

# ---------------------------------------------------------------- process supervision
# Each child runs in its own session / process group (setsid does not fork here:
# a background job is never a group leader), so $! is both its pid and its
# process group id. Its output goes through a `sed` that prefixes the name and
# ignores INT/TERM so that shutdown messages still get printed.
CHILD_PIDS=()
CHILD_NAMES=()
STOPPING=0

start_child() {
    local name="$1"
    shift
    # shellcheck disable=SC2016 # expanded by the inner bash
    HP_PREFIX="$(printf '%-6s | ' "$name")" setsid setpriv --pdeathsig TERM bash -c '
        exec > >(trap "" INT TERM HUP; exec sed -u "s/^/$HP_PREFIX/") 2>&1
        exec "$@"' "$name" "$@" </dev/null &
    CHILD_PIDS+=("$!")
    CHILD_NAMES+=("$name")
}

# name of the first child that is no longer running (empty if all run)
dead_child() {
    local i
    for i in "${!CHILD_PIDS[@]}"; do
        if ! kill -0 "${CHILD_PIDS[$i]}" 2>/dev/null; then
            printf '%s\n' "${CHILD_NAMES[$i]}"
            return 0
        fi
    done
}

# true while any process of the group is left
group_alive() { kill -0 -- "-$1" 2>/dev/null; }

# wait_groups SECONDS PID... : wait until all those process groups are gone.
wait_groups() {
    local limit=$(($1 * 5)) pid i alive
    shift
    for ((i = 0; i < limit; i++)); do
        alive=0
        for pid in "$@"; do group_alive "$pid" && alive=1; done
        ((alive)) || return 0
        sleep 0.2
    done
    return 1
}

# stop_groups SECONDS PID... : SIGTERM each child (the group leader, so that e.g. the celery
# worker does its own warm shutdown of its pool), wait up to SECONDS; then SIGKILL whatever is
# left in the groups.
stop_groups() {
    local pid limit="$1"
    shift
    for pid in "$@"; do
        kill -TERM "$pid" 2>/dev/null || kill -TERM -- "-$pid" 2>/dev/null || true
    done
    wait_groups "$limit" "$@" && return 0
    for pid in "$@"; do
        if group_alive "$pid"; then
            hp_warn "process group $pid did not stop within ${limit}s; killing it"
            kill -KILL -- "-$pid" 2>/dev/null || true
        fi
    done
    wait_groups 1 "$@" || true
}

stop_all() {
    ((STOPPING)) && return 0
    STOPPING=1
    # If our output was a pipe (`make run | tee`), Ctrl-C may have closed it:
    # a write must not kill us (SIGPIPE) before the children are stopped.
    trap '' PIPE
    ((${#CHILD_PIDS[@]} > 0)) || return 0
    hp_log "stopping HPwsn"
    # Application processes first (the worker may still talk to Redis while it
    # shuts down), Redis last.
    local i
    local -a apps=() infra=()
    for i in "${!CHILD_PIDS[@]}"; do
        if [[ "${CHILD_NAMES[$i]}" == redis || "${CHILD_NAMES[$i]}" == slapd ]]; then
            infra+=("${CHILD_PIDS[$i]}")
        else
            apps+=("${CHILD_PIDS[$i]}")
        fi
    done
    ((${#apps[@]} == 0)) || stop_groups "$APP_STOP_S" "${apps[@]}"
    ((${#infra[@]} == 0)) || stop_groups "$INFRA_STOP_S" "${infra[@]}"
    for i in "${CHILD_PIDS[@]}"; do wait "$i" 2>/dev/null || true; done
    hp_log "all HPwsn processes stopped"
}

on_signal() {
    local sig="$1"
    trap '' INT TERM HUP # no second interruption of the shutdown
    stop_all
    # Die from the same signal so that the caller (make, a shell) sees it.
    trap - "$sig" EXIT
    kill "-$sig" "$$"
    exit 1 # not reached
}
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
trap 'on_signal HUP' HUP
trap stop_all EXIT

# fail_child NAME [STATUS]: a child died -> stop the rest and exit non-zero.
fail_child() {
    local how="exited unexpectedly"
    if [[ -n "${2:-}" ]]; then
        if (($2 > 128)); then how="was killed by signal $(($2 - 128))"; else how="exited with status $2"; fi
    fi
    hp_warn "'$1' $how; stopping everything"
    stop_all
    exit 1
}

# ---------------------------------------------------------------- 3b. Redis
if ((START_REDIS)); then
    mkdir -p "$DATA_DIR/redis"
    # Every local user can reach 127.0.0.1: Redis asks for a password, made at the first start and
    # kept in the data dir (0600, umask above), given to redis-server in a config file rather than
    # on its command line (which every local user can read).
    redis_password_file="$DATA_DIR/redis.password"
    [[ -s "$redis_password_file" ]] ||
        head -c 24 /dev/urandom | base64 | tr -d '/+=\n' >"$redis_password_file"
    redis_password="$(<"$redis_password_file")"
    printf 'requirepass %s\n' "$redis_password" >"$DATA_DIR/redis/redis.conf"
    hp_log "starting redis-server on 127.0.0.1:$REDIS_PORT (data in $DATA_DIR/redis)"
    mapfile -t redis_cmd < <(.venv/bin/python -m hpwsn_site.processes redis-server)
    start_child redis "${redis_cmd[@]}" "$DATA_DIR/redis/redis.conf" --port "$REDIS_PORT" \
        --bind 127.0.0.1 --dir "$DATA_DIR/redis" --save "" --appendonly yes --daemonize no \
        --logfile ""
    for ((i = 0; ; i++)); do
        pong="$(REDISCLI_AUTH="$redis_password" redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping \
            2>/dev/null || true)"
        [[ "$pong" == PONG ]] && break
        dead="$(dead_child)"
        [[ -z "$dead" ]] || fail_child "$dead"
        ((i < 150)) || hp_die "redis-server did not answer on port $REDIS_PORT within 30s"
        sleep 0.2
    done
    export REDIS_URL="redis://:$redis_password@127.0.0.1:$REDIS_PORT/0"
fi

# ---------------------------------------------------------------- 3c. LDAP directory
if ((START_SLAPD)); then
    hp_log "starting slapd on 127.0.0.1:$LDAP_PORT (data in $DATA_DIR/slapd)"
    # prepare renders slapd.conf (and seeds an empty database), then prints the slapd command
    # line, one argument per line. Without HPWSN_LDAP_BIND_PASSWORD it makes the broker's
    # password at the first start and keeps it in the data dir, where the broker reads it.
    slapd_lines="$(.venv/bin/python -m directory.slapdctl prepare \
        --data-dir "$DATA_DIR/slapd" --port "$LDAP_PORT" --loglevel "${HPWSN_LDAP_LOGLEVEL:-none}")"
    if [[ -z "${HPWSN_LDAP_BIND_PASSWORD:-}${HPWSN_LDAP_BIND_PASSWORD_FILE:-}" ]]; then
        export HPWSN_LDAP_BIND_PASSWORD_FILE="$DATA_DIR/slapd/broker.password"
    fi
    mapfile -t slapd_cmd <<<"$slapd_lines"
    start_child slapd "${slapd_cmd[@]}"
    for ((i = 0; ; i++)); do
        hp_port_open 127.0.0.1 "$LDAP_PORT" && break
        dead="$(dead_child)"
        [[ -z "$dead" ]] || fail_child "$dead"
        ((i < 150)) || hp_die "slapd did not listen on port $LDAP_PORT within 30s"
        sleep 0.2
    done
    export LDAP_URL="ldap://127.0.0.1:$LDAP_PORT/"
fi
hp_log "LDAP directory: ${LDAP_URL:-none}"

# ---------------------------------------------------------------- 4. database
if [[ "${HPWSN_MIGRATE:-1}" != 0 ]]; then
    hp_log "migrating the database"
    .venv/bin/python manage.py migrate --noinput
fi
# The directory is the record of the topic tree (its demo tree comes from the seed LDIF): load
# it before the web starts; if it cannot be reached, serve from the database meanwhile.
if [[ -n "${LDAP_URL:-}" ]]; then
    hp_log "loading the topic tree from the directory"
    .venv/bin/python manage.py directory_load ||
        hp_warn "the directory could not be read; serving the topic tree from the database until it is back"
fi

# ---------------------------------------------------------------- 5. web, worker, beat
hp_log "starting node $NODE_NAME: ${ROLES[*]}"
# uvicorn with read deadlines on request headers and bodies (hpwsn_site/serve.py); the directory
# sync loads the directory's topic tree at start-up and follows its changes (docs/directory.md).
for role in "${ROLES[@]}"; do
    node_cmd "$role"
    name="$role"
    [[ "$role" != directory ]] || name=ldsync
    start_child "$name" "${NODE_CMD[@]}"
done

# ---------------------------------------------------------------- 6. health check
deadline=$((SECONDS + HEALTH_TIMEOUT))
# A node without the web role has nothing to probe: it is up once its processes have not died
# in their first seconds.
has_role web || sleep 3
until ! has_role web || curl -fsS -o /dev/null --max-time 2 "$BASE_URL/healthz" 2>/dev/null; do
    dead="$(dead_child)"
    [[ -z "$dead" ]] || fail_child "$dead"
    if ((SECONDS >= deadline)); then
        hp_warn "$BASE_URL/healthz did not answer 200 within ${HEALTH_TIMEOUT}s"
        stop_all
        exit 1
    fi
    sleep 0.5
done

if [[ -n "${DATABASE_URL:-}" ]]; then
    db_desc="$(hp_mask_url "$DATABASE_URL")"
else
    db_desc="SQLite $DATA_DIR/hpwsn.sqlite3"
fi
cat <<EOF

================================================================
 HPwsn is running
   SOAP endpoint (WS-N):  $BASE_URL/wsn/
   WSDL:                  $BASE_URL/wsn/?wsdl
   legacy (Spyne) WSDL:   $BASE_URL/wsn/legacy/?wsdl
   operators' console:    $BASE_URL/console/   (LDAP login, e.g. operator1; see README)
   admin:                 $BASE_URL/admin/   (make superuser for a login)
   live dashboard:        $BASE_URL/monitoring/   (staff login)
   Prometheus metrics:    $BASE_URL/metrics
   health:                $BASE_URL/healthz
   node:                  $NODE_NAME (${ROLES[*]})
   Redis:                 $(hp_mask_url "${REDIS_URL:-sentinels ${REDIS_SENTINELS:-} (${REDIS_SENTINEL_MASTER:-mymaster})}")
   database:              $db_desc
   LDAP directory:        ${LDAP_URL:-none}   (base ${HPWSN_LDAP_BASE_DN:-dc=hpwsn,dc=local}; demo logins in README)
 Ctrl-C to stop
================================================================

EOF

# ---------------------------------------------------------------- 7. supervise
# wait -n returns when any child exits (or a trapped signal arrives; the trap
# then stops everything and exits). 2>/dev/null: no "Killed ..." job notice.
while :; do
    done_pid=""
    rc=0
    wait -n -p done_pid 2>/dev/null || rc=$?
    for i in "${!CHILD_PIDS[@]}"; do
        [[ "${CHILD_PIDS[$i]}" == "$done_pid" ]] && fail_child "${CHILD_NAMES[$i]}" "$rc"
    done
    dead="$(dead_child)"
    [[ -z "$dead" ]] || fail_child "$dead"
done
