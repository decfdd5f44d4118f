#!/usr/bin/env bash
# End-to-end check of deploy/compose.yaml on this machine: build the images, start the
# 3-node cluster + projector + 2 workers, run the demo against the cluster, record a run of an
# agent from the checkout (smoke_agent.py) and queue a re-run of it for the containerised
# workers, check that the projector followed all of it, tear it all down.
#
# Every step is bounded (RUNLEDGER_SMOKE_TIMEOUT seconds, default 300; the image build 600):
# a step that fails or hangs ends the smoke with the step's name, the containers' states and
# their last log lines. Installs docker-compose (Debian's 1.29) and a Docker engine if missing.
# Needs the repo's .venv (deploy/dev.sh creates it). Uses the host ports 4222-4224 and the
# compose project `runledger`: one smoke at a time per engine.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
export PWD="$root"   # compose.yaml mounts ${PWD}: the checkout, at its own path
rl="$root/.venv/bin/runledger"
limit=${RUNLEDGER_SMOKE_TIMEOUT:-300}
compose=(docker-compose -p runledger -f deploy/compose.yaml)

diagnose() {
    echo "---- docker-compose ps" >&2
    timeout 60 "${compose[@]}" ps >&2 || true
    echo "---- last log lines of every service" >&2
    timeout 60 "${compose[@]}" logs --no-color --tail 25 >&2 || true
    echo "---- sandboxes" >&2
    timeout 30 docker ps -a --filter label=runledger.sandbox --format '{{.Names}} {{.Status}}' >&2 || true
}

# step SECONDS NAME COMMAND...: run COMMAND; when it fails or outlives SECONDS, diagnose and stop.
step() {
    local seconds=$1 name=$2 rc=0 started=$SECONDS
    shift 2
    echo "smoke: $name" >&2
    # through bash: a step may be a function of this script (exported)
    timeout --kill-after=10 "$seconds" bash -c '"$@"' _ "$@" || rc=$?
    if [ "$rc" -ne 0 ]; then
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            echo "smoke: FAILED: $name did not finish within ${seconds}s" >&2
        else
            echo "smoke: FAILED: $name (exit $rc)" >&2
        fi
        diagnose
        exit 1
    fi
    echo "smoke: $name: ok ($((SECONDS - started))s)" >&2
}

home=$(mktemp -d /tmp/runledger-compose-smoke.XXXXXX)
teardown() {
    timeout 180 "${compose[@]}" down -v --timeout 10 >/dev/null 2>&1 || echo "smoke: docker-compose down failed" >&2
    rm -rf "$home"
}

step "$limit" "install docker-compose" bash deploy/compose/ensure-compose.sh
step 600 "build the images" bash deploy/compose/build-images.sh
# One master key for this deployment: the host's commands and the containers open the same content.
RUNLEDGER_MASTER_KEY=$(python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())')
export RUNLEDGER_MASTER_KEY
# A smoke killed before its teardown leaves containers and volumes behind: start from nothing.
step "$limit" "remove leftovers" "${compose[@]}" down -v --timeout 10
mkdir -p /var/run/runledger-sbx
trap teardown EXIT
step "$limit" "docker-compose up" "${compose[@]}" up -d

export RUNLEDGER_NATS_URL=nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224
export RUNLEDGER_HOME="$home"
# The worker re-run's agent is the checkout's own (deploy/compose/smoke_agent.py), as a user's agent
# would be: imported from the working directory here, from the checkout mounted at the same path by
# the workers. (The demo's agent ships inside runledger: a containerised worker finds it in the app
# image, a path the host's engine cannot mount into a sandbox.)
agent=deploy.compose.smoke_agent:spec

# check PATTERN COMMAND...: run COMMAND, show its output, fail unless a line matches PATTERN.
check() {
    local pattern=$1 out
    shift
    out=$("$@") || return
    printf '%s\n' "$out" >&2
    grep -q -- "$pattern" <<<"$out"
}
export -f check

step "$limit" "demo on the cluster" check "demo runs verified" "$rl" demo
step "$limit" "3 replicas" check "^stream LEDGER:.*replicas 3" "$rl" status
run=smoke-$(date +%s)
step "$limit" "record a run of $agent" "$rl" run --agent "$agent" --input 1 --run-id "$run"
step "$limit" "re-run it on a worker" \
    check "^branch .*: completed" "$rl" rerun "$run" --agent "$agent" --mode redrive --at-step 1 --wait

# Workers that crashed restart (compose's restart policy) and the smoke still passes: say how often.
for id in $("${compose[@]}" ps -q worker-1 worker-2); do
    docker inspect -f 'smoke: {{.Name}} restarted {{.RestartCount}} times' "$id" >&2 || true
done

# The projector prints "position P, lag 0" every 5 s once it holds the stream up to P.
last=$("$rl" status | sed -n 's/^stream LEDGER:.*last seq \([0-9]*\).*/\1/p')
step "$limit" "projector at position $last" bash -c '
    until "${@:2}" logs --no-color --tail 3 projector | grep -q "position $1, lag 0"; do sleep 2; done' \
    _ "$last" "${compose[@]}"
step "$limit" "stop the projector" "${compose[@]}" stop projector
sql="SELECT count(*) AS n FROM runs WHERE parent_run_id = '$run' AND status = 'completed'"
step "$limit" "the projection holds the branch" check "^1$" "${compose[@]}" run --rm --no-deps -T projector \
    sql --db /var/lib/runledger/ledger.duckdb --no-sync --format csv "$sql"
echo "smoke: OK" >&2
