#!/usr/bin/env bash
# Makes a real Docker engine answer here (root), with the local sandbox image the tool tests
# use; idempotent. No registry is reachable, so the image is built from the static busybox.
# Usage: scripts/setup_docker.sh   (THUNDER_MW_DOCKER_LOG: where dockerd logs; default /tmp)
set -euo pipefail
image=${THUNDER_MW_SANDBOX_IMAGE:-thunder-mw/sandbox:test}
log=${THUNDER_MW_DOCKER_LOG:-/tmp/thunder-mw-dockerd.log}

if ! command -v dockerd >/dev/null || ! [ -x /bin/busybox ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup_docker.sh: dockerd or busybox missing and not root: cannot install" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io busybox-static >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup_docker.sh: no Docker engine answers and not root: cannot start one" >&2
    exit 1
  fi
  # setsid: the daemon outlives this script and the shell that ran it.
  setsid dockerd >"$log" 2>&1 </dev/null &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  if ! docker info >/dev/null 2>&1; then
    echo "setup_docker.sh: dockerd did not answer within 60 s (log: $log)" >&2
    tail -20 "$log" >&2 || true
    exit 1
  fi
fi

if ! docker image inspect "$image" >/dev/null 2>&1; then
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  mkdir -p "$root/bin" "$root/tmp"
  cp /bin/busybox "$root/bin/"
  for c in sh sleep echo cat ls true dd rm; do ln -s busybox "$root/bin/$c"; done
  tar -C "$root" -c . | docker import - "$image" >/dev/null
fi
echo "Docker engine ready: $(docker version --format '{{.Server.Version}}'), image $image"
