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
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$venv/bin/python" -m pip install -q -e ".[dev,bench]"
    echo "$want" > "$stamp"
  fi
}

# mypy cannot follow setuptools' editable finder (the folders ledger/, projections/, sandbox/ and
# examples/ install as runledger, runledger.projections...): it checks a tree of links in that layout.
typecheck_tree() {
  local tree="$root/.build/typecheck/runledger"
  rm -rf "$root/.build/typecheck"
  mkdir -p "$tree"
  for entry in "$root"/ledger/*; do
    [ "$(basename "$entry")" = "__pycache__" ] || ln -s "$entry" "$tree/"
  done
  for package in projections sandbox examples; do
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
    if [ -x deploy/docker/ensure-docker.sh ] && [ -d tests/integration/sandbox ]; then
      bash deploy/docker/ensure-docker.sh
    fi
    "$venv/bin/ruff" check ledger projections sandbox examples tests bench
    typecheck_tree
    "$venv/bin/mypy"
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
