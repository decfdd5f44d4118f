#!/usr/bin/env bash
# The two README commands: `deploy/dev.sh demo` and `deploy/dev.sh test`.
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
    "$venv/bin/python" -m pip install -q -e ".[dev]"
    echo "$want" > "$stamp"
  fi
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
    "$venv/bin/mypy"
    exec "$venv/bin/pytest" -q -p no:cacheprovider "$@"
    ;;
  *)
    echo "usage: deploy/dev.sh demo | test [pytest args]" >&2
    exit 2
    ;;
esac
