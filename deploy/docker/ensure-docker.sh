#!/usr/bin/env bash
# Make a Docker engine answer on this machine. Idempotent: exits 0 at once if
# `docker info` already works. Needs root (apt-get, dockerd).
#
# Client/daemon versions (checked 2026-11 on Debian bookworm): Debian's
# docker.io is engine 20.10.24 (API 1.41) and also ships /usr/bin/docker 20.10.
# A newer CLI may shadow it (/usr/local/bin/docker 28.2.2, API 1.50); it
# negotiates down ("API version: 1.41 (downgraded from 1.50)") and works,
# including `docker build` (no buildx plugin -> falls back to the legacy
# builder; a deprecation notice is printed even with DOCKER_BUILDKIT=0).
# So no DOCKER_API_VERSION is needed. If a future client stops negotiating,
# the timeout branch says so and suggests the value to pin.
set -euo pipefail

LOG=${RUNLEDGER_DOCKERD_LOG:-/tmp/runledger-dockerd.log}
TIMEOUT=${RUNLEDGER_DOCKERD_TIMEOUT:-60}

docker info >/dev/null 2>&1 && exit 0

# Two CI steps may call this at once: one installs/starts, the other waits.
exec 9>/tmp/runledger-ensure-docker.lock
flock 9
docker info >/dev/null 2>&1 && exit 0

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    echo "ensure-docker: installing docker.io" >&2
    export DEBIAN_FRONTEND=noninteractive
    # Lock timeout: another step may be running apt (e.g. build-base installing debootstrap).
    apt-get -o DPkg::Lock::Timeout=300 update -q
    # apparmor: on AppArmor kernels dockerd needs apparmor_parser or containers fail to start.
    apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends docker.io apparmor cgroupfs-mount
fi

# A dockerd may already be starting (or started by systemd on install).
if ! pgrep -x dockerd >/dev/null; then
    if [ -d /run/systemd/system ] && systemctl start docker 2>/dev/null; then
        :
    else
        echo "ensure-docker: starting dockerd, log in $LOG" >&2
        # setsid+nohup: the daemon must outlive this script and the CI step's shell.
        # 9>&-: otherwise dockerd inherits the lock and blocks later callers forever.
        setsid nohup dockerd >>"$LOG" 2>&1 </dev/null 9>&- &
    fi
fi

deadline=$((SECONDS + TIMEOUT))
until docker info >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        # Daemon up but this client can't talk to it: say so instead of a vague timeout.
        if /usr/bin/docker info >/dev/null 2>&1; then
            echo "ensure-docker: dockerd answers /usr/bin/docker but not $(command -v docker);" \
                 "try DOCKER_API_VERSION=$(/usr/bin/docker version -f '{{.Server.APIVersion}}')" >&2
        else
            echo "ensure-docker: docker not ready after ${TIMEOUT}s; last dockerd log lines:" >&2
            tail -n 20 "$LOG" >&2 2>/dev/null || true
        fi
        exit 1
    fi
    sleep 1
done
echo "ensure-docker: $(docker version -f 'client {{.Client.Version}} (API {{.Client.APIVersion}}), server {{.Server.Version}} (API {{.Server.APIVersion}})')" >&2
