#!/bin/sh
# PostgreSQL from Debian's package with the official image's interface: POSTGRES_USER,
# POSTGRES_PASSWORD and POSTGRES_DB create the cluster and database on first start in PGDATA; the
# port comes from PGPORT; `postgres ARGS` passes ARGS to the server. UTF-8, as the official image
# (whose LANG is en_US.utf8): a minimal base has no locale, and initdb would pick SQL_ASCII.
set -eu
bin=/usr/lib/postgresql/15/bin
as_postgres="setpriv --reuid=postgres --regid=postgres --init-groups"
if [ "${1:-}" = postgres ]; then
    shift
fi
mkdir -p "${PGDATA}" /var/run/postgresql
chown postgres:postgres "${PGDATA}" /var/run/postgresql
chmod 700 "${PGDATA}"
if [ ! -s "${PGDATA}/PG_VERSION" ]; then
    password_file=$(mktemp)
    printf '%s\n' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is not set}" >"${password_file}"
    chown postgres "${password_file}"
    ${as_postgres} "${bin}/initdb" -D "${PGDATA}" --username="${POSTGRES_USER:-postgres}" \
        --pwfile="${password_file}" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8
    rm -f "${password_file}"
    if [ -n "${POSTGRES_DB:-}" ] && [ "${POSTGRES_DB}" != postgres ]; then
        echo "CREATE DATABASE \"${POSTGRES_DB}\";" | ${as_postgres} "${bin}/postgres" --single -D "${PGDATA}" postgres >/dev/null
    fi
fi
exec ${as_postgres} "${bin}/postgres" -D "${PGDATA}" "$@"
