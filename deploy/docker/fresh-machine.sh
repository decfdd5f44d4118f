#!/usr/bin/env bash
# The path a new machine takes, walked on this one without touching what it holds: the offline Debian
# base built from scratch under a scratch tag, the sandbox image built on it into a scratch repository,
# and one re-run (a deterministic re-drive of a run the demo recorded) in a container of that image, on
# an embedded nats-server with its own data. Every scratch image, server and file is removed at the end.
# Prints each phase's time and a last line with all of them (also written to $RUNLEDGER_FRESH_REPORT when
# set); exits non-zero when any phase fails.
#
#   deploy/docker/fresh-machine.sh        (needs the checkout's .venv: deploy/dev.sh makes it; root for Docker)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="$(pwd)/.venv/bin"
[ -x "$bin/runledger" ] || { echo "fresh-machine: no .venv/bin/runledger: run deploy/dev.sh demo first" >&2; exit 1; }

scratch="runledger-scratch-$$"
base="$scratch/debian-python:bookworm"
export RUNLEDGER_SANDBOX_REPO="$scratch/sandbox"  # `sandbox build` and `rerun` use this repository's images
RUNLEDGER_HOME=$(mktemp -d /tmp/runledger-fresh.XXXXXX)  # its own server, keys and wheel cache
export RUNLEDGER_HOME

cleanup() {
    "$bin/runledger" down >/dev/null 2>&1 || true
    docker images --format '{{.Repository}}:{{.Tag}}' | grep "^$scratch/" | xargs -r docker rmi >/dev/null 2>&1 || true
    rm -rf "$RUNLEDGER_HOME"
}
trap cleanup EXIT

phase() { echo "fresh-machine: $*" >&2; }

bash deploy/docker/ensure-docker.sh

started=$SECONDS
phase "building the offline base from scratch as $base"
# debootstrap's own lines go to a log: its progress lines are shown, the log's end when it fails.
if ! bash sandbox/image_files/build-base.sh "$base" >"$RUNLEDGER_HOME/build-base.log" 2>&1; then
    tail -n 40 "$RUNLEDGER_HOME/build-base.log" >&2
    phase "building the base from scratch failed"
    exit 1
fi
grep '^build-base: ' "$RUNLEDGER_HOME/build-base.log" >&2 || true
base_s=$((SECONDS - started))
phase "base built in ${base_s}s"

started=$SECONDS
phase "building the sandbox image on it (wheels downloaded into an empty cache)"
image=$("$bin/runledger" sandbox build --base "$base" --no-extras | tail -n 1)
image_s=$((SECONDS - started))
phase "sandbox image $image built in ${image_s}s"

"$bin/runledger" demo >/dev/null
run=$("$bin/runledger" runs --json | "$bin/python" -c '
import json, sys
runs = [r for r in json.load(sys.stdin) if r["status"] == "completed"]
print(runs[0]["run_id"])')

started=$SECONDS
phase "re-driving run $run from step 2 in a sandbox of $image"
out=$("$bin/runledger" rerun "$run" --agent runledger.examples.refund_agent.agent:spec --mode redrive --at-step 2 --local)
rerun_s=$((SECONDS - started))
echo "$out" >&2
case "$out" in
    *"): completed"*) ;;
    *) phase "the re-run did not complete"; exit 1 ;;
esac
report="base from scratch ${base_s}s, sandbox image on it ${image_s}s, one re-run ${rerun_s}s"
phase "OK: $report"
if [ -n "${RUNLEDGER_FRESH_REPORT:-}" ]; then
    echo "$report" >"$RUNLEDGER_FRESH_REPORT"  # .ci/run puts it in its summary
fi
