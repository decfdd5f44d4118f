#!/usr/bin/env bash
# Build an offline Debian+python3 base image with debootstrap, because no
# Docker registry is reachable from CI (nothing can be pulled).
# Usage: build-base.sh [IMAGE_TAG]   (idempotent: exits 0 if the tag exists)
# Mirror and suite come from the host's apt config so the script works behind
# whatever mirror/proxy the machine is set up with; override with
# RUNLEDGER_DEBIAN_MIRROR / RUNLEDGER_DEBIAN_SUITE.
set -euo pipefail

TAG=${1:-runledger/debian-python:bookworm}

if ! docker info >/dev/null 2>&1; then
    echo "build-base: no Docker engine answers; start one (in a checkout: deploy/docker/ensure-docker.sh)" >&2
    exit 1
fi
docker image inspect "$TAG" >/dev/null 2>&1 && exit 0

# Serialise concurrent builds of the same machine's base.
exec 9>/tmp/runledger-build-base.lock
flock 9
docker image inspect "$TAG" >/dev/null 2>&1 && exit 0

# First "deb" entry whose suite has no "-" (skips -updates/-security).
host_mirror() {
    cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v RS= '{
        t = u = s = ""; n = split($0, L, "\n")
        for (i = 1; i <= n; i++) {
            if (L[i] ~ /^Types:/) t = L[i]
            if (L[i] ~ /^URIs:/) u = L[i]
            if (L[i] ~ /^Suites:/) s = L[i]
        }
        if (t !~ /[ \t]deb([ \t]|$)/) next
        split(u, U, /[ \t]+/); m = split(s, S, /[ \t]+/)
        for (j = 2; j <= m; j++) if (S[j] !~ /-/) { print U[2], S[j]; exit }
    }' || true
    sed -E 's/\[[^]]*\]//' /etc/apt/sources.list 2>/dev/null \
        | awk '$1 == "deb" && $3 !~ /-/ { print $2, $3; exit }' || true
}
read -r MIRROR SUITE < <(host_mirror; echo) || true
MIRROR=${RUNLEDGER_DEBIAN_MIRROR:-$MIRROR}
SUITE=${RUNLEDGER_DEBIAN_SUITE:-$SUITE}
if [ -z "$MIRROR" ] || [ -z "$SUITE" ]; then
    echo "build-base: no Debian mirror found in /etc/apt; set RUNLEDGER_DEBIAN_MIRROR/SUITE" >&2
    exit 1
fi

if ! command -v debootstrap >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=300 update -q
    apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends debootstrap
fi

ROOT=$(mktemp -d /var/tmp/runledger-base.XXXXXX)
cleanup() {
    # debootstrap mounts proc/sys inside the target; a failed run can leave
    # them mounted, and rm -rf must never walk into the host's /proc or /sys.
    awk -v r="$ROOT/" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r | xargs -r umount -l
    rm -rf --one-file-system "$ROOT"
}
trap cleanup EXIT

start=$SECONDS
echo "build-base: debootstrap $SUITE from $MIRROR into $ROOT" >&2
debootstrap --variant=minbase --include=python3 "$SUITE" "$ROOT" "$MIRROR" >&2
echo "build-base: debootstrap took $((SECONDS - start))s" >&2

# Nothing in the sandbox needs apt metadata, docs or translations.
rm -rf "$ROOT"/var/cache/apt/* "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/log/* \
       "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* \
       "$ROOT"/usr/share/locale/* "$ROOT"/usr/share/i18n/* "$ROOT"/tmp/*

# --numeric-owner: keep the chroot's uids, not the host's name mapping.
# PATH/LANG: an imported image has no config at all.
tar -C "$ROOT" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . \
    | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python3"]' \
        - "$TAG" >/dev/null
echo "build-base: $TAG built in $((SECONDS - start))s," \
     "$(docker image inspect -f '{{.Size}}' "$TAG" | awk '{ printf "%.0f MB", $1 / 1e6 }')" >&2
