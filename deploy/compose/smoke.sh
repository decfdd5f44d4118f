#!/usr/bin/env bash
# End-to-end check of deploy/compose.yaml on this machine: build the images, start the
# 3-node cluster + projector + 2 workers, run the demo against the cluster, queue a re-run
# for the workers, check the projector saw everything, tear it all down.
# Needs docker-compose (Debian: apt-get install -y docker-compose).
set -euo pipefail
cd "$(dirname "$0")/../.."
rl=.venv/bin/runledger
compose=(docker-compose -p runledger -f deploy/compose.yaml)
bash deploy/compose/build-images.sh
mkdir -p /var/run/runledger-sbx
"${compose[@]}" up -d
trap '"${compose[@]}" down -v' EXIT
export RUNLEDGER_NATS_URL=nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224
RUNLEDGER_HOME=$(mktemp -d)
export RUNLEDGER_HOME
"$rl" demo | tail -1
"$rl" status | grep -A1 "stream LEDGER:"
run=$("$rl" runs | awk 'NR==3{print $1}')
"$rl" rerun "$run" --agent runledger.examples.refund_agent.agent:spec --mode redrive --at-step 1 --wait
sleep 3
"${compose[@]}" logs --tail 1 projector
