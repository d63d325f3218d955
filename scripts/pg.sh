# shellcheck shell=bash
# Throwaway PostgreSQL for scripts/test and scripts/bench (sourced, not run).
#
# The caller defines say() and die(), and may set VPY (a python for free_port).
# start_postgres: initdb into a temporary directory (as the `postgres` OS user when
# run as root: initdb refuses root), start the server on a free loopback port and
# export LANGGRAPH_CANCEL_TEST_PG_DSN, PG_CTL_DATADIR, PG_BIN_DIR and PG_CTL_USER.
# stop_postgres: stop it by its pid. The caller removes "$PG_TMP" in its own
# EXIT trap (after stop_postgres).
#
# PG_EXTRA_CONF (optional): more postgresql.conf lines, appended after ours.
PG_TMP=""
PG_DATA=""
PG_PID=""
PG_USER=""

stop_postgres() {
    [ -n "$PG_DATA" ] || return 0
    local pid=""
    # A test may have restarted the server (pg_ctl restart): the live pid is in postmaster.pid.
    if [ -f "$PG_DATA/postmaster.pid" ]; then
        pid="$(head -n 1 "$PG_DATA/postmaster.pid" 2>/dev/null || true)"
    fi
    [ -n "$pid" ] || pid="$PG_PID"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        say "stopping PostgreSQL (pid $pid)"
        kill -INT "$pid" 2>/dev/null || true          # fast shutdown
        local i
        for i in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "PostgreSQL (pid $pid) did not stop in 10s, sending SIGQUIT"
            kill -QUIT "$pid" 2>/dev/null || true
            sleep 2
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    PG_DATA=""
}

find_pg_bin() {
    if [ -n "${PG_BIN_DIR:-}" ] && [ -x "$PG_BIN_DIR/initdb" ]; then
        printf '%s\n' "$PG_BIN_DIR"; return 0
    fi
    local p
    if p="$(command -v initdb 2>/dev/null)"; then
        dirname "$(readlink -f "$p")"; return 0
    fi
    for p in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$p/initdb" ]; then printf '%s\n' "$p"; return 0; fi
    done
    return 1
}

# Run a command as the PostgreSQL OS user (root is refused by initdb/postgres).
as_pg() {
    if [ -n "$PG_USER" ]; then
        if command -v runuser >/dev/null 2>&1; then
            (cd "$PG_TMP" && runuser -u "$PG_USER" -- "$@")
        else
            local q; q="$(printf '%q ' "$@")"
            (cd "$PG_TMP" && su -s /bin/sh "$PG_USER" -c "$q")
        fi
    else
        "$@"
    fi
}

free_port() {
    "${VPY:-python3}" - <<'EOF'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
EOF
}

start_postgres() {
    local bin
    if ! bin="$(find_pg_bin)"; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            say "PostgreSQL server binaries not found; installing Debian's postgresql package"
            mkdir -p /etc/postgresql-common
            # Do not let the package create and start a cluster of its own.
            grep -qs '^create_main_cluster' /etc/postgresql-common/createcluster.conf \
                || echo 'create_main_cluster = false' >> /etc/postgresql-common/createcluster.conf
            DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
                && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                    postgresql >/dev/null \
                || die "apt-get install postgresql failed"
            bin="$(find_pg_bin)" || die "PostgreSQL installed but initdb still not found"
        else
            die "PostgreSQL server binaries (initdb, pg_ctl) not found; install PostgreSQL or set LANGGRAPH_CANCEL_TEST_PG_DSN"
        fi
    fi
    export PG_BIN_DIR="$bin"

    if [ "$(id -u)" = 0 ]; then
        PG_USER=postgres
        if ! id "$PG_USER" >/dev/null 2>&1; then
            say "creating OS user $PG_USER"
            useradd --system --user-group --no-create-home --shell /bin/sh "$PG_USER" \
                || die "useradd $PG_USER failed"
        fi
        # root's TMPDIR may be unreadable to postgres: use /tmp.
        PG_TMP="$(mktemp -d /tmp/lgc-pg.XXXXXX)"
        chown "$PG_USER": "$PG_TMP"
    else
        PG_TMP="$(mktemp -d "${TMPDIR:-/tmp}/lgc-pg.XXXXXX")"
    fi
    chmod 700 "$PG_TMP"
    local data="$PG_TMP/data" log="$PG_TMP/postgres.log"

    say "initdb into $data (PostgreSQL binaries in $bin${PG_USER:+, as OS user $PG_USER})"
    if ! as_pg "$bin/initdb" -D "$data" -U postgres -A trust -E UTF8 --locale=C --no-sync \
            >"$PG_TMP/initdb.log" 2>&1; then
        cat "$PG_TMP/initdb.log" >&2 || true
        die "initdb failed (output above); set LANGGRAPH_CANCEL_TEST_PG_DSN to use an existing server"
    fi
    PG_DATA="$data"

    local attempt port SETSID=""
    command -v setsid >/dev/null 2>&1 && SETSID="setsid"
    for attempt in 1 2 3; do
        port="$(free_port)"
        # Settings go into postgresql.conf so `pg_ctl restart` from tests keeps them.
        as_pg sh -c "cat >> '$data/postgresql.conf'" <<EOF

# --- scripts/test (throwaway test server) ---
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$PG_TMP'
max_connections = 200
fsync = off
full_page_writes = off
synchronous_commit = off
EOF
        if [ -n "${PG_EXTRA_CONF:-}" ]; then
            printf '%s\n' "$PG_EXTRA_CONF" | as_pg sh -c "cat >> '$data/postgresql.conf'"
        fi
        # setsid: a Ctrl-C on the terminal must not reach the server before the tests'
        # teardown (dropping their databases) is done; we stop it ourselves at exit.
        if as_pg $SETSID "$bin/pg_ctl" -D "$data" -l "$log" -w -t 60 start >/dev/null 2>&1; then
            PG_PID="$(head -n 1 "$data/postmaster.pid")"
            export LANGGRAPH_CANCEL_TEST_PG_DSN="postgresql://postgres@127.0.0.1:$port/postgres"
            export PG_CTL_DATADIR="$data"
            export PG_CTL_USER="$PG_USER"
            say "PostgreSQL $("$bin/postgres" -V | awk '{print $3}') up on 127.0.0.1:$port (pid $PG_PID)"
            return 0
        fi
        say "PostgreSQL did not start on port $port (attempt $attempt)"
        tail -n 20 "$log" >&2 2>/dev/null || true
    done
    die "could not start PostgreSQL (log: $log)"
}
