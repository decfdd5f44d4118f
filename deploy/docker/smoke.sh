#!/usr/bin/env bash
# End-to-end check of the sandbox image pipeline on this machine:
# engine -> offline base -> Dockerfile build (no network) -> hardened run
# that imports pydantic (compiled pydantic_core) from host-downloaded wheels.
# Env: BASE (base tag), PYTHON (host python with pip, for `pip download`; default: the repo's .venv).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
IMAGE_FILES="$HERE/../../sandbox/image_files"   # the sandbox image's Dockerfile and base script
BASE=${BASE:-runledger/debian-python:bookworm}
IMAGE=${IMAGE:-runledger/sandbox-smoke:latest}
VENV_PYTHON="$HERE/../../.venv/bin/python"
[ -x "$VENV_PYTHON" ] || VENV_PYTHON=python3
PYTHON=${PYTHON:-$VENV_PYTHON}
export DOCKER_BUILDKIT=0   # no buildx plugin: use the legacy builder explicitly (a deprecation notice remains)

bash "$HERE/ensure-docker.sh"
bash "$IMAGE_FILES/build-base.sh" "$BASE"

CTX=$(mktemp -d /tmp/runledger-smoke.XXXXXX)
trap 'rm -rf "$CTX"' EXIT
cp "$IMAGE_FILES/Dockerfile" "$CTX/"
mkdir -p "$CTX/runtime/smoke_pkg"
echo 'MSG = "smoke_pkg ok"' >"$CTX/runtime/smoke_pkg/__init__.py"

# Wheels must match the image's python, not the host's: ask the image.
PYV=$(docker run --rm --network=none "$BASE" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
ARCH=$(uname -m)
# pip does not expand --platform to older manylinux tags: list the ones we accept.
"$PYTHON" -m pip download -q --only-binary=:all: --python-version "$PYV" \
    --platform "manylinux2014_$ARCH" --platform "manylinux_2_28_$ARCH" \
    -d "$CTX/runtime/wheels" 'pydantic>=2.7,<3'

start=$SECONDS
docker build --network=none --build-arg "BASE=$BASE" -t "$IMAGE" "$CTX" >&2
echo "smoke: built $IMAGE in $((SECONDS - start))s," \
     "$(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{ printf "%.0f MB", $1 / 1e6 }')"

docker run --rm --network=none --read-only --tmpfs /tmp:size=64m \
    --cap-drop=ALL --security-opt=no-new-privileges --ipc=none \
    --pids-limit=64 --memory=256m --cpus=1 --user=sandbox --init \
    "$IMAGE" python3 -c '
import os, sys, time
t = time.perf_counter()
import pydantic, pydantic_core
dt = time.perf_counter() - t
import smoke_pkg

class M(pydantic.BaseModel):
    n: int

assert M(n="3").n == 3
try:
    open("/x", "w")
    sys.exit("rootfs is writable")
except OSError:
    pass
assert os.getuid() == 10001, os.getuid()
print("python", sys.version.split()[0], "| pydantic", pydantic.VERSION,
      "| pydantic_core", pydantic_core.__version__, "| import %.0f ms" % (dt * 1e3),
      "|", smoke_pkg.MSG)
'
docker run --rm --network=none --read-only "$IMAGE"   # default CMD
echo "smoke: OK"
