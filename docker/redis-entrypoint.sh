#!/bin/sh
# Redis of the compose stack with its password from a secret file, never from a command line:
#   redis-entrypoint.sh [redis-server options...]
# reads the password from $REDIS_PASSWORD_FILE (default /run/secrets/redis_password), refuses to start
# when that file is missing, unreadable or blank, and hands `requirepass` to redis-server as its
# configuration on stdin (`redis-server [options] -`: "-" last, as the official image's entrypoint
# inserts "--protected-mode no" first and Redis reads stdin only for a first or last "-"), so the
# password is in no process's arguments (`ps`) and in no file. Other options pass through. $REDIS_SERVER is the command to run (default: the official
# image's docker-entrypoint.sh, which drops root, when present, else redis-server).
set -eu
secret="${REDIS_PASSWORD_FILE:-/run/secrets/redis_password}"
if [ ! -r "$secret" ]; then
  echo "redis-entrypoint: cannot read the Redis password file $secret (a compose secret)" >&2
  exit 2
fi
password="$(cat "$secret")"
case "$password" in
  *[![:space:]]*) ;;
  *) echo "redis-entrypoint: the Redis password file $secret is empty or blank" >&2; exit 2 ;;
esac
nl='
'
case "$password" in
  *"$nl"*) echo "redis-entrypoint: the Redis password in $secret spans several lines" >&2; exit 2 ;;
esac
# inside double quotes, Redis's config parser takes \" and \\ as escapes
escaped="$(printf '%s' "$password" | sed 's/[\\"]/\\&/g')"
if [ -z "${REDIS_SERVER:-}" ]; then
  if command -v docker-entrypoint.sh >/dev/null 2>&1; then
    REDIS_SERVER="docker-entrypoint.sh redis-server"
  else
    REDIS_SERVER="redis-server"
  fi
fi
unset password
# shellcheck disable=SC2086 # REDIS_SERVER is a command and its first arguments
exec $REDIS_SERVER "$@" - <<CONF
requirepass "$escaped"
CONF
