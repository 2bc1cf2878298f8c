#!/usr/bin/env bash
# Print the Debian packages the deployment tier and `make up-cluster` need on this machine: none when
# PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) already answer, else the server packages, from
# whose binaries the tests start throwaway instances of their own.
set -u
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
needed=()
if ! answers 5432 && ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  needed+=(postgresql)
fi
if ! answers 6379 && ! command -v redis-server >/dev/null 2>&1; then
  needed+=(redis-server)
fi
echo "${needed[@]}"
