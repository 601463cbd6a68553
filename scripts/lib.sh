#!/usr/bin/env bash
# Shared helpers for scripts/run.sh and scripts/test.sh (and the Makefile).
#
# Source it:   source scripts/lib.sh
# or call one helper directly:   bash scripts/lib.sh hp_ensure_venv
#
# Everything here is idempotent and cheap when nothing needs doing: apt-get
# runs only for missing commands (and `apt-get update` at most once per
# process), and pip runs only when the requirement files changed since the
# last successful install (stamp file in .venv/).

# Repository root (this file lives in <root>/scripts/).
HP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HP_VENV="$HP_ROOT/.venv"
HP_VENV_STAMP="$HP_VENV/.hpwsn-requirements.sha256"
HP_APT_UPDATED=0

# ---------------------------------------------------------------- messages

# Messages never fail the script (stderr may be a closed pipe during shutdown).
hp_log() { printf '==> %s\n' "$*" >&2 || true; }
hp_warn() { printf 'WARNING: %s\n' "$*" >&2 || true; }
hp_die() {
    printf 'ERROR: %s\n' "$*" >&2
    exit 1
}

# Print a URL with any password replaced by ****.
hp_mask_url() {
    # scheme://user:password@host -> scheme://user:****@host
    # scheme://:password@host     -> scheme://:****@host (redis style)
    printf '%s\n' "$1" | sed -E 's#^([A-Za-z][A-Za-z0-9+.-]*://[^:/@]*):[^@/]*@#\1:****@#'
}

# ---------------------------------------------------------------- privileges

# Run a command as root: directly when we are root, else through sudo.
hp_as_root() {
    if [[ $EUID -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        hp_die "need root to run: $* (run as root or install sudo)"
    fi
}

# Run a command as the postgres OS user.
hp_as_postgres() {
    if [[ $EUID -eq 0 ]]; then
        runuser -u postgres -- "$@"
    elif [[ "$(id -un)" == postgres ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -u postgres "$@"
    else
        hp_die "need root (or sudo) to run as the postgres user: $*"
    fi
}

# ---------------------------------------------------------------- apt

# hp_apt_install PKG... : apt-get install, with `apt-get update` once first.
hp_apt_install() {
    (($# > 0)) || return 0
    command -v apt-get >/dev/null 2>&1 ||
        hp_die "missing system packages ($*) and no apt-get here; install them by hand"
    local -a apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600)
    if [[ $HP_APT_UPDATED -eq 0 ]]; then
        hp_log "apt-get update"
        hp_as_root "${apt[@]}" update -qq
        HP_APT_UPDATED=1
    fi
    hp_log "apt-get install $*"
    hp_as_root "${apt[@]}" install -y -qq --no-install-recommends "$@"
}

# hp_ensure_cmds CMD:PKG ... : install PKG for each CMD not on PATH.
# Packages are collected first so that apt-get runs once.
hp_ensure_cmds() {
    local spec cmd pkg
    local -a missing=()
    for spec in "$@"; do
        cmd="${spec%%:*}"
        pkg="${spec#*:}"
        if ! command -v "$cmd" >/dev/null 2>&1; then
            [[ " ${missing[*]-} " == *" $pkg "* ]] || missing+=("$pkg")
        fi
    done
    if ((${#missing[@]} > 0)); then
        hp_apt_install "${missing[@]}"
    fi
    for spec in "$@"; do
        cmd="${spec%%:*}"
        command -v "$cmd" >/dev/null 2>&1 ||
            hp_die "'$cmd' still missing after installing package '${spec#*:}'"
    done
}

# ---------------------------------------------------------------- python venv

# Hash of everything that decides the venv contents.
_hp_requirements_hash() {
    local f
    {
        "$HP_VENV/bin/python" -c 'import sys; print(sys.version)' 2>/dev/null || echo none
        for f in requirements.txt requirements-dev.txt constraints.txt; do
            if [[ -f "$HP_ROOT/$f" ]]; then
                echo "== $f"
                cat "$HP_ROOT/$f"
            fi
        done
    } | sha256sum | cut -d' ' -f1
}

_hp_venv_ok() {
    [[ -x "$HP_VENV/bin/python" && -x "$HP_VENV/bin/pip" ]] &&
        "$HP_VENV/bin/python" -c 'import sys' >/dev/null 2>&1
}

_hp_ensure_python() {
    command -v python3 >/dev/null 2>&1 || hp_apt_install python3
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        hp_die "python3 is $(python3 -V 2>&1); HPwsn needs Python >= 3.11"
    # Debian's python3 has no ensurepip (so no `python3 -m venv`) without python3-venv.
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || hp_apt_install python3-venv
}

_hp_sync_venv() {
    if ! _hp_venv_ok; then
        _hp_ensure_python
        hp_log "creating virtualenv .venv ($(python3 -V 2>&1))"
        rm -rf "$HP_VENV"
        if ! python3 -m venv "$HP_VENV"; then
            # e.g. an ensurepip stub without the wheels: install python3-venv and retry once.
            hp_apt_install python3-venv
            rm -rf "$HP_VENV"
            python3 -m venv "$HP_VENV"
        fi
    fi
    local want have=""
    want="$(_hp_requirements_hash)"
    [[ -f "$HP_VENV_STAMP" ]] && have="$(cat "$HP_VENV_STAMP")"
    if [[ "$want" != "$have" ]]; then
        local -a cmd=("$HP_VENV/bin/pip" install --disable-pip-version-check -q -r "$HP_ROOT/requirements-dev.txt")
        [[ -f "$HP_ROOT/constraints.txt" ]] && cmd+=(-c "$HP_ROOT/constraints.txt")
        hp_log "installing Python dependencies (requirements-dev.txt changed or first run)"
        rm -f "$HP_VENV_STAMP"
        "${cmd[@]}"
        printf '%s\n' "$want" >"$HP_VENV_STAMP"
    fi
}

# python-ldap has no binary wheel for Linux: pip builds it against the OpenLDAP
# and SASL headers with a C compiler and the Python headers. Install what is
# missing (only when the venv lacks a working python-ldap).
hp_ensure_ldap_build_deps() {
    if _hp_venv_ok && "$HP_VENV/bin/python" -c 'import ldap' >/dev/null 2>&1; then
        return 0
    fi
    local -a missing=()
    [[ -f /usr/include/ldap.h ]] || missing+=(libldap2-dev)
    [[ -f /usr/include/sasl/sasl.h ]] || missing+=(libsasl2-dev)
    command -v gcc >/dev/null 2>&1 || missing+=(gcc)
    local include
    include="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null || true)"
    [[ -n "$include" && -f "$include/Python.h" ]] || missing+=(python3-dev)
    if ((${#missing[@]} > 0)); then
        hp_apt_install "${missing[@]}"
    fi
}

# OpenLDAP's slapd and client tools. The Debian package is told not to create
# its own directory (slapd/no_configuration), so no system slapd starts: HPwsn
# runs its own instance from directory/slapd/ (directory/slapdctl.py).
hp_ensure_slapd() {
    export PATH="$PATH:/usr/sbin"
    if ! command -v slapd >/dev/null 2>&1; then
        if command -v debconf-set-selections >/dev/null 2>&1; then
            echo "slapd slapd/no_configuration boolean true" | hp_as_root debconf-set-selections
        fi
    fi
    hp_ensure_cmds slapd:slapd slapadd:slapd ldapmodify:ldap-utils ldapsearch:ldap-utils
}

# A Java runtime for Spark (pyspark 4 needs Java 17 or newer): Debian's default JRE, headless.
hp_ensure_java() {
    local version=""
    if command -v java >/dev/null 2>&1; then
        version="$(java -version 2>&1 | sed -nE 's/.*version "([0-9]+).*/\1/p' | head -n1)"
    fi
    if [[ -z "$version" || "$version" -lt 17 ]]; then
        hp_apt_install default-jre-headless
    fi
}

# Create .venv if needed and (re)install requirements-dev.txt when the
# requirement files changed. Serialised with flock so that `make run` and
# `make test` started together don't install into the same venv at once.
hp_ensure_venv() {
    [[ -f "$HP_ROOT/requirements-dev.txt" ]] || hp_die "requirements-dev.txt not found in $HP_ROOT"
    # apt work (if any) happens out here so HP_APT_UPDATED is kept for the caller.
    _hp_venv_ok || _hp_ensure_python
    hp_ensure_ldap_build_deps
    if command -v flock >/dev/null 2>&1; then
        (
            flock -w 1200 9 || hp_warn "could not lock $HP_ROOT; going on without the lock"
            _hp_sync_venv
        ) 9<"$HP_ROOT"
    else
        _hp_sync_venv
    fi
}

# ---------------------------------------------------------------- misc

# hp_port_open HOST PORT : true when something accepts TCP connections there.
hp_port_open() {
    (exec 3<>"/dev/tcp/$1/$2") >/dev/null 2>&1
}

# Data directory (absolute), exported so that Django, celery and this script agree.
hp_data_dir() {
    local d="${HPWSN_DATA_DIR:-$HP_ROOT/var}"
    mkdir -p "$d"
    (cd "$d" && pwd)
}

# hp_manage ARGS... : manage.py in the venv, with the same data dir as `make run`.
hp_manage() {
    hp_ensure_venv
    HPWSN_DATA_DIR="$(hp_data_dir)"
    export HPWSN_DATA_DIR
    cd "$HP_ROOT"
    "$HP_VENV/bin/python" manage.py "$@"
}

# hp_wait_port HOST PORT SECONDS : wait until something accepts TCP connections there.
hp_wait_port() {
    local deadline=$((SECONDS + $3))
    until hp_port_open "$1" "$2"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.5
    done
}

# ---------------------------------------------------------------- benchmark peers

# RabbitMQ on 127.0.0.1:5672 (guest/guest, which RabbitMQ allows from localhost only) for
# `python -m bench.peers`: installed when absent, started when nothing listens there. Debian's
# rabbitmq-server wrapper switches to the rabbitmq user by itself.
hp_ensure_rabbitmq() {
    export PATH="$PATH:/usr/sbin"
    hp_port_open 127.0.0.1 5672 && return 0
    command -v rabbitmq-server >/dev/null 2>&1 || hp_apt_install rabbitmq-server
    # Where an init system runs, installing the package has started the service.
    hp_wait_port 127.0.0.1 5672 5 && return 0
    hp_log "starting rabbitmq-server"
    if [[ -x /etc/init.d/rabbitmq-server ]]; then
        hp_as_root /etc/init.d/rabbitmq-server start || true
    fi
    if ! hp_wait_port 127.0.0.1 5672 30; then
        hp_as_root rabbitmq-server -detached
    fi
    hp_wait_port 127.0.0.1 5672 120 || hp_die "RabbitMQ does not answer on 127.0.0.1:5672"
}

# Mosquitto on 127.0.0.1:1883 (anonymous, which Mosquitto 2 allows on its default local-only
# listener), the same way.
hp_ensure_mosquitto() {
    export PATH="$PATH:/usr/sbin"
    hp_port_open 127.0.0.1 1883 && return 0
    command -v mosquitto >/dev/null 2>&1 || hp_apt_install mosquitto
    hp_wait_port 127.0.0.1 1883 5 && return 0
    hp_log "starting mosquitto"
    if [[ -x /etc/init.d/mosquitto ]]; then
        hp_as_root /etc/init.d/mosquitto start || true
    fi
    if ! hp_wait_port 127.0.0.1 1883 10; then
        hp_as_root mosquitto -d -c /etc/mosquitto/mosquitto.conf
    fi
    hp_wait_port 127.0.0.1 1883 30 || hp_die "Mosquitto does not answer on 127.0.0.1:1883"
}

hp_ensure_peers() {
    hp_ensure_rabbitmq
    hp_ensure_mosquitto
}

# Allow `bash scripts/lib.sh FUNCTION [ARGS...]` (used by the Makefile).
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    set -euo pipefail
    (($# > 0)) || hp_die "usage: $0 FUNCTION [ARGS...]"
    [[ "$(type -t "$1")" == function ]] || hp_die "no such helper: $1"
    "$@"
fi
