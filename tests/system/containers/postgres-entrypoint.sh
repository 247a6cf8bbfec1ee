#!/bin/sh
# The contract of the public postgres image that deploy/docker-compose.yml relies on, over
# Debian's PostgreSQL (no registry is reachable here): POSTGRES_PASSWORD for the superuser,
# /docker-entrypoint-initdb.d/*.sql run once on an empty data directory, then the server on
# every interface with password authentication; UTF8, as that image initialises.
set -eu
BIN=$(ls -d /usr/lib/postgresql/*/bin | tail -n 1)
PGDATA=/var/lib/postgresql/data
mkdir -p "$PGDATA" /run/postgresql
chown -R postgres:postgres "$PGDATA" /run/postgresql
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    echo "$POSTGRES_PASSWORD" > /tmp/pwfile
    chown postgres /tmp/pwfile
    su postgres -c "$BIN/initdb -D $PGDATA -U postgres --pwfile=/tmp/pwfile --encoding=UTF8 --locale=C.UTF-8 --auth-local=trust --auth-host=scram-sha-256"
    rm /tmp/pwfile
    echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
    su postgres -c "$BIN/pg_ctl -D $PGDATA -o \"-c listen_addresses=''\" -w start"
    for script in /docker-entrypoint-initdb.d/*.sql; do
        [ -e "$script" ] && su postgres -c "psql -v ON_ERROR_STOP=1 -U postgres -f $script"
    done
    su postgres -c "$BIN/pg_ctl -D $PGDATA -m fast -w stop"
fi
exec su postgres -c "exec $BIN/postgres -D $PGDATA -c listen_addresses='*'"
