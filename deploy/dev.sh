#!/usr/bin/env bash
# The README commands: `deploy/dev.sh demo`, `deploy/dev.sh test` and `deploy/dev.sh bench [part]`.
# Creates .venv on first use (and whenever pyproject.toml changes), so a fresh clone needs nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv="$root/.venv"
python=${PYTHON:-python3}

ensure_venv() {
  local stamp="$venv/.runledger-installed"
  local want
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
  fi
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    # pip's and the build backend's chatter goes to a log: the user sees one line, or the log's end on failure.
    local log="$venv/install.log" started=$SECONDS
    echo "dev.sh: installing runledger and its dependencies into .venv (first run: a minute or two; log: .venv/install.log)" >&2
    if ! { "$venv/bin/python" -m pip install -q --upgrade pip &&
           "$venv/bin/python" -m pip install -q -e ".[dev,bench]"; } >"$log" 2>&1; then
      tail -n 40 "$log" >&2
      echo "dev.sh: installing into .venv failed (the whole log: .venv/install.log)" >&2
      exit 1
    fi
    echo "$want" > "$stamp"
    echo "dev.sh: installed in $((SECONDS - started))s" >&2
  fi
}

# Everything slow the tests need is made here, before pytest and outside its per-test time limits, so a
# new machine (no Docker engine, no images) passes as a prepared one does: the Docker engine, then the
# sandbox image (its offline Debian base included: minutes on a new machine, seconds once built) with the
# LangGraph layer the LangGraph re-run tests use, the MCP layer the MCP re-run test uses, the OpenAI Agents
# SDK layer its counterfactual test uses, and the Pydantic AI layer its re-run test uses. The tests' fixtures
# only check that the images exist.
prepare_sandbox() {
  bash deploy/docker/ensure-docker.sh
  local started=$SECONDS
  echo "dev.sh: building the sandbox image for the tests (a new machine builds its Debian base first: about 2-4 minutes)" >&2
  "$venv/bin/runledger" sandbox build --extra mcp >/dev/null
  "$venv/bin/runledger" sandbox build --extra openai-agents >/dev/null
  "$venv/bin/runledger" sandbox build --extra pydantic-ai >/dev/null
  "$venv/bin/runledger" sandbox build --extra langgraph >/dev/null
  echo "dev.sh: sandbox image ready in $((SECONDS - started))s" >&2
}

# The Go writer (clients/go) compiles nats.go and much of Go's standard library on a cold cache: minutes on
# a busy machine. Built once here when Go is installed, the test's own build (tests/integration/test_go_writer.py)
# is a cache hit. Without Go that test skips (and fails under CI=true, where .ci/run installs it).
prepare_go_writer() {
  command -v go >/dev/null || return 0
  local started=$SECONDS
  bash clients/go/build.sh || { echo "dev.sh: clients/go/build.sh failed: tests/integration/test_go_writer.py will fail" >&2; return 0; }
  echo "dev.sh: Go writer built in $((SECONDS - started))s" >&2
}

# mypy cannot follow setuptools' editable finder (the folders ledger/, projections/, sandbox/,
# integrations/, ui/ and examples/ install as runledger, runledger.projections...): it checks a tree of links in that layout.
typecheck_tree() {
  local tree="$root/.build/typecheck/runledger"
  rm -rf "$root/.build/typecheck"
  mkdir -p "$tree"
  for entry in "$root"/ledger/*; do
    [ "$(basename "$entry")" = "__pycache__" ] || ln -s "$entry" "$tree/"
  done
  for package in projections sandbox integrations ui examples; do
    ln -s "$root/$package" "$tree/$package"
  done
}

case "${1:-}" in
  demo)
    ensure_venv
    shift
    exec "$venv/bin/runledger" demo "$@"
    ;;
  test)
    ensure_venv
    shift
    "$venv/bin/ruff" check ledger projections sandbox integrations ui examples tests bench
    "$venv/bin/ruff" format --check ledger projections sandbox integrations ui examples tests bench
    typecheck_tree
    "$venv/bin/mypy"
    prepare_sandbox
    prepare_go_writer
    exec "$venv/bin/pytest" -q -p no:cacheprovider "$@"
    ;;
  bench)
    # The benchmark suite (bench/__main__.py): every part, or the parts named, into docs/benchmarks.md.
    ensure_venv
    shift
    if [ $# -eq 0 ]; then
      set -- all
    fi
    exec "$venv/bin/python" -m bench "$@"
    ;;
  *)
    echo "usage: deploy/dev.sh demo | test [pytest args] | bench [all | PART... ] [--quick]" >&2
    exit 2
    ;;
esac
