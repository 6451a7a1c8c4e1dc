#!/usr/bin/env bash
# sbench test Postgres: a REAL Postgres server (Debian's package) that holds a DuckLake catalog, for the
# shared results store's tests, benches and CI. It runs as the postgres user on a port and socket directory
# of its own, so that it never meets a Postgres the machine already runs.
#
#   pg.sh start      install what is missing, initdb (once), start, create the roles and the database
#   pg.sh stop       stop the server (its data directory stays for the next start)
#   pg.sh status     exit 0 when the server answers
#   pg.sh env        print the shell lines a test sources: SBENCH_PG_* and where the libpq files are
#   pg.sh reset      drop and create the test database again (an empty catalog)
#
# Roles (each with a password, read by libpq from the passfile this script writes, never from sbench):
#   bench        owns the database lake: the writer a team's collects use
#   bench_reader may connect and read, not write: the role a dashboard or a reviewer uses
#
# Environment:
#   SBENCH_PG_DIR    state root (default /var/lib/sbench-pg): data/, run/ (the socket), pgpass, pg_service.conf
#   SBENCH_PG_PORT   TCP port on 127.0.0.1 (default 55432)
set -euo pipefail
export PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin:$PATH

ROOT=${SBENCH_PG_DIR:-/var/lib/sbench-pg}
PORT=${SBENCH_PG_PORT:-55432}
DATA=$ROOT/data
RUN=$ROOT/run
LOG=$ROOT/postgres.log
PASSFILE=$ROOT/pgpass
SERVICEFILE=$ROOT/pg_service.conf
DB=lake
WRITER=bench
READER=bench_reader
# Test passwords: this server listens on 127.0.0.1 only and lives for a test run.
WRITER_PW=bench-writer-pw
READER_PW=bench-reader-pw

say() { echo "[pg] $*" >&2; }

pgbin() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [[ -x $d/pg_ctl ]] && { echo "$d"; return 0; }
  done
  return 1
}

as_pg() {  # run a command as the postgres user (initdb and the server refuse root)
  if [[ $(id -u) == 0 ]]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

install() {
  if ! pgbin >/dev/null; then
    say "installing postgresql (Debian's package)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq postgresql >/dev/null
  fi
  # Debian's package starts its own cluster on 5432; ours is separate and the package's is left as it is.
}

psql_admin() {
  as_pg "$(pgbin)/psql" -X -q -v ON_ERROR_STOP=1 -h "$RUN" -p "$PORT" -U postgres "$@"
}

write_client_files() {
  umask 077
  printf '127.0.0.1:%s:*:%s:%s\n127.0.0.1:%s:*:%s:%s\n' "$PORT" "$WRITER" "$WRITER_PW" "$PORT" "$READER" "$READER_PW" \
    > "$PASSFILE"
  cat > "$SERVICEFILE" <<EOF
[sbench]
host=127.0.0.1
port=$PORT
dbname=$DB
user=$WRITER

[sbench_reader]
host=127.0.0.1
port=$PORT
dbname=$DB
user=$READER
EOF
  chmod 600 "$PASSFILE" "$SERVICEFILE"
  umask 022
}

create_db() {
  psql_admin -d postgres <<EOF
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$WRITER') THEN CREATE ROLE $WRITER LOGIN; END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$READER') THEN CREATE ROLE $READER LOGIN; END IF;
END \$\$;
ALTER ROLE $WRITER PASSWORD '$WRITER_PW';
ALTER ROLE $READER PASSWORD '$READER_PW';
EOF
  if ! psql_admin -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1; then
    psql_admin -d postgres -c "CREATE DATABASE $DB OWNER $WRITER"
  fi
  # The reader may read every table the writer makes (DuckLake's catalog tables), now and later.
  psql_admin -d "$DB" <<EOF
GRANT CONNECT ON DATABASE $DB TO $READER;
GRANT USAGE ON SCHEMA public TO $READER;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO $READER;
ALTER DEFAULT PRIVILEGES FOR ROLE $WRITER IN SCHEMA public GRANT SELECT ON TABLES TO $READER;
EOF
}

running() {
  [[ -f $DATA/postmaster.pid ]] && as_pg "$(pgbin)/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

start() {
  install
  mkdir -p "$ROOT" "$RUN"
  chown postgres:postgres "$ROOT" "$RUN" 2>/dev/null || true
  chmod 755 "$ROOT"
  if [[ ! -f $DATA/PG_VERSION ]]; then
    say "initdb $DATA"
    mkdir -p "$DATA" && chown postgres:postgres "$DATA" 2>/dev/null || true
    as_pg "$(pgbin)/initdb" -D "$DATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 -E UTF8 \
      --locale=C.UTF-8 >/dev/null
    cat >> "$DATA/postgresql.conf" <<EOF
# sbench tests/pg/pg.sh
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$RUN'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
  fi
  if ! running; then
    touch "$LOG" && chown postgres:postgres "$LOG" 2>/dev/null || true
    as_pg "$(pgbin)/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null
  fi
  create_db
  write_client_files
  say "up on 127.0.0.1:$PORT (database $DB; roles $WRITER, $READER); source <(bash $0 env)"
}

stop() {
  if pgbin >/dev/null && [[ -f $DATA/PG_VERSION ]] && running; then
    as_pg "$(pgbin)/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null
    say "stopped"
  fi
}

reset() {
  running || { say "not running: bash $0 start"; exit 1; }
  psql_admin -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null
  create_db
}

env_lines() {
  cat <<EOF
export SBENCH_PG_HOST=127.0.0.1
export SBENCH_PG_PORT=$PORT
export SBENCH_PG_SOCKET=$RUN
export SBENCH_PG_DB=$DB
export SBENCH_PG_WRITER=$WRITER
export SBENCH_PG_READER=$READER
export PGPASSFILE=$PASSFILE
export PGSERVICEFILE=$SERVICEFILE
EOF
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  status) running && { say "running on 127.0.0.1:$PORT"; exit 0; } || { say "not running"; exit 1; } ;;
  env) env_lines ;;
  reset) reset ;;
  *) echo "usage: $0 start|stop|status|env|reset" >&2; exit 2 ;;
esac
