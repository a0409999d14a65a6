#!/usr/bin/env bash
# Installs a headless browser for the dashboard's browser test (Debian's `chromium`, driven by
# its command line: Playwright's own browser download does not work on these machines).
# Idempotent. Usage: scripts/setup_chromium.sh
set -euo pipefail

for name in chromium chromium-browser; do
  if command -v "$name" >/dev/null; then
    exit 0
  fi
done
if [ "$(id -u)" != 0 ]; then
  echo "setup_chromium.sh: chromium missing and not root: cannot install" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
command -v chromium >/dev/null
