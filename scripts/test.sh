#!/usr/bin/env bash
# `make test`: install what the tests need, start PostgreSQL and Redis if they
# are not running, then run ruff and pytest. Extra arguments go to pytest.
#
#   DATABASE_URL  use this database instead of the local PostgreSQL
#                 (default postgres://hpwsn:hpwsn@127.0.0.1:5432/hpwsn)
#   REDIS_URL     use this Redis instead of 127.0.0.1:6379 db 15
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$HP_ROOT"

PG_HOST=127.0.0.1
PG_PORT=5432
PG_ROLE=hpwsn
PG_PASSWORD=hpwsn
PG_DB=hpwsn
REDIS_TEST_PORT=6379
REDIS_TEST_URL="redis://127.0.0.1:$REDIS_TEST_PORT/15"

# ---------------------------------------------------------------- 1. system packages
# Debian's Chromium and its driver for the dashboard's browser test (Selenium drives them;
# nothing is downloaded at run time).
deps=(curl:curl chromium:chromium chromedriver:chromium-driver)
# Redis Sentinel for the failover test (tests/integration/test_sentinel.py): Debian's package; its
# own service is not used, the test starts three sentinels of its own on free ports.
deps+=(redis-sentinel:redis-sentinel redis-server:redis-server)
if [[ -z "${DATABASE_URL:-}" ]]; then
    deps+=(pg_ctlcluster:postgresql pg_createcluster:postgresql psql:postgresql-client pg_isready:postgresql-client)
fi
if [[ -z "${REDIS_URL:-}" ]]; then
    deps+=(redis-server:redis-server redis-cli:redis-tools)
fi
hp_ensure_cmds "${deps[@]}"
# OpenLDAP: tests/conftest.py starts its own slapd per test session on a free port, seeded with
# the demo directory (fixture ldap_directory); LDAP_URL is not used by the tests.
hp_ensure_slapd
hp_ensure_java  # the Spark tests (tests/spark/)

# ---------------------------------------------------------------- 2. virtualenv
hp_ensure_venv

# ---------------------------------------------------------------- 3. PostgreSQL
# First entry (version-sorted) of a directory, e.g. the oldest cluster version.
first_entry() {
    local -a e=()
    [[ -d "$1" ]] && mapfile -t e < <(find "$1" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort -V)
    if ((${#e[@]} > 0)); then
        if [[ "${2:-}" == last ]]; then printf '%s\n' "${e[-1]}"; else printf '%s\n' "${e[0]}"; fi
    fi
}

pg_start_local() {
    local version
    version="$(first_entry /etc/postgresql)"
    if [[ -z "$version" || ! -d "/etc/postgresql/$version/main" ]]; then
        # No cluster yet (e.g. the package was installed with create_main_cluster=false).
        [[ -n "$version" ]] || version="$(first_entry /usr/lib/postgresql last)"
        [[ -n "$version" ]] || hp_die "PostgreSQL server binaries not found under /usr/lib/postgresql"
        hp_log "creating PostgreSQL cluster $version/main"
        hp_as_root pg_createcluster "$version" main --port "$PG_PORT"
    fi
    hp_log "starting PostgreSQL cluster $version/main"
    # It may already be starting up (pg_isready said "rejecting"); the wait below covers that.
    hp_as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start ||
        hp_warn "pg_ctlcluster start failed; waiting for the server anyway"
}

pg_wait_ready() {
    local i
    for ((i = 0; i < 60; i++)); do
        pg_isready -q -h "$PG_HOST" -p "$PG_PORT" && return 0
        sleep 0.5
    done
    hp_die "PostgreSQL does not answer on $PG_HOST:$PG_PORT (see /var/log/postgresql/)"
}

pg_psql() {
    # Run as the postgres OS user over the local socket; cd / so psql can
    # read its cwd whatever the repo's permissions are.
    (cd / && hp_as_postgres psql -X -q -v ON_ERROR_STOP=1 -p "$PG_PORT" -d postgres "$@")
}

pg_setup_role_and_db() {
    pg_psql <<SQL
DO \$\$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_ROLE') THEN
        CREATE ROLE $PG_ROLE LOGIN CREATEDB PASSWORD '$PG_PASSWORD';
    ELSE
        ALTER ROLE $PG_ROLE LOGIN CREATEDB PASSWORD '$PG_PASSWORD';
    END IF;
END
\$\$;
SQL
    if [[ "$(pg_psql -tAc "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" != 1 ]]; then
        hp_log "creating database $PG_DB"
        pg_psql -c "CREATE DATABASE $PG_DB OWNER $PG_ROLE"
    fi
    # Check the way the tests will connect: TCP with the password.
    PGPASSWORD="$PG_PASSWORD" PGCONNECT_TIMEOUT=5 psql -X -q -h "$PG_HOST" -p "$PG_PORT" \
        -U "$PG_ROLE" -d "$PG_DB" -tAc 'SELECT 1' >/dev/null ||
        hp_die "cannot connect as $PG_ROLE to $PG_HOST:$PG_PORT/$PG_DB (check pg_hba.conf)"
}

if [[ -z "${DATABASE_URL:-}" ]]; then
    rc=0
    pg_isready -q -h "$PG_HOST" -p "$PG_PORT" || rc=$?
    case $rc in
        0) ;;                # accepting connections
        1) pg_wait_ready ;;  # starting up
        *)
            pg_start_local
            pg_wait_ready
            ;;
    esac
    pg_setup_role_and_db
    export DATABASE_URL="postgres://$PG_ROLE:$PG_PASSWORD@$PG_HOST:$PG_PORT/$PG_DB"
fi

# ---------------------------------------------------------------- 4. Redis
if [[ -z "${REDIS_URL:-}" ]]; then
    if [[ "$(redis-cli -h 127.0.0.1 -p "$REDIS_TEST_PORT" ping 2>/dev/null || true)" != PONG ]]; then
        hp_log "starting redis-server on 127.0.0.1:$REDIS_TEST_PORT (daemonized; left running)"
        (cd / && redis-server --daemonize yes --port "$REDIS_TEST_PORT" --bind 127.0.0.1 \
            --save "" --appendonly no --logfile "" >/dev/null)
        for ((i = 0; i < 50; i++)); do
            [[ "$(redis-cli -h 127.0.0.1 -p "$REDIS_TEST_PORT" ping 2>/dev/null || true)" == PONG ]] && break
            sleep 0.2
        done
        [[ "$(redis-cli -h 127.0.0.1 -p "$REDIS_TEST_PORT" ping 2>/dev/null || true)" == PONG ]] ||
            hp_die "redis-server did not come up on 127.0.0.1:$REDIS_TEST_PORT"
    fi
    export REDIS_URL="$REDIS_TEST_URL"
fi

# ---------------------------------------------------------------- 5. lint + tests
hp_log "database: $(hp_mask_url "$DATABASE_URL")"
hp_log "redis:    $(hp_mask_url "$REDIS_URL")"
hp_log "slapd:    started by the test session on a free 127.0.0.1 port (tests/conftest.py)"

hp_log "ruff check ."
.venv/bin/ruff check .

hp_log "pytest${*:+ $*}"
rc=0
.venv/bin/python -m pytest "$@" || rc=$?
exit "$rc"
