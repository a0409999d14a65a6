#!/usr/bin/env bash
# Installs the real redis-server and nginx the replica tests and benchmark run (Debian
# packages); idempotent. Starts no system service: tests start their own redis-server on a
# free loopback port in a temporary directory, and nginx with a temporary prefix.
# Usage: scripts/setup_redis_nginx.sh
set -euo pipefail

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup_redis_nginx.sh: ${missing[*]} missing and not root: cannot install" >&2
    exit 1
  fi
  apt-get update -qq
  # policy-rc.d 101: the packages' postinst must not start the system services.
  policy=/usr/sbin/policy-rc.d
  created_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    created_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi
fi
redis-server --version
(command -v nginx >/dev/null && nginx -v) || /usr/sbin/nginx -v
