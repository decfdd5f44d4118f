#!/usr/bin/env bash
# Make `docker-compose` available on this machine. Idempotent: exits 0 at once if it runs.
# Needs root (apt-get).
#
# What installs offline (checked on Debian bookworm with only the Debian mirror reachable):
# Debian's `docker-compose` 1.29.2 (Python, talks to the engine through python3-docker); the
# compose v2 plugin (`docker compose`) is not packaged (no docker-compose-plugin or
# docker-compose-v2 in bookworm), so deploy/compose.yaml sticks to what 1.29 accepts: no
# top-level `name:` (pass `-p runledger`).
set -euo pipefail

docker-compose version >/dev/null 2>&1 && exit 0

echo "ensure-compose: installing Debian's docker-compose" >&2
export DEBIAN_FRONTEND=noninteractive
# Lock timeout: another CI step may be running apt (ensure-docker.sh, build-base.sh).
apt-get -o DPkg::Lock::Timeout=300 update -q
# No recommends: they would pull docker.io, which deploy/docker/ensure-docker.sh owns.
apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends docker-compose
echo "ensure-compose: docker-compose $(docker-compose version --short)" >&2
